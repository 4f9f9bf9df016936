"""How much a worker holds, and receiving it: the prefetch budget, receives, receives asked ahead.

The budget is the configured prefetch, or the automatic one's value, which follows the recent
task duration (:meth:`Prefetch.adapt`, which also sizes what a thread pool takes beyond its
idle threads).  What a receive brings becomes tasks in :mod:`ackwise.worker._intake` and is
buffered in the :class:`~ackwise.worker._ledger.Ledger`; when to receive is the consumer
loop's (:mod:`ackwise.worker._loop`).
"""

from __future__ import annotations

import itertools
import math
import queue
import time
from collections.abc import Sequence
from typing import TYPE_CHECKING

from ackwise.app._policy import WorkerConfig, max_auto_prefetch
from ackwise.contract._spi import Adapter, Delivery, LeaseExtension
from ackwise.worker._events import Events, Fetched
from ackwise.worker._executors import Completion, Executor
from ackwise.worker._holdings import Posted
from ackwise.worker._intake import Intake
from ackwise.worker._ledger import Ledger
from ackwise.worker._settlement import whole_batches

if TYPE_CHECKING:
    from ackwise.app._app import App

__all__ = ["PREFETCH_HOLD", "RUN_AHEAD_HOLD", "RUN_AHEAD_MAX", "Prefetch"]

#: Automatic prefetch buffers about this many seconds of work beyond the running tasks (at the
#: recent average task duration), never less than 4 x concurrency: short tasks get a window
#: deep enough to hide the broker's round trip; long ones hold no more than the base budget.
PREFETCH_HOLD = 0.01
#: A thread pool takes about this many seconds of work (at the recent average task duration)
#: beyond its idle threads, at most RUN_AHEAD_MAX jobs: a thread that finishes a short task
#: starts the next at once instead of waiting for the consumer loop to hand it one.
RUN_AHEAD_HOLD = 0.005
RUN_AHEAD_MAX = 64


class Prefetch:
    """Receives for one worker into ``ledger``, within the budget.

    :param batch: messages per broker request (``Capabilities.max_batch``, else 1): receives
        are sized in whole requests.
    :param completions: the executor's reports not handled yet (their room is asked for
        ahead).
    :param paced: a rate limit spaces the starts of some task (no job waits in the executor).
    """

    def __init__(
        self,
        app: App,
        config: WorkerConfig,
        adapter: Adapter,
        ledger: Ledger,
        intake: Intake,
        events: Events,
        completions: queue.SimpleQueue[Completion],
        *,
        batch: int,
        paced: bool,
    ) -> None:
        self.config = config
        self.adapter = adapter
        self.ledger = ledger
        self.intake = intake
        self.events = events
        self.completions = completions
        self.batch = batch
        #: Messages held at once now: the configured prefetch, or the automatic one's value.
        self.budget = config.prefetch
        self.avg_duration = 1.0  # seconds; a start that assumes long tasks (the base budget)
        #: The adapter answers a receive later (Adapter.receive_later); cleared when it
        #: says it cannot.
        self.can_post = type(adapter).receive_later is not Adapter.receive_later
        #: The last receive brought all it asked for: more is likely waiting.
        self.more_waiting = False
        self.queue_cycle = itertools.cycle(config.queues)
        #: Leases run out at a time (not held by the connection): counted from the receive.
        self.timed_leases = (
            app.adapter_class.capabilities.lease_extension is not LeaseExtension.CONNECTION
        )
        #: Jobs may wait in a thread pool for a slot (Admission.may_wait): their lease must
        #: stay theirs there, renewed or held by the connection; and no rate limit spaces
        #: their starts.
        self.may_run_ahead = (
            app.adapter_class.capabilities.lease_extension is not LeaseExtension.NONE and not paced
        )
        #: The thread pool whose run-ahead :meth:`adapt` sizes (set at start-up, where jobs
        #: may wait in it).
        self.run_ahead: Executor | None = None

    def open(self, executor: Executor) -> None:
        """The worker started ``executor``: jobs wait in it where they may."""
        if self.may_run_ahead and executor.can_queue:
            self.run_ahead = executor

    def adapt(self, duration: float) -> None:
        """Follow the recent pace: the automatic prefetch buffers about PREFETCH_HOLD seconds
        of work; a thread pool takes about RUN_AHEAD_HOLD seconds beyond its idle threads."""
        avg = self.avg_duration = 0.9 * self.avg_duration + 0.1 * max(duration, 1e-6)
        c = self.config.concurrency
        if self.config.prefetch_auto:
            want = c + math.ceil(c * PREFETCH_HOLD / avg)
            self.budget = min(max(4 * c, want), max_auto_prefetch(c))
        executor = self.run_ahead
        if executor is not None:
            executor.ahead = min(RUN_AHEAD_MAX, int(c * RUN_AHEAD_HOLD / avg))

    def receive(self, room: int, wait: float) -> int:
        """Receive up to ``room`` messages, the queues in turn, waiting ``wait`` at most in
        all; how many came."""
        cfg = self.config
        total = 0
        per_queue_wait = wait / max(1, len(cfg.queues))
        for _ in range(len(cfg.queues)):
            q = next(self.queue_cycle)
            # The broker's lease began after this: counted from here it cannot end later.
            lease_until = time.monotonic() + cfg.lease if self.timed_leases else math.inf
            deliveries = self.adapter.receive(
                q, max_messages=room - total, wait=per_queue_wait, lease=cfg.lease
            )
            self.accept(q, deliveries, lease_until)
            total += len(deliveries)
            if total >= room:
                break
        self.more_waiting = total >= room
        return total

    def ask_ahead(self) -> None:
        """While tasks run, nothing is buffered and the last receive brought all it asked for,
        ask the next queue for the room that the finished ones (settled or about to be)
        leave, once that is half the budget; the answer is read later
        (:meth:`Adapter.receive_later`).  A queue that ran dry is asked as before: at the
        pace of the loop's waits, not once per finished task."""
        ledger = self.ledger
        if ledger.buffer or not ledger.running or not self.more_waiting:
            return
        room = self.budget - ledger.held + self.completions.qsize()
        if room * 2 < self.budget:
            return
        room = whole_batches(room, self.batch)
        q = next(self.queue_cycle)
        lease_until = time.monotonic() + self.config.lease if self.timed_leases else math.inf
        answer = self.adapter.receive_later(q, max_messages=room, lease=self.config.lease)
        if answer is None:
            self.can_post = False
            return
        ledger.posted = Posted(answer, q, room, lease_until)

    def take_posted(self) -> int:
        """Read the answer of the receive asked for earlier, if any; how many it brought."""
        ledger = self.ledger
        posted, ledger.posted = ledger.posted, None
        if posted is None:
            return 0
        deliveries = posted.answer()
        self.accept(posted.queue, deliveries, posted.lease_until)
        self.more_waiting = len(deliveries) >= posted.asked
        return len(deliveries)

    def accept(self, q: str, deliveries: Sequence[Delivery], lease_until: float) -> None:
        """Buffer what a receive brought (the intake settles what cannot run here)."""
        if deliveries and Fetched in self.events.heard:
            self.events.emit(Fetched(q, [d.attempt for d in deliveries]))
        buffer = self.ledger.buffer
        for d in deliveries:
            held = self.intake.accept(d)
            if held is not None:
                held.lease_until = lease_until
                buffer.append(held)
