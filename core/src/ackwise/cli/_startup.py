"""SIGTERM and SIGINT while an ``ackwise`` command starts (docs/deployment.md).

A process manager may stop a service at any moment, also while it still imports ackwise or
its app.  So the command takes both signals first thing (:func:`hold`, called by
``ackwise.__main__`` before it imports anything heavy) and, until its arguments are read,
only records them.  Then
:func:`release` decides:

- a service (``worker``, ``beat``, ``relay``, ``dashboard``): a signal, recorded or new,
  ends its start-up at once (:class:`StopDuringStartUp`; exit status 0, as a stop later
  would) until the service installs its own handler, which stops it gracefully from then on;
- any other command: its former handlers come back and a recorded signal is delivered to
  them, as if it had come just then (Ctrl-C: ``ackwise: interrupted``, status 130).

Only the interpreter's own start, before the first line of ``ackwise.__main__``, is left to
the signals' defaults.
"""

from __future__ import annotations

import signal

TYPE_CHECKING = False
if TYPE_CHECKING:  # typing is not imported before the signals are taken
    from typing import Any

__all__ = ["StopDuringStartUp", "hold", "release", "restore"]

SIGNALS = (signal.SIGTERM, signal.SIGINT)


class StopDuringStartUp(BaseException):
    """SIGTERM or SIGINT came while a service was starting: nothing to stop gracefully yet.

    A :class:`BaseException`, like :class:`KeyboardInterrupt`, so that no ``except
    Exception`` of the start-up (an app's import, a connection's retry) swallows it.
    """

    def __init__(self, signum: int) -> None:
        super().__init__(signum)
        self.signum = signum

    @property
    def name(self) -> str:
        return signal.Signals(self.signum).name


#: The handlers from before :func:`hold`, of the signals it took.
_previous: dict[int, Any] = {}
#: Signals that came while held, first first.
_received: list[int] = []


def _record(signum: int, frame: object) -> None:
    _received.append(signum)


def _stop(signum: int, frame: object) -> None:
    raise StopDuringStartUp(signum)


def hold() -> None:
    """Record SIGTERM and SIGINT from now on instead of dying of them.

    A signal the process ignores (``SIG_IGN``, e.g. SIGINT of a background job) stays
    ignored.  Outside the main thread signals are the caller's business: nothing happens.
    """
    if _previous:
        return  # held already: by the entry point, then by the command line's main
    for sig in SIGNALS:
        current = signal.getsignal(sig)
        if current is signal.SIG_IGN:
            continue
        try:
            signal.signal(sig, _record)
        except ValueError:  # not the main thread
            return
        # None: a handler installed outside Python; the default is the best guess back.
        _previous[sig] = signal.SIG_DFL if current is None else current


def release(service: bool) -> None:
    """End the hold once the command is known: see the module's docstring.

    :raises StopDuringStartUp: a service was told to stop while held.
    """
    hold()  # a caller of ackwise.cli.main() did not hold: from now on, then
    if service:
        for sig in _previous:
            signal.signal(sig, _stop)
        if _received:
            raise StopDuringStartUp(_received[0])
    else:
        received = restore()
        if received is not None:
            signal.raise_signal(received)


def restore() -> int | None:
    """Give back the former handlers where a handler of this module is still installed;
    return the first signal recorded meanwhile, if any.

    A service that installed its own keeps it (a signal while it exits is a stop, not a
    death); one that failed or stopped while starting, and every other command, gets back
    what it had before :func:`hold`.
    """
    ours = (_record, _stop)
    for sig in _previous:  # first absorb: a signal between the two passes must not raise
        if signal.getsignal(sig) in ours:
            signal.signal(sig, _record)
    for sig, handler in _previous.items():
        if signal.getsignal(sig) is _record:
            signal.signal(sig, handler)
    received = _received[0] if _received else None
    _previous.clear()
    _received.clear()
    return received
