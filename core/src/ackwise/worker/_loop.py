"""The worker: one consumer loop that owns the adapter, and an executor that runs tasks.

The consumer loop receives up to the prefetch budget, starts tasks as executor slots free up,
settles completions in batches, and renews the leases of everything it holds (running and
prefetched) every ``lease / 3``.  What to tell the broker is decided by :func:`settle` alone
and carried out by :class:`~ackwise.worker._settlement.Settler`; deliveries become tasks in
:mod:`ackwise.worker._intake`, idempotency keys are claimed by :mod:`ackwise.worker._claims`, the broker is
reached through :mod:`ackwise.worker._connection` and limits are checked by :mod:`ackwise.app._policy`.
"""

from __future__ import annotations

import collections
import itertools
import logging
import math
import os
import queue
import signal
import socket
import threading
import time
from collections.abc import Sequence
from typing import TYPE_CHECKING

from ackwise.app._execution import FAILED, Job, Result
from ackwise.app._policy import WorkerConfig, max_auto_prefetch
from ackwise.app._requirements import check_app
from ackwise.contract._backoff import Backoff
from ackwise.contract._semantics import Ack, Outcome
from ackwise.contract._spi import Adapter, Delivery, LeaseExtension
from ackwise.errors import (
    AdapterError,
    BrokerUnavailable,
    StaleReceipt,
    TransientAdapterError,
)
from ackwise.stores._results import ResultState, TaskResult
from ackwise.worker._announce import Announcer
from ackwise.worker._claims import Claims
from ackwise.worker._connection import BrokerConnection
from ackwise.worker._events import (
    BrokerError,
    Events,
    Failed,
    Fetched,
    Interrupted,
    LeasesRenewed,
    Listener,
    Reconnected,
    Stale,
    Started,
    Succeeded,
)
from ackwise.worker._executors import Completion, Executor, PreforkExecutor, ThreadExecutor
from ackwise.worker._holdings import Held, Posted, WorkerCounters
from ackwise.worker._intake import Intake
from ackwise.worker._pacing import Pacer
from ackwise.worker._settlement import Settler, whole_batches
from ackwise.worker._tasklog import TaskLog

if TYPE_CHECKING:
    from ackwise.app._app import App

__all__ = ["Worker", "WorkerConfig", "WorkerCounters"]

log = logging.getLogger("ackwise.worker")

#: Automatic prefetch buffers about this many seconds of work beyond the running tasks (at the
#: recent average task duration), never less than 4 x concurrency: short tasks get a window
#: deep enough to hide the broker's round trip; long ones hold no more than the base budget.
PREFETCH_HOLD = 0.01
#: A thread pool takes about this many seconds of work (at the recent average task duration)
#: beyond its idle threads, at most RUN_AHEAD_MAX jobs: a thread that finishes a short task
#: starts the next at once instead of waiting for the consumer loop to hand it one.
RUN_AHEAD_HOLD = 0.005
RUN_AHEAD_MAX = 64


