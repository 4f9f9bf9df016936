"""The worker's consumer loop: when it settles, renews, starts, receives, waits and stops.

:class:`Worker` assembles one worker process's parts and turns its loop, the one thread that
owns the adapter.  Each turn it settles what finished, renews the leases of everything held
every ``lease / 3``, starts buffered tasks as executor slots free up, receives up to the
prefetch budget, and waits for the executor's next report; a broker error reconnects with a
backoff, within ``--broker-timeout``.  What it does at each step is another module's:
what it holds and its leases, :mod:`ackwise.worker._ledger`; receiving and the budget,
:mod:`ackwise.worker._prefetch`; starting, :mod:`ackwise.worker._admission`; what finished,
:mod:`ackwise.worker._completions`; telling the broker, :mod:`ackwise.worker._settlement`
(what :func:`settle` decided); time limits, :mod:`ackwise.worker._timelimits`; stop requests
and start-up, :mod:`ackwise.worker._lifecycle`.  Deliveries become tasks in
:mod:`ackwise.worker._intake`, idempotency keys are claimed by :mod:`ackwise.worker._claims`,
the broker is reached through :mod:`ackwise.worker._connection` and limits are checked by
:mod:`ackwise.app._policy`.
"""

from __future__ import annotations

import logging
import os
import queue
import socket
import time
from collections.abc import Sequence
from typing import TYPE_CHECKING

from ackwise.app._policy import WorkerConfig
from ackwise.app._requirements import check_app
from ackwise.contract._backoff import Backoff
from ackwise.errors import (
    AdapterError,
    BrokerUnavailable,
    TransientAdapterError,
)
from ackwise.worker._admission import Admission
from ackwise.worker._announce import Announcer
from ackwise.worker._claims import Claims
from ackwise.worker._completions import Completions, Fatal
from ackwise.worker._connection import BrokerConnection
from ackwise.worker._events import BrokerError, Events, Listener, Reconnected
from ackwise.worker._executors import Completion, Executor
from ackwise.worker._holdings import WorkerCounters
from ackwise.worker._intake import Intake
from ackwise.worker._ledger import Ledger
from ackwise.worker._lifecycle import Control, log_ready, make_executor
from ackwise.worker._pacing import Pacer
from ackwise.worker._prefetch import Prefetch
from ackwise.worker._settlement import Settler, whole_batches
from ackwise.worker._tasklog import TaskLog
from ackwise.worker._timelimits import TimeLimits

if TYPE_CHECKING:
    from ackwise.app._app import App

__all__ = ["Worker", "WorkerConfig", "WorkerCounters"]

