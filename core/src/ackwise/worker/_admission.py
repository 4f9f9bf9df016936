"""Starting what a worker holds: buffered deliveries handed to the executor as slots free up.

A buffered delivery starts only while its lease runs, once its rate-limit slot came
(:mod:`ackwise.worker._pacing`) and with its idempotency key claimed
(:mod:`ackwise.worker._claims`); what :func:`settle` says to ack as it starts is acked first
(at most once, :meth:`Settler.ack_starting`), and the start of a task that tracks it is
recorded.  When to start is the consumer loop's (:mod:`ackwise.worker._loop`).
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import TYPE_CHECKING

from ackwise.app._execution import Job
from ackwise.contract._semantics import Ack
from ackwise.errors import TransientAdapterError
from ackwise.stores._results import ResultState, TaskResult
from ackwise.worker._claims import Claims
from ackwise.worker._events import Events, Started
from ackwise.worker._executors import Executor
from ackwise.worker._holdings import Held, WorkerCounters
from ackwise.worker._ledger import Ledger
from ackwise.worker._pacing import Pacer
from ackwise.worker._settlement import Settler

if TYPE_CHECKING:
    from ackwise.app._app import App

__all__ = ["Admission"]


class Admission:
    """Moves deliveries of ``ledger`` from its buffer to the executor for a worker of ``app``."""

    def __init__(
        self,
        app: App,
        ledger: Ledger,
        settler: Settler,
        claims: Claims,
        pacer: Pacer,
        events: Events,
        counters: WorkerCounters,
    ) -> None:
        self.ledger = ledger
        self.settler = settler
        self.claims = claims
        self.pacer = pacer
        self.events = events
        self.counters = counters
        #: Some task records ``started`` (``track_started``): a write per start batch.
        self.tracks_started = any(t.track_started and t.store_results for t in app.tasks.values())

    def start(self, executor: Executor) -> None:
        """Hand buffered deliveries to ``executor``, as many as it has slots for."""
        free = executor.free_slots()
        if free <= 0:
            return
        ledger = self.ledger
        buffer = ledger.buffer
        # Beyond the idle slots, only jobs that may wait in the executor (:meth:`may_wait`).
        idle = free - executor.ahead
        batch: list[Held] = []
        waiting: list[Held] = []  # rate-limited, their slot not come yet: stay buffered
        claiming: Held | None = None
        pacer = self.pacer if self.pacer.active else None
        mono = time.monotonic()
        try:
            while buffer and len(batch) < free:
                if len(batch) >= idle and not self.may_wait(buffer[0]):
                    break
                claiming = buffer.popleft()
                if claiming.lease_until <= mono:
                    ledger.lease_ran_out(claiming)
                elif pacer is not None and not pacer.may_start(claiming, mono):
                    waiting.append(claiming)
                elif claiming.idem_key is not None or self.claims.admit(claiming, self.settler):
                    batch.append(claiming)
                claiming = None
            buffer.extendleft(reversed(waiting))
            waiting = []
            acked_ids, stale_ids = self.settler.ack_starting(batch)
        except TransientAdapterError:
            # Nothing of the batch has started.  Keep it for after the reconnect: an early ack
            # the broker did record then answers StaleReceipt (that message is not run), one
            # it did not record goes through, instead of waiting a lease to come back.
            back = [*waiting, *batch] if claiming is None else [*waiting, *batch, claiming]
            buffer.extendleft(reversed(back))
            raise
        now = time.time()
        if self.tracks_started:
            self._record_started([h for h in batch if id(h.delivery) not in stale_ids], now)
        running = ledger.running
        submitted = []
        for h in batch:
            if id(h.delivery) in stale_ids:
                self.claims.done(h, completed=False)  # not run here: its key is free again
                continue  # the lease moved on: another worker owns it now
            h.acked = id(h.delivery) in acked_ids
            h.started = now
            running[h.job_id] = h
            self.counters.started += 1
            d = h.delivery
            receipt = repr(d.receipt) if h.task.bind else ""
            executor.submit(Job(h.job_id, d.attempt, d.body, receipt))
            submitted.append(h)
        if idle > 0 and submitted:
            # A thread woken for these jobs waits for the GIL, which this thread would hold
            # until its next blocking call (the log lines below, ~70 µs at INFO; a broker
            # round trip): yield it until that thread took its job.
            executor.let_start(submitted[0].job_id)
        if Started in self.events.heard:
            # After the hand-over: a task's start does not wait for its log line.  Its
            # completion is handled on this thread, after this.
            for h in submitted:
                d, env = h.delivery, h.envelope  # positional: keywords cost ~0.15 µs a task
                due = env.eta or env.created_at
                self.events.emit(Started(h.task.name, d.message_id, d.queue, d.attempt, due))

    @staticmethod
    def may_wait(h: Held) -> bool:
        """Whether ``h`` may wait in the executor for a slot once handed to it: not when it
        is acked as it starts (at most once: a crash would lose it unrun) or records its
        start."""
        task = h.task
        return task.ack is not Ack.EARLY and not (task.track_started and task.store_results)

    def _record_started(self, batch: Sequence[Held], now: float) -> None:
        """Write ``started`` for the tasks that track it (``track_started``)."""
        assert self.settler.results is not None
        records = [
            TaskResult(
                id=h.delivery.message_id,
                state=ResultState.STARTED.value,
                task=h.task.name,
                attempt=h.delivery.attempt,
                at=now,
            )
            for h in batch
            if h.task.track_started and h.task.store_results
        ]
        if records:
            self.settler.results.put(records)