class Worker:
    """One worker process's consumer loop.

    :param app: the application whose tasks run here.
    :param config: see :class:`WorkerConfig`.
    :param listeners: called on the consumer thread as ``listener(event, info)`` for
        ``started``, ``succeeded``, ``failed``, ``retried``, ``dead_lettered``, ``lost``,
        ``returned``, ``stale`` and ``skipped`` (used by :mod:`ackwise.testing`; the events
        are those of :mod:`ackwise.worker._events`).
    """

    def __init__(
        self,
        app: App,
        config: WorkerConfig | None = None,
        *,
        listeners: Sequence[Listener] = (),
    ) -> None:
        self.app = app
        self.config = config or WorkerConfig(pool="threads")
        # The producer's check (made with the app, its tasks, and at its first send): a worker
        # refuses exactly what a producer of the same app would have refused.
        check_app(app)
        self.config.validate(app, app.adapter_class)
        #: Messages held at once now: the configured prefetch, or the automatic one's value.
        self._budget = self.config.prefetch
        #: Messages per broker request (Capabilities.max_batch): receives and late-ack
        #: batches are sized in whole requests.
        self._batch = max(1, app.adapter_class.capabilities.max_batch or 1)
        self._avg_duration = 1.0  # seconds; a start that assumes long tasks (the base budget)
        self.adapter: Adapter = app.adapter()
        self.counters = WorkerCounters()
        self.worker_id = f"{socket.gethostname()}:{os.getpid()}"
        self.events = Events(listeners, app.plugins)
        TaskLog(self.events, app.tasks)
        self.settler = Settler(
            self.adapter,
            self.events,
            self.counters,
            self.worker_id,
            batch=self._batch,
            push_window=app.adapter_class.capabilities.push_window,
        )
        self.claims = Claims(app, self.worker_id, self.config.lease)
        self.intake = Intake(app, self.config, self.settler)
        self.connection = BrokerConnection(
            app, self.adapter, self.config.queues, self.config.broker_timeout, self.events
        )
        self._completions: queue.SimpleQueue[Completion] = queue.SimpleQueue()
        self._buffer: collections.deque[Held] = collections.deque()
        #: A receive whose answer is read later (Adapter.receive_later), and its lease's end.
        self._posted: Posted | None = None
        self._can_post = type(self.adapter).receive_later is not Adapter.receive_later
        #: The last receive brought all it asked for: more is likely waiting.
        self._more_waiting = False
        self._running: dict[int, Held] = {}
        self._stop_requested = 0  # 1: graceful, 2: cold
        self._stopped = threading.Event()
        #: When the consumer loop last began a turn (monotonic; 0 before its first): what
        #: ``/healthz`` reads (:mod:`ackwise.worker._health`).
        self.last_turn = 0.0
        #: Waiting to reach the broker again after a transient error (the loop then turns
        #: at the pace of its backoff; ``--broker-timeout`` ends the wait).
        self.reconnecting = False
        self._ready = threading.Event()
        self._executor: Executor | None = None
        self._kill_reason: dict[int, str] = {}
        self._hard_limits = any(t.time_limit is not None for t in app.tasks.values())
        #: Some task records ``started`` (``track_started``): a write per start batch.
        self._tracks_started = any(t.track_started and t.store_results for t in app.tasks.values())
        self._queue_cycle = itertools.cycle(self.config.queues)
        #: Holds rate-limited tasks back until their slot (docs/rate-limits.md).
        self.pacer = Pacer(app)
        #: Leases run out at a time (not held by the connection): a delivery whose lease ran
        #: out before it could start is not started (:meth:`_lease_ran_out`).
        self._timed_leases = (
            app.adapter_class.capabilities.lease_extension is not LeaseExtension.CONNECTION
        )
        #: Jobs may wait in a thread pool for a slot (:meth:`_may_wait`): their lease must
        #: stay theirs there, renewed or held by the connection; and no rate limit spaces
        #: their starts.
        self._run_ahead = (
            app.adapter_class.capabilities.lease_extension is not LeaseExtension.NONE
            and not self.pacer.active
        )

    # -- control ---------------------------------------------------------------------------
    def request_stop(self, cold: bool = False) -> None:
        """Ask the loop to stop: graceful first, cold on a second call or with ``cold``.

        Safe to call from a signal handler.
        """
        self._stop_requested = 2 if cold or self._stop_requested else 1
        self._completions.put(("wake", 0, None))

    def install_signal_handlers(self) -> None:
        """SIGTERM / SIGINT: graceful stop; a second one: cold stop."""

        def handler(signum: int, frame: object) -> None:
            cold = self._stop_requested > 0
            log.warning(
                "%s received: %s",
                signal.Signals(signum).name,
                "cold stop"
                if cold
                else f"graceful stop (grace {self.config.grace:.0f}s; again for a cold stop)",
            )
            self.request_stop(cold=cold)

        signal.signal(signal.SIGTERM, handler)
        signal.signal(signal.SIGINT, handler)

    @property
    def stopping(self) -> bool:
        """Whether a stop was requested."""
        return self._stop_requested > 0

    @property
    def stopped(self) -> bool:
        """Whether the worker's loop has ended."""
        return self._stopped.is_set()

    def wait_ready(self, timeout: float | None = None) -> bool:
        """Wait until the worker consumes (connected, queues declared); False on timeout."""
        return self._ready.wait(timeout)

    @property
    def budget(self) -> int:
        """Messages held at most right now, running included (an automatic prefetch moves it)."""
        return self._budget

    @property
    def running(self) -> int:
        """Tasks running now."""
        waiting = self._executor.waiting() if self._executor is not None else 0
        return len(self._running) - waiting

    @property
    def held(self) -> int:
        """Deliveries held now: buffered plus running, finished but not settled yet (a broker
        error cut their settlement short), and asked for by a receive whose answer is not
        read yet."""
        posted = self._posted.asked if self._posted is not None else 0
        unsettled = len(self.settler.unsettled)  # finished, their settlement cut short
        return len(self._buffer) + len(self._running) + posted + unsettled

    # -- main loop -------------------------------------------------------------------------
    def run(self) -> int:
        """Run until stopped; return the process exit status (0 graceful, 1 cold or fatal).

        :raises BrokerUnavailable: the broker stayed unreachable for ``broker_timeout``.
        """
        cfg = self.config
        check_app(self.app)  # again: the app may have changed since the worker was made
        if not self.connection.open(lambda: bool(self._stop_requested), self._pause):
            log.info("worker %s stopped before the broker could be reached", self.worker_id)
            return 0
        if self.app.result_store_url is not None:
            # Results of tasks that store them; chords count their members there.
            self.settler.results = self.app.results()
        self.pacer.open()
        if cfg.pool == "prefork":
            assert cfg.app_path is not None
            executor: Executor = PreforkExecutor(cfg.app_path, cfg.concurrency, self._completions)
        else:
            gate = self.pacer.gate() if self.pacer.active else None
            executor = ThreadExecutor(self.app, cfg.concurrency, self._completions, gate)
        self._executor = executor
        executor.start()
        log.info(
            "worker %s ready: broker %s, queues %s, pool %s x%d, prefetch %s, lease %.1fs",
            self.worker_id,
            self.app.broker,
            ",".join(cfg.queues),
            cfg.pool,
            cfg.concurrency,
            f"auto ({cfg.prefetch} to {max_auto_prefetch(cfg.concurrency)})"
            if cfg.prefetch_auto
            else cfg.prefetch,
            cfg.lease,
        )
        self._ready.set()
        announcer = Announcer(self.app, self.worker_id, cfg, self._snapshot)
        announcer.start()
        status = 0
        try:
            status = self._loop(executor)
        finally:
            self._stopped.set()
            announcer.stop()
            self.claims.close()
            self.pacer.close()
            try:
                self.adapter.close()
            except AdapterError:  # pragma: no cover - closing a broken connection
                log.debug("closing the adapter failed", exc_info=True)
        return status

    def _snapshot(self) -> tuple[str, int, WorkerCounters]:
        """For the worker registry: state, tasks running now, counters."""
        return (
            "stopping" if self._stop_requested else "running",
            self.running,
            self.counters,
        )

    def _pause(self, seconds: float) -> None:
        """Sleep ``seconds``, or less if a stop is requested (its wake-up ends the wait)."""
        try:
            self._completions.get(timeout=seconds)
        except queue.Empty:
            pass

    def _loop(self, executor: Executor) -> int:
        cfg = self.config
        renew_every = cfg.lease / 3.0
        next_renewal = time.monotonic() + renew_every
        grace_deadline: float | None = None
        backoff = Backoff()
        reconnect_in = 0.0
        # Successes' late acks wait in the settler to share broker calls (see flush_due).
        settler = self.settler
        failing_since = 0.0
        while True:
            self.last_turn = time.monotonic()
            try:
                if reconnect_in:
                    self.connection.reopen(reconnect_in)
                    reconnect_in = 0.0
                    # What a broker error left unsettled goes first (a retry's publish).  The
                    # broker is back only once it went through: a call that fails again on a
                    # connection that opens is tried again with the backoff, within the
                    # --broker-timeout, not at once and for ever.
                    settler.flush()
                    self.reconnecting = False
                    backoff.reset()
                    self.events.emit(Reconnected(time.monotonic() - failing_since))
                    failing_since = 0.0
                # 1. stopping?
                if self._stop_requested and grace_deadline is None:
                    grace_deadline = time.monotonic() + cfg.grace
                    self._take_posted()  # what it brings goes back with the buffer
                    self.adapter.stop_receiving()
                    self._return_buffer()
                    self._return_waiting(executor)
                if self._stop_requested == 2 or (
                    grace_deadline is not None and time.monotonic() >= grace_deadline
                ):
                    settler.flush()
                    return self._cold_stop(executor)
                # 2. settle what finished; the next receive asked for first when that frees
                # half the budget, so the broker looks while this thread settles
                if self._can_post and self._posted is None and not self._stop_requested:
                    self._ask_ahead()
                self._drain_completions(block=0.0)
                now = time.monotonic()
                if grace_deadline is not None and not self._running:
                    settler.flush()
                    executor.shutdown(cold=False)
                    log.info("worker %s stopped gracefully", self.worker_id)
                    return 0
                # 3. renew leases of everything held
                if now >= next_renewal:
                    if now - next_renewal > renew_every:
                        log.warning(
                            "worker %s: leases renewed %.1fs late (lease %.1fs): the loop was "
                            "blocked, and a delivery whose lease ran out may run elsewhere",
                            self.worker_id,
                            now - next_renewal,
                            cfg.lease,
                        )
                    self._renew()
                    next_renewal = now + renew_every
                # 4. start buffered tasks on free slots
                if self._buffer and not self._stop_requested:
                    self._start(executor)
                hard_deadline = float("inf")
                if self._hard_limits and self._running:
                    hard_deadline = self._enforce_time_limits(executor)
                settler.flush_due(
                    now,
                    at_once=not self._running or bool(self._stop_requested),
                    budget=self._budget,
                )
                # 5. fetch more.  A receive asked for earlier is read once nothing else is
                # left to do: no finished task to settle, nothing buffered to start.
                received = 0
                asked = self._posted is not None
                if asked and not self._buffer and self._completions.empty():
                    received = self._take_posted()
                    if received and self._buffer:
                        self._start(executor)
                # (an answer with nothing: ask again after the wait below, not at once)
                if not self._stop_requested and not asked:
                    room = self._budget - self.held
                    if room > 0 and (not self._buffer or room * 2 >= self._budget):
                        idle = not self._running and not self._buffer
                        wait = (
                            min(cfg.poll, max(0.0, next_renewal - time.monotonic()))
                            if idle
                            else 0.0
                        )
                        settler.before_receive()
                        received += self._receive(whole_batches(room, self._batch), wait)
                        if received and self._buffer:
                            self._start(executor)
                # 6. wait for something to happen (an idle receive has waited already; the
                # answer of one asked for is read next turn, or what finished meanwhile first)
                if self._posted is not None and not self._buffer:
                    self._drain_completions(block=0.0)
                elif not received and (self._running or self._buffer):
                    room = self._budget - self.held
                    # While slots are busy but there is room, look for new messages often.
                    timeout = 0.02 if room > 0 and not self._stop_requested else cfg.poll
                    deadlines = [next_renewal]
                    if grace_deadline is not None:
                        deadlines.append(grace_deadline)
                    if settler.pending:
                        deadlines.append(settler.due)
                    paced = self.pacer.next_due() if self.pacer.active else None
                    if paced is not None:
                        deadlines.append(paced)
                    if hard_deadline != float("inf"):
                        deadlines.append(time.monotonic() + hard_deadline - time.time())
                    timeout = min(timeout, max(0.0, min(deadlines) - time.monotonic()))
                    self._drain_completions(block=timeout)
            except TransientAdapterError as exc:
                # The reconnect closes the connection of a receive asked for: its messages
                # come back when their leases run out, as after a crash.
                self._posted = None
                failing_since = failing_since or time.monotonic()
                self.events.emit(BrokerError(str(exc), transient=True))
                if time.monotonic() - failing_since > cfg.broker_timeout:
                    log.error(
                        "broker %s unreachable for %.0fs (last error: %s); giving up",
                        self.app.broker,
                        cfg.broker_timeout,
                        exc,
                    )
                    self._cold_stop(executor)
                    raise BrokerUnavailable(
                        f"broker {self.app.broker} unreachable for {cfg.broker_timeout:.0f}s "
                        f"(--broker-timeout); last error: {exc}"
                    ) from exc
                reconnect_in = backoff.next()
                self.reconnecting = True
                log.warning("broker error (%s); reconnecting in %.1fs", exc, reconnect_in)
            except AdapterError as exc:
                # Permanent (bad credentials, a missing queue…): retrying cannot help.
                self.events.emit(BrokerError(str(exc), transient=False))
                log.error("broker error that retrying cannot fix: %s", exc)
                self._cold_stop(executor)
                raise
            except _Fatal as exc:
                log.error("worker cannot go on: %s", exc)
                settler.flush()
                self._cold_stop(executor)
                return 1

    def _enforce_time_limits(self, executor: Executor) -> float:
        """Kill executors past their task's hard time limit; return the next deadline (wall)."""
        now = time.time()
        next_deadline = float("inf")
        for job_id, h in self._running.items():
            limit = h.task.time_limit
            if limit is None or job_id in self._kill_reason:
                continue
            deadline = h.started + limit
            if now >= deadline:
                if isinstance(executor, PreforkExecutor) and executor.kill_job(job_id):
                    self._kill_reason[job_id] = "time_limit"
                    log.warning(
                        "task %s message %s exceeded its time_limit of %.1fs: executor killed",
                        h.task.name,
                        h.delivery.message_id,
                        limit,
                    )
            else:
                next_deadline = min(next_deadline, deadline)
        return next_deadline

    # -- receiving and starting ------------------------------------------------------------
    def _receive(self, room: int, wait: float) -> int:
        cfg = self.config
        total = 0
        per_queue_wait = wait / max(1, len(cfg.queues))
        for _ in range(len(cfg.queues)):
            q = next(self._queue_cycle)
            # The broker's lease began after this: counted from here it cannot end later.
            lease_until = time.monotonic() + cfg.lease if self._timed_leases else math.inf
            deliveries = self.adapter.receive(
                q, max_messages=room - total, wait=per_queue_wait, lease=cfg.lease
            )
            self._accept(q, deliveries, lease_until)
            total += len(deliveries)
            if total >= room:
                break
        self._more_waiting = total >= room
        return total

    def _ask_ahead(self) -> None:
        """While tasks run, nothing is buffered and the last receive brought all it asked for,
        ask the next queue for the room that the finished ones (settled or about to be)
        leave, once that is half the budget; the answer is read later
        (:meth:`Adapter.receive_later`).  A queue that ran dry is asked as before: at the
        pace of the loop's waits, not once per finished task."""
        if self._buffer or not self._running or not self._more_waiting:
            return
        room = self._budget - self.held + self._completions.qsize()
        if room * 2 < self._budget:
            return
        room = whole_batches(room, self._batch)
        q = next(self._queue_cycle)
        lease_until = time.monotonic() + self.config.lease if self._timed_leases else math.inf
        answer = self.adapter.receive_later(q, max_messages=room, lease=self.config.lease)
        if answer is None:
            self._can_post = False
            return
        self._posted = Posted(answer, q, room, lease_until)

    def _take_posted(self) -> int:
        """Read the answer of the receive asked for earlier, if any; how many it brought."""
        posted, self._posted = self._posted, None
        if posted is None:
            return 0
        deliveries = posted.answer()
        self._accept(posted.queue, deliveries, posted.lease_until)
        self._more_waiting = len(deliveries) >= posted.asked
        return len(deliveries)

    def _accept(self, q: str, deliveries: Sequence[Delivery], lease_until: float) -> None:
        """Buffer what a receive brought (the intake settles what cannot run here)."""
        if deliveries and Fetched in self.events.heard:
            self.events.emit(Fetched(q, [d.attempt for d in deliveries]))
        for d in deliveries:
            held = self.intake.accept(d)
            if held is not None:
                held.lease_until = lease_until
                self._buffer.append(held)

    def _start(self, executor: Executor) -> None:
        free = executor.free_slots()
        if free <= 0:
            return
        # Beyond the idle slots, only jobs that may wait in the executor (:meth:`_may_wait`).
        idle = free - executor.ahead
        batch: list[Held] = []
        waiting: list[Held] = []  # rate-limited, their slot not come yet: stay buffered
        claiming: Held | None = None
        pacer = self.pacer if self.pacer.active else None
        mono = time.monotonic()
        try:
            while self._buffer and len(batch) < free:
                if len(batch) >= idle and not self._may_wait(self._buffer[0]):
                    break
                claiming = self._buffer.popleft()
                if claiming.lease_until <= mono:
                    self._lease_ran_out(claiming)
                elif pacer is not None and not pacer.may_start(claiming, mono):
                    waiting.append(claiming)
                elif claiming.idem_key is not None or self.claims.admit(claiming, self.settler):
                    batch.append(claiming)
                claiming = None
            self._buffer.extendleft(reversed(waiting))
            waiting = []
            acked_ids, stale_ids = self.settler.ack_starting(batch)
        except TransientAdapterError:
            # Nothing of the batch has started.  Keep it for after the reconnect: an early ack
            # the broker did record then answers StaleReceipt (that message is not run), one
            # it did not record goes through, instead of waiting a lease to come back.
            back = [*waiting, *batch] if claiming is None else [*waiting, *batch, claiming]
            self._buffer.extendleft(reversed(back))
            raise
        now = time.time()
        if self._tracks_started:
            self._record_started([h for h in batch if id(h.delivery) not in stale_ids], now)
        submitted = []
        for h in batch:
            if id(h.delivery) in stale_ids:
                self.claims.done(h, completed=False)  # not run here: its key is free again
                continue  # the lease moved on: another worker owns it now
            h.acked = id(h.delivery) in acked_ids
            h.started = now
            self._running[h.job_id] = h
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
    def _may_wait(h: Held) -> bool:
        """Whether ``h`` may wait in the executor for a slot once handed to it: not when it
        is acked as it starts (at most once: a crash would lose it unrun) or records its
        start."""
        task = h.task
        return task.ack is not Ack.EARLY and not (task.track_started and task.store_results)

    def _return_waiting(self, executor: Executor) -> None:
        """Graceful stop: take back the jobs waiting in the executor and return them."""
        for job_id in executor.withdraw(list(self._running)):
            h = self._running.pop(job_id)
            self.claims.done(h, completed=False)
            self.settler.settle_held(h, Outcome.NOT_STARTED, label="not_started")

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

    def _lease_ran_out(self, h: Held) -> None:
        """Not started: its lease ran out while it waited (a receive that answered late, a
        blocked loop).  The broker may have given it to another worker already; running it
        here too would be a second execution nobody asked for.  Nothing is sent: the broker
        gives it again."""
        h.lease_lost = True
        self.claims.done(h, completed=False)
        d = h.delivery
        self.counters.stale += 1
        self.events.emit(Stale(h.task.name, d.message_id, d.queue, d.attempt, operation="start"))

    def _return_buffer(self) -> None:
        """Graceful stop: give every prefetched, unstarted message back at once."""
        while self._buffer:
            self.settler.settle_held(
                self._buffer.popleft(), Outcome.NOT_STARTED, label="not_started"
            )

    # -- completions -----------------------------------------------------------------------
    def _adapt(self, duration: float) -> None:
        """Follow the recent pace: the automatic prefetch buffers about PREFETCH_HOLD seconds
        of work; a thread pool takes about RUN_AHEAD_HOLD seconds beyond its idle threads."""
        avg = self._avg_duration = 0.9 * self._avg_duration + 0.1 * max(duration, 1e-6)
        c = self.config.concurrency
        if self.config.prefetch_auto:
            want = c + math.ceil(c * PREFETCH_HOLD / avg)
            self._budget = min(max(4 * c, want), max_auto_prefetch(c))
        executor = self._executor
        if self._run_ahead and executor is not None and executor.can_queue:
            executor.ahead = min(RUN_AHEAD_MAX, int(c * RUN_AHEAD_HOLD / avg))

    def _drain_completions(self, block: float) -> None:
        try:
            item = (
                self._completions.get(timeout=block)
                if block > 0
                else self._completions.get_nowait()
            )
        except queue.Empty:
            return
        while True:
            kind, job_id, payload = item
            if kind == "done":
                self._finished(job_id, payload)
            elif kind == "lost":
                self._executor_lost(job_id, payload)
            elif kind == "fatal":
                raise _Fatal(payload)
            try:
                item = self._completions.get_nowait()
            except queue.Empty:
                return

    def _finished(self, job_id: int, result: Result) -> None:
        h = self._running.get(job_id)
        if h is None:  # pragma: no cover - a job the loop no longer tracks
            return
        task, d = h.task, h.delivery
        if result.status == FAILED:
            self.counters.failed += 1
            self.counters.finished(d.queue, failed=True)
            self.events.emit(
                Failed(
                    task.name,
                    d.message_id,
                    d.queue,
                    d.attempt,
                    error=result.error,
                    duration=result.duration,
                )
            )
            self.claims.done(h, completed=False)
            try:
                # Held until settled: an early-acked message is at the broker again only
                # once its retry is published.
                # keep: a broker error keeps what is left of it for after the reconnect (a
                # retry is published then, not dropped).
                self.settler.settle_held(
                    h,
                    Outcome.FAILED,
                    label="failed",
                    result=result,
                    retry_delay=result.retry_delay,
                    keep=True,
                )
            finally:
                del self._running[job_id]
            return
        del self._running[job_id]
        self.claims.done(h, completed=True)
        self.counters.succeeded += 1
        self.counters.finished(d.queue, failed=False)
        self._adapt(result.duration)
        if Succeeded in self.events.heard:
            self.events.emit(
                Succeeded(task.name, d.message_id, d.queue, d.attempt, result.duration)
            )
        self.settler.settle_held(h, Outcome.SUCCEEDED, label="succeeded", result=result, keep=True)

    def _executor_lost(self, job_id: int, reason: str) -> None:
        reason = self._kill_reason.pop(job_id, reason)
        h = self._running.get(job_id)
        if h is None:  # pragma: no cover
            return
        self.claims.done(h, completed=False)  # its holder is dead: the next delivery may run
        d = h.delivery
        self.events.emit(Interrupted(h.task.name, d.message_id, d.queue, d.attempt, reason=reason))
        try:
            self.settler.settle_held(
                h, Outcome.EXECUTOR_LOST, label=reason, reason=reason, keep=True
            )
        finally:
            del self._running[job_id]

    def _renew(self) -> None:
        self.claims.extend(self._running.values())
        held = [h.delivery for h in self._buffer if not h.lease_lost]
        held += [h.delivery for h in self._running.values() if not (h.lease_lost or h.acked)]
        if not held or self.adapter.capabilities.lease_extension is not LeaseExtension.PER_MESSAGE:
            return
        lease_until = time.monotonic() + self.config.lease
        lost: set[int] = set()
        try:
            self.adapter.extend(held, lease=self.config.lease)
        except StaleReceipt as exc:
            self.events.emit(LeasesRenewed(len(held) - len(exc.deliveries), len(exc.deliveries)))
            lost = {id(d) for d in exc.deliveries}
            self.settler.report_stale(exc, "extend")
        else:
            self.events.emit(LeasesRenewed(len(held), 0))
        for h in [*self._buffer, *self._running.values()]:
            if id(h.delivery) in lost:
                h.lease_lost = True
            else:
                h.lease_until = lease_until
        if lost:
            # Buffered deliveries whose lease moved on belong to another worker now, and so
            # do those still waiting in the executor: they are not started here.
            self._buffer = collections.deque(h for h in self._buffer if not h.lease_lost)
            if self._executor is not None:
                lost_jobs = [i for i, h in self._running.items() if h.lease_lost]
                for job_id in self._executor.withdraw(lost_jobs):
                    self.claims.done(self._running.pop(job_id), completed=False)
        self.counters.extended += len(held)

    # -- stopping --------------------------------------------------------------------------
    def _cold_stop(self, executor: Executor) -> int:
        log.warning("worker %s: cold stop with %d task(s) running", self.worker_id, self.running)
        self._return_waiting(executor)
        executor.shutdown(cold=True)
        for h in list(self._running.values()):
            d = h.delivery
            self.events.emit(
                Interrupted(h.task.name, d.message_id, d.queue, d.attempt, reason="abandoned")
            )
            self.settler.settle_held(h, Outcome.ABANDONED, label="abandoned")
        self._running.clear()
        self._return_buffer()
        self.settler.drop_unsettled()
        return 1


class _Fatal(Exception):
    pass
