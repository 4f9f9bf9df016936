"""Rate limits per task, shared by every worker of the broker (docs/rate-limits.md).

``@app.task(rate_limit="50/s")`` spaces the task's starts at least ``1/50`` s apart across all
workers.  The shared state is two numbers per task.  Its next free start time (the generic cell
rate algorithm, GCRA, without a burst): a worker about to start the task reserves the next free
slot in one atomic step of a :class:`RateLimiter` and hands the task to an executor when that
slot comes.  And its last start: the executor records it (:meth:`RateLimiter.start`) right
before it calls the task's function, and waits first when the last start was less than an
interval ago, so an executor that begins its job late (a thread the OS or the GIL held back)
does not bring two starts closer than the interval (:class:`StartGate`).  A slot reserved by a
worker that then dies stays unused: a limit is never exceeded, a crash can only leave a slot
idle.  The store is the broker's own where its adapter has one (memory, SQLite, Redis), else
``App(rate_limit_store=URL)``.
"""

from __future__ import annotations

import abc
import contextlib
import logging
import re
import time
from typing import ClassVar

from ackwise.contract._backoff import Backoff
from ackwise.contract._spi import BrokerURL
from ackwise.errors import ConfigurationError, TransientAdapterError

__all__ = [
    "RateLimiter",
    "StartGate",
    "first_margin",
    "next_slot",
    "parse_rate",
    "start_wait",
]

log = logging.getLogger(__name__)

#: Limiter classes already warned about (:meth:`RateLimiter.start`).
_WARNED: set[type] = set()

_UNITS = {"s": 1.0, "m": 60.0, "h": 3600.0}
_RATE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*/\s*([smh])\s*$")


def parse_rate(rate: str | None, where: str = "rate_limit") -> float | None:
    """The interval between two starts (seconds) of ``"N/s"``, ``"N/m"`` or ``"N/h"``."""
    if rate is None:
        return None
    match = _RATE.match(rate) if isinstance(rate, str) else None
    if match is None or float(match.group(1)) <= 0:
        raise ConfigurationError(
            f"{where} must be 'N/s', 'N/m' or 'N/h' with N > 0 (e.g. '100/m'), got {rate!r}"
        )
    return _UNITS[match.group(2)] / float(match.group(1))


class RateLimiter(abc.ABC):
    """Where rate-limited tasks reserve their start times (one per broker, shared)."""

    scheme: ClassVar[str] = "?"

    def __init__(self, url: BrokerURL) -> None:
        self.url = url

    @abc.abstractmethod
    def open(self) -> None:
        """Connect to the limiter (called once, before any other method)."""

    @abc.abstractmethod
    def close(self) -> None:
        """Release the limiter's connections; safe to call twice."""

    @abc.abstractmethod
    def reserve(self, key: str, interval: float) -> float:
        """Take the next free start of ``key`` (starts ``interval`` s apart) atomically; return
        how many seconds from now it is (0: start now)."""

    def start(self, key: str, interval: float, margin: float = 0.0) -> float:
        """Record a start of ``key``, unless the last one recorded is less than ``interval``
        s ago, in one atomic step; return 0.0 when recorded, else how many seconds until it
        may be (nothing recorded then).

        The start is recorded ``margin`` s after now: the latest moment the caller will begin
        it (it gives the start up if the answer reaches it later), so that the next start
        comes at least ``interval`` after the task really began.  A recorded start also moves
        the next free slot (:meth:`reserve`) to at least ``interval`` after it.

        Optional for a third-party limiter written before this method: the default records
        nothing and lets every start go, so its starts are spaced by the reservations alone
        (a start that begins late can come close to the next one), and says so once.
        """
        if type(self) not in _WARNED:
            _WARNED.add(type(self))
            log.warning(
                "rate limiter %s does not record starts (RateLimiter.start): its tasks' starts "
                "are spaced by their reserved slots only",
                type(self).__qualname__,
            )
        return 0.0

    @abc.abstractmethod
    def forget(self, key: str) -> None:
        """Delete what is kept for ``key`` (tests and the conformance suite clean up)."""


