"""The worker: one consumer loop that owns the adapter, and an executor that runs tasks.

The consumer loop (DESIGN §4) receives up to the prefetch budget, starts tasks as executor slots
free up, settles completions in batches, and renews the leases of everything it holds (running
and prefetched) every ``lease / 3``.  What to tell the broker is decided by :func:`settle` alone.
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
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import msgspec

from ackwise import _envelope
from ackwise._backoff import Backoff
from ackwise._execution import FAILED, Job, Result
from ackwise._executors import Completion, Executor, PreforkExecutor, ThreadExecutor
from ackwise._idempotency import IdempotencyStore, KeyState
from ackwise._plugins import open_store
from ackwise._semantics import (
    Ack,
    AckMessage,
    DeadLetterMessage,
    Hold,
    LostMessage,
    NackMessage,
    Outcome,
    RetryMessage,
    Settlement,
    settle,
)
from ackwise._spi import Adapter, Delivery, LeaseExtension, Outgoing, QueueSpec
from ackwise.errors import (
    AdapterError,
    BrokerUnavailable,
    ConfigurationError,
    EnvelopeError,
    StaleReceipt,
    TransientAdapterError,
    UnknownEnvelopeVersion,
)

if TYPE_CHECKING:
    from ackwise._app import App, Task

log = logging.getLogger(__name__)

POOLS = ("prefork", "threads", "solo")

#: Late acks of successful tasks are sent together: at most this many, or this many seconds old.
ACK_BATCH = 64
ACK_DELAY = 0.005
#: ... on a broker with a per-request limit (Capabilities.max_batch: SQS), where every request
#: is a round trip (and billed): acks wait longer to fill whole requests while tasks keep
#: finishing.  They still go at once when nothing runs.
ACK_DELAY_BATCHED = 0.05
#: Automatic prefetch buffers about this many seconds of work beyond the running tasks (at the
#: recent average task duration), never less than 4 x concurrency: short tasks get a window
#: deep enough to hide the broker's round trip; long ones hold no more than the base budget.
PREFETCH_HOLD = 0.01


def max_auto_prefetch(concurrency: int) -> int:
    """The most messages an automatic prefetch holds: 64, or 4 x concurrency if more."""
    return max(4 * concurrency, 64)


Listener = Callable[[str, dict[str, Any]], None]


@dataclass
class WorkerConfig:
    """Settings of one worker process; checked by :meth:`validate`."""

    queues: Sequence[str] = ()
    concurrency: int = 0  # 0: number of CPUs (prefork / threads), 1 for solo
    pool: str = "prefork"
    #: Messages held at once, running included.  0: 4 x concurrency; on an adapter with
    #: ``deep_prefetch`` (RabbitMQ) raised while tasks are short (see :data:`PREFETCH_HOLD`),
    #: up to :func:`max_auto_prefetch`.
    prefetch: int = 0
    prefetch_auto: bool = False  # set by validate() when prefetch was 0
    lease: float = 30.0
    grace: float = 30.0
    #: How long one idle receive may block (also bounds the reaction to a stop request).
    poll: float = 1.0
    app_path: str | None = None
    #: A message naming an unknown task is offered again after this delay (a rolling deploy
    #: may bring the task), up to ``unknown_task_deliveries`` deliveries, then dead-lettered.
    unknown_task_delay: float = 5.0
    unknown_task_deliveries: int = 3
    #: Give up (exit with an error) when the broker stays unreachable this long.
    broker_timeout: float = 60.0

    def validate(self, app: App, adapter_cls: type[Adapter]) -> None:
        if self.pool not in POOLS:
            raise ConfigurationError(f"--pool must be one of {', '.join(POOLS)}, got {self.pool!r}")
        if self.pool == "solo":
            if self.concurrency not in (0, 1):
                raise ConfigurationError("--pool solo runs one task at a time; drop -c")
            self.concurrency = 1
        if self.concurrency == 0:
            self.concurrency = os.cpu_count() or 1
        if self.concurrency < 1:
            raise ConfigurationError(f"concurrency must be >= 1, got {self.concurrency}")
        if self.prefetch == 0:
            self.prefetch = 4 * self.concurrency
            self.prefetch_auto = adapter_cls.deep_prefetch
        if self.prefetch < 1:
            raise ConfigurationError(f"--prefetch must be >= 1, got {self.prefetch}")
        if not self.lease > 0:
            raise ConfigurationError(f"--lease must be > 0 seconds, got {self.lease}")
        if self.grace < 0:
            raise ConfigurationError(f"--grace must be >= 0 seconds, got {self.grace}")
        caps = adapter_cls.capabilities
        if caps.max_lease is not None and self.lease > caps.max_lease:
            raise ConfigurationError(
                f"--lease {self.lease}s is longer than the broker allows ({caps.max_lease}s)"
            )
        if self.unknown_task_delay < 0 or self.unknown_task_deliveries < 1:
            raise ConfigurationError(
                "unknown_task_delay must be >= 0 and unknown_task_deliveries >= 1"
            )
        if not self.broker_timeout > 0:
            raise ConfigurationError(f"--broker-timeout must be > 0, got {self.broker_timeout}")
        keyed = sorted(t.name for t in app.tasks.values() if t.idempotency_key is not None)
        if keyed and app.idempotency_store_url is None:
            raise ConfigurationError(
                f"tasks {keyed} have an idempotency_key but broker {app.broker} has no "
                "idempotency store: set App(idempotency_store='sqlite:///…' or "
                "'postgresql://…')"
            )
        hard = sorted(t.name for t in app.tasks.values() if t.time_limit is not None)
        if hard and self.pool != "prefork":
            raise ConfigurationError(
                f"tasks {hard} have a hard time_limit, which only the prefork pool can enforce "
                f"(a thread cannot be killed); use --pool prefork, or give them only a "
                "soft_time_limit"
            )
        if caps.lease_extension is LeaseExtension.NONE:
            long = [
                t.name
                for t in app.tasks.values()
                if t.time_limit is None or t.time_limit > self.lease
            ]
            if long:
                raise ConfigurationError(
                    f"the broker cannot extend leases and tasks {long} may run longer than "
                    f"--lease {self.lease}s: give them a time_limit within the lease"
                )
        if self.pool == "prefork" and not self.app_path:
            raise ConfigurationError(
                "--pool prefork needs the app's import path ('module:app') to start children; "
                "use the threads pool for an App object without one"
            )
        if not caps.multi_process and self.pool == "prefork":
            # Children never touch the adapter, so this works; nothing to refuse.
            pass
        self.queues = list(self.queues) or app.queues()


@dataclass(slots=True)
class _Held:
    """A delivery this worker holds: buffered or running."""

    delivery: Delivery
    task: Task[..., Any]
    envelope: _envelope.Envelope
    job_id: int
    started: float = 0.0
    lease_lost: bool = False
    #: Acked before it started (``Ack.EARLY``): the broker has forgotten it, so it has no
    #: lease to renew and its receipt settles nothing.
    acked: bool = False
    #: The idempotency key this execution holds in the store (``None``: no key).
    idem_key: str | None = None


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


class Worker:
    """One worker process's consumer loop.

    :param app: the application whose tasks run here.
    :param config: see :class:`WorkerConfig`.
    :param listeners: called on the consumer thread as ``listener(event, info)`` for
        ``started``, ``succeeded``, ``failed``, ``retried``, ``dead_lettered``, ``lost``,
        ``returned`` and ``stale`` (used by :mod:`ackwise.testing`).
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
        self.config.validate(app, app.adapter_class)
        #: Messages held at once now: the configured prefetch, or the automatic one's value.
        self._budget = self.config.prefetch
        #: Messages per broker request (Capabilities.max_batch): receives and late-ack
        #: batches are sized in whole requests.
        self._batch = max(1, app.adapter_class.capabilities.max_batch or 1)
        self._ack_delay = ACK_DELAY if self._batch == 1 else ACK_DELAY_BATCHED
        self._avg_duration = 1.0  # seconds; a start that assumes long tasks (the base budget)
        self.adapter = app.adapter()
        self.listeners = list(listeners)
        self.counters = WorkerCounters()
        self.worker_id = f"{socket.gethostname()}:{os.getpid()}"
        self._completions: queue.SimpleQueue[Completion] = queue.SimpleQueue()
        self._buffer: collections.deque[_Held] = collections.deque()
        self._running: dict[int, _Held] = {}
        self._job_ids = itertools.count(1)
        self._stop_requested = 0  # 1: graceful, 2: cold
        self._stopped = threading.Event()
        self._ready = threading.Event()
        self._executor: Executor | None = None
        self._kill_reason: dict[int, str] = {}
        self._idem_store: IdempotencyStore | None = None
        self._idem_warned = False
        self._hard_limits = any(t.time_limit is not None for t in app.tasks.values())
        self._queue_cycle = itertools.cycle(self.config.queues)
        self._hooks = {
            name: app.plugins.emitter(f"ackwise_task_{name}")
            for name in ("started", "succeeded", "failed", "retried", "dead_lettered", "lost")
        }

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

    def wait_ready(self, timeout: float | None = None) -> bool:
        return self._ready.wait(timeout)

    @property
    def budget(self) -> int:
        """Messages held at most right now, running included (an automatic prefetch moves it)."""
        return self._budget

    @property
    def held(self) -> int:
        """Deliveries held now: buffered plus running."""
        return len(self._buffer) + len(self._running)

    # -- main loop -------------------------------------------------------------------------
    def run(self) -> int:
        """Run until stopped; return the process exit status (0 graceful, 1 cold or fatal).

        :raises BrokerUnavailable: the broker stayed unreachable for ``broker_timeout``.
        """
        cfg = self.config
        if not self._open_broker():
            log.info("worker %s stopped before the broker could be reached", self.worker_id)
            return 0
        if cfg.pool == "prefork":
            assert cfg.app_path is not None
            executor: Executor = PreforkExecutor(cfg.app_path, cfg.concurrency, self._completions)
        else:
            executor = ThreadExecutor(self.app, cfg.concurrency, self._completions)
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
        status = 0
        try:
            status = self._loop(executor)
        finally:
            self._stopped.set()
            if self._idem_store is not None:
                try:
                    self._idem_store.close()
                except AdapterError:  # pragma: no cover
                    log.debug("closing the idempotency store failed", exc_info=True)
            try:
                self.adapter.close()
            except AdapterError:  # pragma: no cover - closing a broken connection
                log.debug("closing the adapter failed", exc_info=True)
        return status

    def _open_broker(self) -> bool:
        """Connect and declare the queues, retrying while the broker is unreachable.

        A worker started with its broker (or a service in front of it) still coming up, or
        while another process holds a SQLite write lock, waits instead of exiting: under a
        process supervisor an exit at once is a crash loop.  Returns ``False`` when a stop was
        requested meanwhile; raises :class:`BrokerUnavailable` after ``broker_timeout``.
        Permanent errors (credentials, configuration) are raised at once.
        """
        cfg = self.config
        backoff = Backoff()
        started = time.monotonic()
        attempt = 0
        while not self._stop_requested:
            attempt += 1
            try:
                self.adapter.open()
                self._check_hold_limit()
                for q in cfg.queues:
                    self.adapter.declare(QueueSpec(q, max_deliveries=self._max_deliveries_for(q)))
            except TransientAdapterError as exc:
                self._close_quietly()
                waited = time.monotonic() - started
                left = cfg.broker_timeout - waited
                if left <= 0:
                    raise BrokerUnavailable(
                        f"broker {self.app.broker} unreachable at start for {waited:.0f}s "
                        f"({attempt} attempts, --broker-timeout {cfg.broker_timeout:.0f}s); "
                        f"last error: {exc}"
                    ) from exc
                delay = min(backoff.next(), left)
                log.warning(
                    "broker %s not reachable at start (attempt %d, %.0fs of --broker-timeout "
                    "%.0fs): %s; retrying in %.1fs",
                    self.app.broker,
                    attempt,
                    waited,
                    cfg.broker_timeout,
                    exc,
                    delay,
                )
                self._pause(delay)
                continue
            if attempt > 1:
                log.info(
                    "broker %s reachable after %d attempts (%.1fs)",
                    self.app.broker,
                    attempt,
                    time.monotonic() - started,
                )
            return True
        return False

    def _pause(self, seconds: float) -> None:
        """Sleep ``seconds``, or less if a stop is requested (its wake-up ends the wait)."""
        try:
            self._completions.get(timeout=seconds)
        except queue.Empty:
            pass

    def _close_quietly(self) -> None:
        try:
            self.adapter.close()
        except AdapterError:
            log.debug("closing the adapter failed", exc_info=True)

    def _check_hold_limit(self) -> None:
        """Refuse tasks that may run longer than the broker lets a delivery stay unsettled."""
        limit = self.adapter.max_hold()
        if limit is None:
            return
        queues = set(self.config.queues)
        tasks = [t for t in self.app.tasks.values() if t.queue in queues]
        long = sorted(t.name for t in tasks if t.time_limit is not None and t.time_limit > limit)
        if long:
            self._close_quietly()
            raise ConfigurationError(
                f"tasks {long} have a time_limit longer than the broker lets a delivery stay "
                f"unacknowledged ({limit:.0f}s, RabbitMQ's consumer_timeout): the broker would "
                "take the message back mid-run; lower the time_limit or raise the broker's "
                "consumer_timeout (and say it in the URL)"
            )
        unbounded = sorted(t.name for t in tasks if t.time_limit is None)
        if unbounded:
            log.info(
                "tasks %s have no time_limit; the broker takes a delivery back after %.0fs "
                "unacknowledged",
                unbounded,
                limit,
            )

    def _max_deliveries_for(self, queue_name: str) -> int:
        values = [t.max_deliveries for t in self.app.tasks.values() if t.queue == queue_name]
        return max(values, default=5)

    def _loop(self, executor: Executor) -> int:
        cfg = self.config
        renew_every = cfg.lease / 3.0
        next_renewal = time.monotonic() + renew_every
        grace_deadline: float | None = None
        backoff = Backoff()
        reconnect_in = 0.0
        acks: list[Delivery] = []
        # Successful late acks wait up to ACK_DELAY (or ACK_BATCH of them) to share one broker
        # call; a crash in that window redelivers them, which at-least-once allows.
        ack_due = 0.0
        failing_since = 0.0
        while True:
            try:
                if reconnect_in:
                    self._reconnect(reconnect_in)
                    reconnect_in = 0.0
                    backoff.reset()
                    failing_since = 0.0
                    if acks:
                        self._ack(acks)
                # 1. stopping?
                if self._stop_requested and grace_deadline is None:
                    grace_deadline = time.monotonic() + cfg.grace
                    self.adapter.stop_receiving()
                    self._return_buffer()
                if self._stop_requested == 2 or (
                    grace_deadline is not None and time.monotonic() >= grace_deadline
                ):
                    if acks:
                        self._ack(acks)
                    return self._cold_stop(executor)
                # 2. settle what finished
                had = len(acks)
                self._drain_completions(acks, block=0.0)
                now = time.monotonic()
                if acks and not had:
                    ack_due = now + self._ack_delay
                if grace_deadline is not None and not self._running:
                    if acks:
                        self._ack(acks)
                    executor.shutdown(cold=False)
                    log.info("worker %s stopped gracefully", self.worker_id)
                    return 0
                # 3. renew leases of everything held
                if now >= next_renewal:
                    self._renew()
                    next_renewal = now + renew_every
                # 4. start buffered tasks on free slots
                if self._buffer and not self._stop_requested:
                    self._start(executor)
                hard_deadline = float("inf")
                if self._hard_limits and self._running:
                    hard_deadline = self._enforce_time_limits(executor)
                # Unsent acks still hold their slots in a broker's window (RabbitMQ's
                # basic.qos): they go once they hold half the budget, so it never runs dry.
                if acks:
                    if now >= ack_due or not self._running or self._stop_requested:
                        self._ack(acks)
                    elif len(acks) >= self._ack_batch():
                        # Whole broker requests where one is full; the rest waits for more
                        # (or its delay).  A smaller budget's threshold sends them all.
                        self._ack(acks, keep=len(acks) - self._whole_batches(len(acks)))
                        if acks:
                            ack_due = now + self._ack_delay
                # 5. fetch more
                received = 0
                if not self._stop_requested:
                    room = self._budget - self.held
                    if room > 0 and (not self._buffer or room * 2 >= self._budget):
                        idle = not self._running and not self._buffer
                        wait = (
                            min(cfg.poll, max(0.0, next_renewal - time.monotonic()))
                            if idle
                            else 0.0
                        )
                        received = self._receive(self._whole_batches(room), wait)
                        if received and self._buffer:
                            self._start(executor)
                # 6. wait for something to happen (an idle receive has waited already)
                if not received and (self._running or self._buffer):
                    room = self._budget - self.held
                    # While slots are busy but there is room, look for new messages often.
                    timeout = 0.02 if room > 0 and not self._stop_requested else cfg.poll
                    deadlines = [next_renewal]
                    if grace_deadline is not None:
                        deadlines.append(grace_deadline)
                    if acks:
                        deadlines.append(ack_due)
                    if hard_deadline != float("inf"):
                        deadlines.append(time.monotonic() + hard_deadline - time.time())
                    timeout = min(timeout, max(0.0, min(deadlines) - time.monotonic()))
                    self._drain_completions(acks, block=timeout)
            except TransientAdapterError as exc:
                failing_since = failing_since or time.monotonic()
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
                log.warning("broker error (%s); reconnecting in %.1fs", exc, reconnect_in)
            except AdapterError as exc:
                # Permanent (bad credentials, a missing queue…): retrying cannot help.
                log.error("broker error that retrying cannot fix: %s", exc)
                self._cold_stop(executor)
                raise
            except _Fatal as exc:
                log.error("worker cannot go on: %s", exc)
                if acks:
                    self._ack(acks)
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

    def _whole_batches(self, n: int) -> int:
        """``n`` rounded down to whole broker requests (``n`` itself below one request)."""
        b = self._batch
        return n if n < b else n - n % b

    def _ack_batch(self) -> int:
        """How many successful late acks to send together (see ACK_BATCH, ACK_DELAY).

        Half the budget (unsent acks are messages that may still run again), in whole broker
        requests where the broker has a per-request limit and the budget holds two of them.
        """
        return self._whole_batches(max(1, min(ACK_BATCH, self._budget // 2)))

    def _reconnect(self, delay: float) -> None:
        time.sleep(delay)
        try:
            self.adapter.close()
        except AdapterError:
            pass
        self.adapter.open()

    # -- receiving and starting ------------------------------------------------------------
    def _receive(self, room: int, wait: float) -> int:
        cfg = self.config
        total = 0
        per_queue_wait = wait / max(1, len(cfg.queues))
        for _ in range(len(cfg.queues)):
            q = next(self._queue_cycle)
            deliveries = self.adapter.receive(
                q, max_messages=room - total, wait=per_queue_wait, lease=cfg.lease
            )
            for d in deliveries:
                self._accept(d)
            total += len(deliveries)
            if total >= room:
                break
        return total

    def _accept(self, d: Delivery) -> None:
        """Decode one delivery; buffer it, or settle it at once when it cannot run.

        Nothing one delivery holds may stop the worker: a record the adapter found malformed,
        a body that is not bytes, or any error while turning it into a task dead-letters that
        delivery (the body kept as it is) and the worker goes on.  Broker errors still reach
        the loop, which reconnects.
        """
        self.counters.received += 1
        try:
            self._classify(d)
        except AdapterError:
            raise
        except Exception as exc:
            log.error(
                "message %s on %s dead-lettered (decode_error): turning it into a task raised "
                "%s: %s",
                d.message_id,
                d.queue,
                type(exc).__name__,
                exc,
                exc_info=True,
            )
            self._reject(d, "decode_error", f"{type(exc).__name__}: {exc}", None, log_it=False)

    def _classify(self, d: Delivery) -> None:
        if d.corrupt is not None:
            self._reject(d, "corrupt_record", d.corrupt, None)
            return
        if not isinstance(d.body, bytes):
            detail = f"the adapter delivered a {type(d.body).__name__} body, not bytes"
            self._reject(d, "corrupt_record", detail, None)
            return
        try:
            env = _envelope.decode(d.body)
        except UnknownEnvelopeVersion as exc:
            self._reject(d, "unknown_envelope_version", str(exc), None)
            return
        except EnvelopeError as exc:
            self._reject(d, "decode_error", str(exc), None)
            return
        task = self.app.tasks.get(env.task)
        if task is None:
            cfg = self.config
            decision = settle(
                Ack.LATE,
                Outcome.UNKNOWN_TASK,
                attempt=d.attempt,
                max_deliveries=cfg.unknown_task_deliveries,
                retry_delay=cfg.unknown_task_delay,
            )
            detail = f"no task named {env.task!r} is registered in app {self.app.name!r}"
            if isinstance(decision, DeadLetterMessage):
                log.error(
                    "message %s on %s dead-lettered (unknown_task): %s after %d deliveries",
                    d.message_id,
                    d.queue,
                    detail,
                    d.attempt,
                )
                self._dead_letter(d, None, env, decision, detail, None)
            else:
                log.warning(
                    "message %s on %s: %s; offered again in %.1fs (delivery %d of %d)",
                    d.message_id,
                    d.queue,
                    detail,
                    cfg.unknown_task_delay,
                    d.attempt,
                    cfg.unknown_task_deliveries,
                )
                assert isinstance(decision, NackMessage)
                try:
                    self.adapter.nack(d, delay=decision.delay)
                except StaleReceipt as exc:
                    self._report_stale(exc, "nack")
                self._emit_raw("returned", d, env.task, reason="unknown_task", delay=decision.delay)
            return
        if d.attempt > task.max_deliveries:
            decision = settle(
                task.ack, Outcome.OVER_LIMIT, attempt=d.attempt, max_deliveries=task.max_deliveries
            )
            self._carry_out(decision, d, task, env, error=None, outcome="max_deliveries")
            return
        self._buffer.append(_Held(d, task, env, next(self._job_ids)))

    def _reject(
        self,
        d: Delivery,
        reason: str,
        detail: str,
        env: _envelope.Envelope | None,
        *,
        log_it: bool = True,
    ) -> None:
        if log_it:
            log.error(
                "message %s on %s dead-lettered (%s): %s", d.message_id, d.queue, reason, detail
            )
        decision = settle(
            Ack.LATE, Outcome.REJECTED, attempt=d.attempt, max_deliveries=1, reason=reason
        )
        assert isinstance(decision, DeadLetterMessage)
        self._dead_letter(d, None, env, decision, detail, None)

    def _start(self, executor: Executor) -> None:
        free = executor.free_slots()
        if free <= 0:
            return
        batch: list[_Held] = []
        claiming: _Held | None = None
        try:
            while self._buffer and len(batch) < free:
                claiming = self._buffer.popleft()
                if claiming.idem_key is not None or self._idempotency_allows(claiming):
                    batch.append(claiming)
                claiming = None
            stale_ids = self._ack_early(batch)
        except TransientAdapterError:
            # Nothing of the batch has started.  Keep it for after the reconnect: an early ack
            # the broker did record then answers StaleReceipt (that message is not run), one
            # it did not record goes through, instead of waiting a lease to come back.
            self._buffer.extendleft(reversed(batch if claiming is None else [*batch, claiming]))
            raise
        now = time.time()
        for h in batch:
            if id(h.delivery) in stale_ids:
                self._idem_done(h, completed=False)  # not run here: its key is free again
                continue  # the lease moved on: another worker owns it now
            h.acked = h.task.ack is Ack.EARLY
            h.started = now
            self._running[h.job_id] = h
            self.counters.started += 1
            self._emit("started", h, attempt=h.delivery.attempt)
            d = h.delivery
            receipt = repr(d.receipt) if h.task.bind else ""
            executor.submit(Job(h.job_id, d.attempt, d.body, receipt))

    def _ack_early(self, batch: list[_Held]) -> set[int]:
        """Ack the ``Ack.EARLY`` deliveries of ``batch``; return the ids of the stale ones."""
        early = [h.delivery for h in batch if h.task.ack is Ack.EARLY]
        if not early:
            return set()
        # At most once: the broker forgets the message before the body starts.
        try:
            self.adapter.ack_before_start(early)
        except StaleReceipt as exc:
            self._report_stale(exc, "early ack")
            return {id(d) for d in exc.deliveries}
        return set()

    # -- idempotency keys ------------------------------------------------------------------
    def _key_of(self, h: _Held) -> str | None:
        header = h.envelope.headers.get("idempotency_key")
        if isinstance(header, str) and header:
            return f"{h.task.name}:{header}"
        if h.task.idempotency_key is None:
            return None
        key = h.task.idempotency_key(*h.envelope.args, **h.envelope.kwargs)
        return f"{h.task.name}:{key}"

    def _holder(self, h: _Held) -> str:
        return f"{self.worker_id}:{h.job_id}:{h.delivery.attempt}"

    def _idempotency_allows(self, h: _Held) -> bool:
        """Claim the delivery's idempotency key; settle it here when it must not run."""
        try:
            key = self._key_of(h)
        except Exception as exc:
            detail = f"idempotency_key of {h.task.name} raised {exc!r}"
            log.error("message %s dead-lettered: %s", h.delivery.message_id, detail)
            self._dead_letter(
                h.delivery, h.task, h.envelope, DeadLetterMessage("failed"), detail, None
            )
            return False
        if key is None:
            return True
        store = self._store()
        if store is None:
            return True
        claim = store.claim(key, self._holder(h), self.config.lease)
        d = h.delivery
        if claim.state is KeyState.RUN:
            h.idem_key = key
            return True
        if claim.state is KeyState.DONE:
            log.info(
                "message %s: idempotency key %s is done; acked without running", d.message_id, key
            )
            self._settle_held(h, Outcome.ALREADY_DONE, label="done")
            self._emit_raw("skipped", d, h.task.name, key=key)
            return False
        # Held by a live execution: look again soon, backing off up to the holder's lease.
        waits = sum(1 for a in h.envelope.history if a.outcome == "key_busy")
        delay = min(max(0.05, claim.retry_after), 0.25 * 2.0 ** min(waits, 20))
        log.info(
            "message %s: idempotency key %s is held by a live execution; checked again in %.2fs",
            d.message_id,
            key,
            delay,
        )
        self._settle_held(h, Outcome.KEY_BUSY, label="key_busy", retry_delay=delay)
        return False

    def _store(self) -> IdempotencyStore | None:
        if self._idem_store is None:
            url = self.app.idempotency_store_url
            if url is None:
                if not self._idem_warned:
                    log.warning(
                        "a message carries an idempotency key but app %s has no "
                        "idempotency store; it runs without one",
                        self.app.name,
                    )
                    self._idem_warned = True
                return None
            self._idem_store = open_store(url, self.app.plugins)
        return self._idem_store

    def _idem_done(self, h: _Held, completed: bool) -> None:
        """Mark the key done (success) or give it up (failure) — before the broker is told."""
        if h.idem_key is None or self._idem_store is None:
            return
        if completed:
            self._idem_store.complete(h.idem_key, self._holder(h))
        else:
            self._idem_store.release(h.idem_key, self._holder(h))
        h.idem_key = None

    def _return_buffer(self) -> None:
        """Graceful stop: give every prefetched, unstarted message back at once."""
        while self._buffer:
            self._settle_held(self._buffer.popleft(), Outcome.NOT_STARTED, label="returned")

    def _settle_held(
        self,
        h: _Held,
        outcome: Outcome,
        *,
        label: str,
        error: Result | None = None,
        retry_delay: float | None = None,
        reason: str | None = None,
    ) -> None:
        """Ask :func:`settle` about a held delivery and carry its answer out."""
        decision = settle(
            h.task.ack,
            outcome,
            attempt=h.delivery.attempt,
            max_deliveries=h.task.max_deliveries,
            retry_delay=retry_delay,
            reason=reason,
        )
        self._carry_out(decision, h.delivery, h.task, h.envelope, error=error, outcome=label)

    # -- completions -----------------------------------------------------------------------
    def _adapt_budget(self, duration: float) -> None:
        """Automatic prefetch: buffer about PREFETCH_HOLD seconds of work at the recent pace."""
        avg = self._avg_duration = 0.9 * self._avg_duration + 0.1 * max(duration, 1e-6)
        c = self.config.concurrency
        want = c + math.ceil(c * PREFETCH_HOLD / avg)
        self._budget = min(max(4 * c, want), max_auto_prefetch(c))

    def _drain_completions(self, acks: list[Delivery], block: float) -> None:
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
                self._finished(job_id, payload, acks)
            elif kind == "lost":
                self._executor_lost(job_id, payload)
            elif kind == "fatal":
                raise _Fatal(payload)
            try:
                item = self._completions.get_nowait()
            except queue.Empty:
                return

    def _finished(self, job_id: int, result: Result, acks: list[Delivery]) -> None:
        h = self._running.get(job_id)
        if h is None:  # pragma: no cover - a job the loop no longer tracks
            return
        task, d = h.task, h.delivery
        if result.status == FAILED:
            self.counters.failed += 1
            self._emit("failed", h, attempt=d.attempt, error=result.error)
            self._idem_done(h, completed=False)
            try:
                # Held until settled: an early-acked message is at the broker again only
                # once its retry is published.
                self._settle_held(
                    h, Outcome.FAILED, label="failed", error=result, retry_delay=result.retry_delay
                )
            finally:
                del self._running[job_id]
            return
        del self._running[job_id]
        self._idem_done(h, completed=True)
        self.counters.succeeded += 1
        if self.config.prefetch_auto:
            self._adapt_budget(result.duration)
        self._emit("succeeded", h, attempt=d.attempt, duration=result.duration)
        decision = settle(
            task.ack, Outcome.SUCCEEDED, attempt=d.attempt, max_deliveries=task.max_deliveries
        )
        if isinstance(decision, AckMessage):
            acks.append(d)  # settled in one batch with the others of this round

    def _executor_lost(self, job_id: int, reason: str) -> None:
        reason = self._kill_reason.pop(job_id, reason)
        h = self._running.get(job_id)
        if h is None:  # pragma: no cover
            return
        self._idem_done(h, completed=False)  # its holder is dead: the next delivery may run
        try:
            self._settle_held(h, Outcome.EXECUTOR_LOST, label=reason, reason=reason)
        finally:
            del self._running[job_id]

    # -- carrying out a settlement ---------------------------------------------------------
    def _carry_out(
        self,
        decision: Settlement,
        d: Delivery,
        task: Task[..., Any],
        env: _envelope.Envelope,
        *,
        error: Result | None,
        outcome: str,
    ) -> None:
        try:
            if isinstance(decision, AckMessage):
                self.adapter.ack([d])
            elif isinstance(decision, NackMessage):
                self.adapter.nack(d, delay=decision.delay)
                self.counters.returned += 1
                self._emit_raw("returned", d, task.name, reason=outcome, delay=decision.delay)
            elif isinstance(decision, RetryMessage):
                self._retry(decision, d, task, env, error, outcome)
            elif isinstance(decision, DeadLetterMessage):
                self._dead_letter(
                    d,
                    task,
                    env,
                    decision,
                    error.error if error else outcome,
                    error.traceback if error else None,
                )
            elif isinstance(decision, LostMessage):
                self.counters.lost += 1
                log.warning(
                    "task %s message %s lost (%s): it was acked before it started (Ack.EARLY)",
                    task.name,
                    d.message_id,
                    decision.reason,
                )
                self._emit_raw("lost", d, task.name, reason=decision.reason)
                hook = self._hooks["lost"]
                if hook:
                    hook(
                        task=task.name,
                        message_id=d.message_id,
                        queue=d.queue,
                        reason=decision.reason,
                    )
            elif isinstance(decision, Hold):
                pass
        except StaleReceipt as exc:
            self._report_stale(exc, type(decision).__name__)

    def _annotated(
        self, env: _envelope.Envelope, d: Delivery, outcome: str, error: str | None, tb: str | None
    ) -> _envelope.Envelope:
        history = [
            *env.history,
            _envelope.Attempt(
                attempt=d.attempt,
                at=time.time(),
                outcome=outcome,
                error=error,
                traceback=tb,
                worker=self.worker_id,
            ),
        ]
        return msgspec.structs.replace(env, history=history)

    def _retry(
        self,
        decision: RetryMessage,
        d: Delivery,
        task: Task[..., Any],
        env: _envelope.Envelope,
        error: Result | None,
        outcome: str = "failed",
    ) -> None:
        # A failure's retry is recorded as "retry" (it counts against max_retries); a wait
        # for a busy idempotency key as "key_busy" (it does not).
        label = "key_busy" if outcome == "key_busy" else "retry"
        new = self._annotated(
            env, d, label, error.error if error else None, error.traceback if error else None
        )
        new.eta = time.time() + decision.delay if decision.delay else None
        # Publish first, then settle the original: a crash in between duplicates, never loses.
        self.adapter.publish(d.queue, [Outgoing(env.id, _envelope.encode(new), decision.delay)])
        if label == "key_busy":
            self._emit_raw(
                "returned", d, task.name, reason="idempotency_busy", delay=decision.delay
            )
        else:
            self.counters.retried += 1
            self._emit_raw("retried", d, task.name, delay=decision.delay)
            hook = self._hooks["retried"]
            if hook:
                hook(
                    task=task.name,
                    message_id=d.message_id,
                    attempt=d.attempt,
                    delay=decision.delay,
                )
        if not decision.original_settled:
            self.adapter.ack([d])

    def _dead_letter(
        self,
        d: Delivery,
        task: Task[..., Any] | None,
        env: _envelope.Envelope | None,
        decision: DeadLetterMessage,
        error: str | None,
        tb: str | None,
    ) -> None:
        body = None
        if env is not None:
            body = _envelope.encode(self._annotated(env, d, decision.reason, error, tb))
        try:
            if decision.original_settled:
                self.adapter.publish_dead(
                    d.queue, [Outgoing(d.message_id, body or d.body)], reason=decision.reason
                )
            else:
                self.adapter.dead_letter(d, reason=decision.reason, body=body)
        except StaleReceipt as exc:  # the lease moved on: the message is another's now
            self._report_stale(exc, "dead_letter")
            return
        self.counters.dead_lettered += 1
        self.counters.by_reason[decision.reason] = (
            self.counters.by_reason.get(decision.reason, 0) + 1
        )
        name = task.name if task else (env.task if env else None)
        self._emit_raw("dead_lettered", d, name, reason=decision.reason, error=error)
        hook = self._hooks["dead_lettered"]
        if hook:
            hook(task=name, message_id=d.message_id, queue=d.queue, reason=decision.reason)

    def _ack(self, acks: list[Delivery], keep: int = 0) -> None:
        """Send the late acks of ``acks`` but its last ``keep``, which stay pending."""
        cut = len(acks) - keep
        batch = acks[:cut]
        del acks[:cut]
        try:
            self.adapter.ack(batch)
        except StaleReceipt as exc:
            self._report_stale(exc, "ack")
        except TransientAdapterError:
            acks[:0] = batch  # settle them after reconnecting
            raise

    def _renew(self) -> None:
        if self._idem_store is not None:
            # Idempotency claims live as long as their execution: renewed like leases.
            claims = [(h.idem_key, self._holder(h)) for h in self._running.values() if h.idem_key]
            if claims:
                self._idem_store.extend(claims, self.config.lease)
        held = [h.delivery for h in self._buffer if not h.lease_lost]
        held += [h.delivery for h in self._running.values() if not (h.lease_lost or h.acked)]
        if not held or self.adapter.capabilities.lease_extension is not LeaseExtension.PER_MESSAGE:
            return
        try:
            self.adapter.extend(held, lease=self.config.lease)
        except StaleReceipt as exc:
            lost = {id(d) for d in exc.deliveries}
            for h in [*self._buffer, *self._running.values()]:
                if id(h.delivery) in lost:
                    h.lease_lost = True
            self._report_stale(exc, "extend")
            # Buffered deliveries whose lease moved on belong to another worker now.
            self._buffer = collections.deque(h for h in self._buffer if not h.lease_lost)
        self.counters.extended += len(held)

    def _report_stale(self, exc: StaleReceipt, operation: str) -> None:
        self.counters.stale += len(exc.deliveries)
        # An early ack asked again after a broker error may have gone through the first time
        # (the answer was lost): the broker cannot always tell that from a lease gone.
        why = (
            "its lease had expired (it may run again elsewhere), or an earlier try whose "
            "answer was lost went through; not run here (at most once)"
            if operation == "early ack"
            else "its lease had expired and it may run again elsewhere; nothing was changed"
        )
        for d in exc.deliveries:
            log.warning(
                "stale receipt on %s of message %s (queue %s, attempt %d): %s",
                operation,
                d.message_id,
                d.queue,
                d.attempt,
                why,
            )
            self._emit_raw("stale", d, None, operation=operation)

    # -- stopping --------------------------------------------------------------------------
    def _cold_stop(self, executor: Executor) -> int:
        log.warning(
            "worker %s: cold stop with %d task(s) running", self.worker_id, len(self._running)
        )
        executor.shutdown(cold=True)
        for h in list(self._running.values()):
            self._settle_held(h, Outcome.ABANDONED, label="abandoned")
        self._running.clear()
        self._return_buffer()
        return 1

    # -- events ----------------------------------------------------------------------------
    def _emit(self, event: str, h: _Held, **info: Any) -> None:
        if self.listeners:
            self._emit_raw(event, h.delivery, h.task.name, **info)
        hook = self._hooks.get(event)
        if hook is not None:
            d = h.delivery
            if event == "started":
                hook(task=h.task.name, message_id=d.message_id, attempt=d.attempt, queue=d.queue)
            elif event == "succeeded":
                hook(
                    task=h.task.name,
                    message_id=d.message_id,
                    attempt=d.attempt,
                    duration=info["duration"],
                )
            elif event == "failed":
                hook(
                    task=h.task.name,
                    message_id=d.message_id,
                    attempt=d.attempt,
                    error=info["error"],
                )

    def _emit_raw(self, event: str, d: Delivery, task: str | None, **info: Any) -> None:
        if not self.listeners:
            return
        payload = {
            "task": task,
            "message_id": d.message_id,
            "queue": d.queue,
            "attempt": d.attempt,
            **info,
        }
        for listener in self.listeners:
            listener(event, payload)


class _Fatal(Exception):
    pass