log = logging.getLogger("ackwise.worker")


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
        #: Messages per broker request (Capabilities.max_batch): receives and late-ack
        #: batches are sized in whole requests.
        batch = max(1, app.adapter_class.capabilities.max_batch or 1)
        self.adapter = app.adapter()
        self.counters = WorkerCounters()
        self.worker_id = f"{socket.gethostname()}:{os.getpid()}"
        self.events = Events(listeners, app.plugins)
        TaskLog(self.events, app.tasks)
        self.settler = Settler(
            self.adapter,
            self.events,
            self.counters,
            self.worker_id,
            batch=batch,
            push_window=app.adapter_class.capabilities.push_window,
        )
        self.claims = Claims(app, self.worker_id, self.config.lease)
        self.intake = Intake(app, self.config, self.settler)
        self.connection = BrokerConnection(
            app, self.adapter, self.config.queues, self.config.broker_timeout, self.events
        )
        # The executor's reports, and a stop request's wake-up: what the loop waits on.
        reports: queue.SimpleQueue[Completion] = queue.SimpleQueue()
        self.control = Control(reports, self.config)
        #: When the consumer loop last began a turn (monotonic; 0 before its first): what
        #: ``/healthz`` reads (:mod:`ackwise.worker._health`).
        self.last_turn = 0.0
        #: Waiting to reach the broker again after a transient error (the loop then turns
        #: at the pace of its backoff; ``--broker-timeout`` ends the wait).
        self.reconnecting = False
        #: Holds rate-limited tasks back until their slot (docs/rate-limits.md).
        self.pacer = Pacer(app)
        self.ledger = Ledger(
            self.adapter, self.settler, self.claims, self.events, self.counters, self.config.lease
        )
        self.prefetch = Prefetch(
            app,
            self.config,
            self.adapter,
            self.ledger,
            self.intake,
            self.events,
            reports,
            batch=batch,
            paced=self.pacer.active,
        )
        self.admission = Admission(
            app, self.ledger, self.settler, self.claims, self.pacer, self.events, self.counters
        )
        self.time_limits = TimeLimits(app)
        self.completions = Completions(
            reports,
            self.ledger,
            self.settler,
            self.claims,
            self.events,
            self.counters,
            adapt=self.prefetch.adapt,
            killed=self.time_limits.killed,
        )

    # -- control ---------------------------------------------------------------------------
    def request_stop(self, cold: bool = False) -> None:
        """Ask the loop to stop: graceful first, cold on a second call or with ``cold``.

        Safe to call from a signal handler.
        """
        self.control.request_stop(cold)

    def install_signal_handlers(self) -> None:
        """SIGTERM / SIGINT: graceful stop; a second one: cold stop."""
        self.control.install_signal_handlers()

    @property
    def stopping(self) -> bool:
        """Whether a stop was requested."""
        return self.control.requested > 0

    @property
    def stopped(self) -> bool:
        """Whether the worker's loop has ended."""
        return self.control.ended.is_set()

    def wait_ready(self, timeout: float | None = None) -> bool:
        """Wait until the worker consumes (connected, queues declared); False on timeout."""
        return self.control.ready.wait(timeout)

    @property
    def budget(self) -> int:
        """Messages held at most right now, running included (an automatic prefetch moves it)."""
        return self.prefetch.budget

    @property
    def running(self) -> int:
        """Tasks running now."""
        executor = self.ledger.executor
        waiting = executor.waiting() if executor is not None else 0
        return len(self.ledger.running) - waiting

    @property
    def held(self) -> int:
        """Deliveries held now: buffered plus running, finished but not settled yet (a broker
        error cut their settlement short), and asked for by a receive whose answer is not
        read yet."""
        return self.ledger.held

    # -- main loop -------------------------------------------------------------------------
    def run(self) -> int:
        """Run until stopped; return the process exit status (0 graceful, 1 cold or fatal).

        :raises BrokerUnavailable: the broker stayed unreachable for ``broker_timeout``.
        """
        cfg = self.config
        check_app(self.app)  # again: the app may have changed since the worker was made
        if not self.connection.open(self.control.asked, self.control.pause):
            log.info("worker %s stopped before the broker could be reached", self.worker_id)
            return 0
        if self.app.result_store_url is not None:
            # Results of tasks that store them; chords count their members there.
            self.settler.results = self.app.results()
        self.pacer.open()
        executor = make_executor(self.app, cfg, self.completions.reports, self.pacer)
        self.ledger.executor = executor
        self.prefetch.open(executor)
        executor.start()
        log_ready(self.worker_id, self.app, cfg)
        self.control.ready.set()
        announcer = Announcer(self.app, self.worker_id, cfg, self._snapshot)
        announcer.start()
        status = 0
        try:
            status = self._loop(executor)
        finally:
            self.control.ended.set()
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
            "stopping" if self.control.requested else "running",
            self.running,
            self.counters,
        )

    def _loop(self, executor: Executor) -> int:
        cfg = self.config
        control, ledger, prefetch = self.control, self.ledger, self.prefetch
        admission, completions, time_limits = self.admission, self.completions, self.time_limits
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
                if control.requested and grace_deadline is None:
                    grace_deadline = time.monotonic() + cfg.grace
                    prefetch.take_posted()  # what it brings goes back with the buffer
                    self.adapter.stop_receiving()
                    ledger.return_buffer()
                    ledger.return_waiting(executor)
                if control.requested == 2 or (
                    grace_deadline is not None and time.monotonic() >= grace_deadline
                ):
                    settler.flush()
                    return self._cold_stop(executor)
                # 2. settle what finished; the next receive asked for first when that frees
                # half the budget, so the broker looks while this thread settles
                if prefetch.can_post and ledger.posted is None and not control.requested:
                    prefetch.ask_ahead()
                completions.drain(block=0.0)
                now = time.monotonic()
                if grace_deadline is not None and not ledger.running:
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
                    ledger.renew()
                    next_renewal = now + renew_every
                # 4. start buffered tasks on free slots
                if ledger.buffer and not control.requested:
                    admission.start(executor)
                hard_deadline = float("inf")
                if time_limits.active and ledger.running:
                    hard_deadline = time_limits.enforce(ledger.running, executor)
                settler.flush_due(
                    now,
                    at_once=not ledger.running or bool(control.requested),
                    budget=prefetch.budget,
                )
                # 5. fetch more.  A receive asked for earlier is read once nothing else is
                # left to do: no finished task to settle, nothing buffered to start.
                received = 0
                asked = ledger.posted is not None
                if asked and not ledger.buffer and completions.reports.empty():
                    received = prefetch.take_posted()
                    if received and ledger.buffer:
                        admission.start(executor)
                # (an answer with nothing: ask again after the wait below, not at once)
                if not control.requested and not asked:
                    room = prefetch.budget - ledger.held
                    if room > 0 and (not ledger.buffer or room * 2 >= prefetch.budget):
                        idle = not ledger.running and not ledger.buffer
                        wait = (
                            min(cfg.poll, max(0.0, next_renewal - time.monotonic()))
                            if idle
                            else 0.0
                        )
                        settler.before_receive()
                        received += prefetch.receive(whole_batches(room, prefetch.batch), wait)
                        if received and ledger.buffer:
                            admission.start(executor)
                # 6. wait for something to happen (an idle receive has waited already; the
                # answer of one asked for is read next turn, or what finished meanwhile first)
                if ledger.posted is not None and not ledger.buffer:
                    completions.drain(block=0.0)
                elif not received and (ledger.running or ledger.buffer):
                    room = prefetch.budget - ledger.held
                    # While slots are busy but there is room, look for new messages often.
                    timeout = 0.02 if room > 0 and not control.requested else cfg.poll
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
                    completions.drain(block=timeout)
            except TransientAdapterError as exc:
                # The reconnect closes the connection of a receive asked for: its messages
                # come back when their leases run out, as after a crash.
                ledger.posted = None
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
            except Fatal as exc:
                log.error("worker cannot go on: %s", exc)
                settler.flush()
                self._cold_stop(executor)
                return 1

    # -- stopping --------------------------------------------------------------------------
    def _cold_stop(self, executor: Executor) -> int:
        log.warning("worker %s: cold stop with %d task(s) running", self.worker_id, self.running)
        self.ledger.return_waiting(executor)
        executor.shutdown(cold=True)
        self.ledger.abandon_running()
        self.ledger.return_buffer()
        self.settler.drop_unsettled()
        return 1
