"""What a worker holds: its ledger of buffered, running and posted deliveries and their leases.

A delivery the worker holds is *buffered* (received, not started), *running* (handed to the
executor: running there, or waiting in it for a slot) or *posted* (asked for by a receive
whose answer is not read yet, :class:`~ackwise.worker._holdings.Posted`).  The ledger keeps
their leases: it renews them, marks a delivery whose lease ran out or moved on and withdraws
what must not start any more, and gives back what it holds when the worker stops.  When it
does any of this is the consumer loop's (:mod:`ackwise.worker._loop`).
"""

from __future__ import annotations

import collections
import time

from ackwise.contract._semantics import Outcome
from ackwise.contract._spi import Adapter, LeaseExtension
from ackwise.errors import StaleReceipt
from ackwise.worker._claims import Claims
from ackwise.worker._events import Events, Interrupted, LeasesRenewed, Stale
from ackwise.worker._executors import Executor
from ackwise.worker._holdings import Held, Posted, WorkerCounters
from ackwise.worker._settlement import Settler

__all__ = ["Ledger"]


class Ledger:
    """The deliveries one worker holds, under leases of ``lease`` seconds."""

    def __init__(
        self,
        adapter: Adapter,
        settler: Settler,
        claims: Claims,
        events: Events,
        counters: WorkerCounters,
        lease: float,
    ) -> None:
        self.adapter = adapter
        self.settler = settler
        self.claims = claims
        self.events = events
        self.counters = counters
        self.lease = lease
        #: Received, not started yet, oldest first.
        self.buffer: collections.deque[Held] = collections.deque()
        #: Handed to the executor, by job id: running there, or waiting in it for a slot.
        self.running: dict[int, Held] = {}
        #: A receive whose answer is read later (Adapter.receive_later), and its lease's end.
        self.posted: Posted | None = None
        #: Where the running ones run (set once the worker started it).
        self.executor: Executor | None = None

    @property
    def held(self) -> int:
        """Deliveries held now: buffered plus running, finished but not settled yet (a broker
        error cut their settlement short), and asked for by a receive whose answer is not
        read yet."""
        posted = self.posted.asked if self.posted is not None else 0
        unsettled = len(self.settler.unsettled)  # finished, their settlement cut short
        return len(self.buffer) + len(self.running) + posted + unsettled

    # -- leases ----------------------------------------------------------------------------
    def renew(self) -> None:
        """Renew the leases of everything held (and the idempotency claims of the running);
        what the broker says moved on is not started here."""
        self.claims.extend(self.running.values())
        held = [h.delivery for h in self.buffer if not h.lease_lost]
        held += [h.delivery for h in self.running.values() if not (h.lease_lost or h.acked)]
        if not held or self.adapter.capabilities.lease_extension is not LeaseExtension.PER_MESSAGE:
            return
        lease_until = time.monotonic() + self.lease
        lost: set[int] = set()
        try:
            self.adapter.extend(held, lease=self.lease)
        except StaleReceipt as exc:
            self.events.emit(LeasesRenewed(len(held) - len(exc.deliveries), len(exc.deliveries)))
            lost = {id(d) for d in exc.deliveries}
            self.settler.report_stale(exc, "extend")
        else:
            self.events.emit(LeasesRenewed(len(held), 0))
        for h in [*self.buffer, *self.running.values()]:
            if id(h.delivery) in lost:
                h.lease_lost = True
            else:
                h.lease_until = lease_until
        if lost:
            # Buffered deliveries whose lease moved on belong to another worker now, and so
            # do those still waiting in the executor: they are not started here.
            self.buffer = collections.deque(h for h in self.buffer if not h.lease_lost)
            if self.executor is not None:
                lost_jobs = [i for i, h in self.running.items() if h.lease_lost]
                for job_id in self.executor.withdraw(lost_jobs):
                    self.claims.done(self.running.pop(job_id), completed=False)
        self.counters.extended += len(held)

    def lease_ran_out(self, h: Held) -> None:
        """Not started: its lease ran out while it waited (a receive that answered late, a
        blocked loop).  The broker may have given it to another worker already; running it
        here too would be a second execution nobody asked for.  Nothing is sent: the broker
        gives it again."""
        h.lease_lost = True
        self.claims.done(h, completed=False)
        d = h.delivery
        self.counters.stale += 1
        self.events.emit(Stale(h.task.name, d.message_id, d.queue, d.attempt, operation="start"))

    # -- giving back on stop ---------------------------------------------------------------
    def return_buffer(self) -> None:
        """Stop: give every prefetched, unstarted message back at once."""
        while self.buffer:
            self.settler.settle_held(
                self.buffer.popleft(), Outcome.NOT_STARTED, label="not_started"
            )

    def return_waiting(self, executor: Executor) -> None:
        """Stop: take back the jobs waiting in ``executor`` and return them."""
        for job_id in executor.withdraw(list(self.running)):
            h = self.running.pop(job_id)
            self.claims.done(h, completed=False)
            self.settler.settle_held(h, Outcome.NOT_STARTED, label="not_started")

    def abandon_running(self) -> None:
        """Cold stop, the executor shut down: what ran is abandoned, as its task's mode says."""
        for h in list(self.running.values()):
            d = h.delivery
            self.events.emit(
                Interrupted(h.task.name, d.message_id, d.queue, d.attempt, reason="abandoned")
            )
            self.settler.settle_held(h, Outcome.ABANDONED, label="abandoned")
        self.running.clear()