def next_slot(stored: float | None, now: float, interval: float) -> tuple[float, float]:
    """GCRA without burst: (seconds until the reserved start, the next free start after it)."""
    start = now if stored is None or stored < now else stored
    return start - now, start + interval


def start_wait(last: float | None, now: float, interval: float) -> float:
    """Seconds until a start may be recorded after the last one (0.0: now)."""
    return 0.0 if last is None or last + interval <= now else last + interval - now


#: The first margin a start is recorded with (:meth:`RateLimiter.start`), as a share of the
#: interval and at most MARGIN_CAP seconds: at most 5 % fewer starts than the limit while a
#: task is always waiting, and room for a store's usual answer time (a local Redis or SQLite
#: answers in well under a millisecond).
MARGIN_SHARE = 0.05
MARGIN_CAP = 0.05
#: The widest margin a start is asked with after its answers kept coming back too late.
MARGIN_MAX = 60.0


def first_margin(interval: float) -> float:
    """The margin a start of a task of ``interval`` is first recorded with."""
    return min(interval * MARGIN_SHARE, MARGIN_CAP)


class StartGate:
    """Hold the body of a rate-limited task until its start is recorded
    (:meth:`RateLimiter.start`): the last step before an executor calls the task's function.

    A worker hands a job to its executor when the job's reserved slot comes, but the thread or
    child that runs it may begin later (the OS or the GIL held it back) while the next slot's
    job begins on time: spaced by their slots only, the two would start together.  Recorded
    here, in the executor, a late start makes the next one wait an interval after it.

    The answer of the store can come back late too (a thread woken late from its wait for
    it).  So a start is recorded a margin ahead, and given up when the answer took longer than
    that to come: it is asked for again, with twice the margin (the margin that worked is
    where the next start of the task begins, halved).

    :param limiter: the app's rate limit store, open.
    :param lock: taken around each call of ``limiter`` when threads share it with others
        (a SQLite connection serves one transaction at a time).
    """

    def __init__(
        self, limiter: RateLimiter, lock: contextlib.AbstractContextManager[object] | None = None
    ) -> None:
        self.limiter = limiter
        self._lock = lock if lock is not None else contextlib.nullcontext()
        self._margins: dict[str, float] = {}  # task name -> the margin its last start had

    def __call__(self, key: str, interval: float) -> None:
        """Return once a start of ``key`` is recorded and its answer came in its margin.

        While the store cannot be reached the start waits, asking again with a growing
        delay: the function never begins unrecorded.  (A worker that stops meanwhile waits
        for it as for a running task, up to its grace period.)"""
        first = first_margin(interval)
        margin = max(first, self._margins.get(key, first))
        backoff = Backoff()
        while True:
            try:
                with self._lock:
                    asked = time.monotonic()
                    wait = self.limiter.start(key, interval, margin)
                    took = time.monotonic() - asked
            except TransientAdapterError as exc:
                wait = backoff.next()
                log.warning(
                    "cannot record a start of %s in the rate limit store %s (%s); asking again "
                    "in %.1fs",
                    key,
                    self.limiter.url,
                    exc,
                    wait,
                )
            else:
                if wait <= 0 and took <= margin:
                    self._margins[key] = margin / 2
                    return
                if wait <= 0:
                    # Begun now, it could come less than an interval before the next start,
                    # which counts from the recorded one.  Its slot stays idle.
                    log.debug(
                        "start of %s given up: the store answered in %.4fs, past its margin of "
                        "%.4fs; asking again with %.4fs",
                        key,
                        took,
                        margin,
                        min(margin * 2, MARGIN_MAX),
                    )
                    margin = min(margin * 2, MARGIN_MAX)
                    continue  # refused now: the answer says how long to wait
                # Not recorded: another start may take it first, and then this one waits again.
            time.sleep(wait)
