"""The records of what a worker holds and counts: a delivery held with its task, a receive asked
ahead, the worker's counters.  The ledger of them is :mod:`ackwise.worker._ledger`."""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from ackwise.contract import _envelope
from ackwise.contract._spi import Delivery

if TYPE_CHECKING:
    from ackwise.app._task import Task

__all__ = ["Held", "Posted", "WorkerCounters"]


@dataclass(slots=True)
class Held:
    """A delivery this worker holds: buffered or running."""

    delivery: Delivery
    task: Task[..., Any]
    envelope: _envelope.Envelope
    job_id: int
    started: float = 0.0
    lease_lost: bool = False
    #: ``time.monotonic()`` by which the lease has surely run out unless renewed: counted from
    #: before the receive (or the last renewal) that gave it; ``inf`` where the broker holds
    #: it while the connection lives.
    lease_until: float = math.inf
    #: Acked before it started (``Ack.EARLY``): the broker has forgotten it, so it has no
    #: lease to renew and its receipt settles nothing.
    acked: bool = False
    #: The idempotency key this execution holds in the store (``None``: no key).
    idem_key: str | None = None


@dataclass(slots=True)
class Posted:
    """A receive asked for and not read yet (:meth:`Adapter.receive_later`): the messages it
    may bring are held already, under leases that began when it was asked."""

    answer: Callable[[], Sequence[Delivery]]
    queue: str
    asked: int
    lease_until: float


@dataclass
class WorkerCounters:
    received: int = 0
    started: int = 0
    succeeded: int = 0
    failed: int = 0
    retried: int = 0
    dead_lettered: int = 0
    lost: int = 0
    returned: int = 0
    stale: int = 0
    extended: int = 0
    by_reason: dict[str, int] = field(default_factory=dict)
    #: ``[succeeded, failed]`` by queue (the worker registry's per-queue throughput).
    by_queue: dict[str, list[int]] = field(default_factory=dict)

    def finished(self, queue: str, failed: bool) -> None:
        per = self.by_queue.get(queue)
        if per is None:
            per = self.by_queue[queue] = [0, 0]
        per[failed] += 1
