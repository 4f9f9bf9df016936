"""Tell a delivery kept by a frozen client's broker-side lock from one that is simply lost.

A client can be frozen at any moment (SIGSTOP, a debugger, a paused VM, a long GC pause).
Once its lease ends, its deliveries must go to others: so no lock the broker holds for a
client (a row lock, an open transaction, an advisory lock) may outlive one round trip of it
(docs/conformance.md#a-frozen-client-holds-no-lock).  An adapter that breaks this passes every
other check -- its locks are released at the next call -- and shows only as a redelivery that
never comes while the client is frozen.

The suite does not know how a broker locks.  It asks the one question every broker answers:
when the frozen client's connection closes (the broker then ends its transactions and drops
its locks), does the delivery become receivable at once?  If so, a lock held for that client
kept it, and the failure says so in words (:func:`held_lock_reason`).  Level 1 asks it of an
idle consumer (``SPIBase.take_redelivery``), level 2 of a SIGSTOPped worker
(:func:`await_redelivery`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ackwise_conformance.helpers import eventually
from ackwise_conformance.verdicts import ScenarioFailed

if TYPE_CHECKING:
    from ackwise_conformance.harness import Harness
    from ackwise_conformance.processes import WorkerHandle

__all__ = ["RULE", "await_redelivery", "held_lock_reason"]

#: Where the rule is written down.
RULE = "docs/conformance.md#a-frozen-client-holds-no-lock"

#: How long (before the time scale) a delivery may take to come once the lock holder's
#: connection closed: its lease ended long before, so it is due at once.
AT_ONCE = 5.0


def held_lock_reason(what: str, holder: str, waited: float) -> str:
    """The failure, in words: ``what`` stayed out of reach for ``waited`` seconds after the
    lease of ``holder`` (an idle consumer, a frozen worker) ended, and came once its
    connection closed."""
    return (
        f"a broker-side lock outlived a round trip: {what} was not redelivered within "
        f"{waited:.1f}s while {holder} held it past its lease, and became receivable only "
        f"after {holder}'s connection closed: the adapter holds a broker-side lock (an open "
        "transaction or a row lock) across round trips, so a client frozen between two calls "
        "keeps its deliveries from every other consumer for as long as it is frozen; a frozen "
        f"client must hold no lock past one round trip ({RULE})"
    )


def await_redelivery(h: Harness, frozen: WorkerHandle, key: str, attempt: int) -> None:
    """Wait for delivery ``attempt`` of ``key`` to start on another worker while ``frozen``
    is stopped past its lease.

    When it does not start within the patience, the frozen worker is SIGKILLed: its
    connections close, and the broker ends whatever it held for them.  A delivery that starts
    at once after that was kept by a broker-side lock of the frozen worker, and the case fails
    saying so; otherwise the wait's own failure stands (the delivery is lost, or the broker
    slow).
    """
    try:
        h.wait_for("start", key=key, attempt=attempt)
        return
    except AssertionError as exc:
        if h.closed or not frozen.stopped():
            raise
        missed = exc
    # Counted before the kill: the delivery the lock kept may come back with any attempt (an
    # open transaction rolled back takes its delivery count with it).
    started = len(h.journal.records(ev="start", key=key))
    frozen.kill()
    try:
        eventually(
            lambda: len(h.journal.records(ev="start", key=key)) > started,
            h.t(AT_ONCE),
            description=f"{key} to start once the frozen worker's connection closed",
        )
    except AssertionError:
        raise missed from None
    raise ScenarioFailed(
        held_lock_reason(f"the delivery of {key}", f"frozen worker {frozen.index}", h.patience)
    )
