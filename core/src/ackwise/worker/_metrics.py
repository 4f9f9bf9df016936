"""Prometheus metrics of one worker (``ackwise worker --metrics-port N``).

Every number comes from the worker's event stream (:mod:`ackwise.worker._events`), which the
consumer loop emits in the worker's main process for every pool: prefork children run task
bodies and report back, so the supervisor alone counts and serves ``/metrics`` (no
multiprocess mode needed).  Queue depths come from the broker's own ``stats()``, read on a
connection of their own by a sampler thread at most once per ``stats_interval`` seconds.

Needs ``prometheus_client`` (``pip install "ackwise[prometheus]"``); docs/observability.md
lists every metric.
"""

from __future__ import annotations

import bisect
import logging
import socket
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import TYPE_CHECKING, Any
from wsgiref.simple_server import WSGIRequestHandler, make_server

from ackwise.contract._figures import unknown_figures
from ackwise.errors import AckwiseError, ConfigurationError
from ackwise.worker._events import (
    DEAD_LETTER_REASONS,
    STALE_OPERATIONS,
    BrokerError,
    DeadLettered,
    Failed,
    Fetched,
    Interrupted,
    LeasesRenewed,
    Lost,
    Reconnected,
    Retried,
    Stale,
    Started,
    Succeeded,
)
from ackwise.worker._health import with_health

try:
    import prometheus_client as prom
    from prometheus_client.core import (
        CounterMetricFamily,
        GaugeMetricFamily,
        HistogramMetricFamily,
    )
    from prometheus_client.exposition import ThreadingWSGIServer
    from prometheus_client.registry import Collector
except ImportError:  # pragma: no cover - the CLI says how to install it
    prom = None  # type: ignore[assignment]
    Collector = object  # type: ignore[assignment,misc]

if TYPE_CHECKING:
    from ackwise.worker._loop import Worker

__all__ = ["QueueSampler", "WorkerMetrics", "require_prometheus"]

log = logging.getLogger("ackwise.worker")


class _QuietHandler(WSGIRequestHandler):
    """No access log line per scrape or probe."""

    def log_message(self, format: str, *args: Any) -> None:
        pass


#: Task durations: 1 ms to 10 min.
DURATION_BUCKETS = (
    0.001,
    0.005,
    0.01,
    0.025,
    0.05,
    0.1,
    0.25,
    0.5,
    1,
    2.5,
    5,
    10,
    30,
    60,
    300,
    600,
)
#: Enqueue (or ETA) to start: 1 ms to 1 h.
WAIT_BUCKETS = (0.001, 0.005, 0.01, 0.05, 0.1, 0.5, 1, 5, 10, 30, 60, 300, 900, 3600)
#: Attempts above this share one label value ("10+"): the label stays bounded.
MAX_ATTEMPT_LABEL = 10
#: The ``task`` label of a message whose task this worker does not know (its name comes from
#: the message: as a label value it would let producers grow the series without bound).
UNKNOWN_TASK = "<unknown>"


def require_prometheus() -> None:
    """Raise a one-line error when ``prometheus_client`` is missing."""
    if prom is None:
        raise ConfigurationError(
            "--metrics-port needs prometheus_client: pip install 'ackwise[prometheus]'"
        )


class _Counter:
    """A counter family kept as plain numbers per label values.

    Updated on the consumer thread with one dict increment (a ``prometheus_client`` child
    takes a lock and more calls per update, on the path of every task); a scrape copies the
    dict, which CPython does without running other threads.
    """

    __slots__ = ("doc", "labels", "name", "values")

    def __init__(self, name: str, doc: str, labels: Sequence[str] = ()) -> None:
        self.name, self.doc, self.labels = name, doc, list(labels)
        self.values: dict[tuple[str, ...], float] = {}

    def add(self, key: tuple[str, ...], amount: float = 1) -> None:
        values = self.values
        values[key] = values.get(key, 0) + amount

    def seed(self, keys: Iterable[tuple[str, ...]]) -> None:
        """Export ``keys`` at 0 until their first increment (a known label set)."""
        for key in keys:
            self.values.setdefault(key, 0)

    def family(self) -> Any:
        fam = CounterMetricFamily(self.name, self.doc, labels=self.labels)
        for key, value in self.values.copy().items():
            fam.add_metric(list(key), value)
        return fam


class _Histogram:
    """A histogram family kept as bucket counts per label values (see :class:`_Counter`)."""

    __slots__ = ("bounds", "doc", "labels", "name", "series")

    def __init__(self, name: str, doc: str, labels: Sequence[str], bounds: Sequence[float]) -> None:
        self.name, self.doc, self.labels = name, doc, list(labels)
        self.bounds = tuple(float(b) for b in bounds)
        #: per label values: a count per bucket (the last one: above every bound), then the sum
        self.series: dict[tuple[str, ...], list[float]] = {}

    def new(self, key: tuple[str, ...]) -> list[float]:
        s = self.series[key] = [0] * (len(self.bounds) + 1) + [0.0]
        return s

    def observe(self, key: tuple[str, ...], value: float) -> None:
        s = self.series.get(key) or self.new(key)
        s[bisect.bisect_left(self.bounds, value)] += 1  # the first bucket whose le >= value
        s[-1] += value

    def counts(self) -> dict[tuple[str, ...], float]:
        """Observations per label values (the ``_count`` of each series)."""
        return {key: sum(s[:-1]) for key, s in self.series.copy().items()}

    def family(self) -> Any:
        fam = HistogramMetricFamily(self.name, self.doc, labels=self.labels)
        for key, s in self.series.copy().items():
            counts, total = s[:-1], s[-1]  # one copy: a scrape sees each series at one instant
            buckets, running = [], 0.0
            for bound, n in zip((*self.bounds, float("inf")), counts, strict=True):
                running += n
                buckets.append(("+Inf" if bound == float("inf") else repr(bound), running))
            fam.add_metric(list(key), buckets, total)
        return fam


class WorkerMetrics(Collector):
    """The metrics of ``worker``, in a registry of their own.

    :param stats_interval: seconds between two reads of the queues' ``stats()`` (at most);
        0 turns the queue gauges off.
    """

    def __init__(self, worker: Worker, *, stats_interval: float = 15.0) -> None:
        require_prometheus()
        self.worker = worker
        C, H = _Counter, _Histogram
        # ackwise_tasks_total is the duration histogram's counts (succeeded, failed) plus
        # these: one update per finished task instead of two.
        self.interrupted = C("ackwise_tasks", "", ["task", "queue", "outcome"])
        self.duration = H(
            "ackwise_task_duration_seconds",
            "How long task bodies ran, by how they ended (succeeded or failed).",
            ["task", "queue", "outcome"],
            DURATION_BUCKETS,
        )
        self.wait = H(
            "ackwise_task_wait_seconds",
            "From enqueue (or the ETA of a delayed message) to the task's start.",
            ["task", "queue"],
            WAIT_BUCKETS,
        )
        #: (queue, attempt) -> deliveries; labelled (and redeliveries summed) at scrape time.
        self.deliveries: dict[tuple[str, int], int] = {}
        self.retries = C("ackwise_retries", "Retries published after a failure.", ["task", "queue"])
        self.dead_letters = C(
            "ackwise_dead_letters",
            "Messages moved to the dead-letter store, by reason.",
            ["queue", "reason"],
        )
        self.lost = C(
            "ackwise_lost_messages",
            "Early-acked (at most once) messages whose execution did not complete.",
            ["task", "queue"],
        )
        self.stale = C(
            "ackwise_stale_receipts",
            "Settlements or renewals the broker refused: the lease had moved on.",
            ["queue", "operation"],
        )
        self.renewed = C("ackwise_lease_renewals", "Leases renewed (one per message per renewal).")
        self.renewal_failures = C(
            "ackwise_lease_renewal_failures",
            "Leases found gone at renewal (the message may run again elsewhere).",
        )
        self.broker_errors = C(
            "ackwise_broker_errors",
            "Broker calls that failed: transient (the worker reconnects) or permanent.",
            ["kind"],
        )
        self.reconnects = C("ackwise_broker_reconnects", "Reconnections after broker errors.")
        self._families: list[_Counter | _Histogram] = [
            v
            for v in vars(self).values()
            if isinstance(v, _Counter | _Histogram) and v is not self.interrupted
        ]
        self.registry = prom.CollectorRegistry(auto_describe=False)
        prom.ProcessCollector(registry=self.registry)
        prom.GCCollector(registry=self.registry)
        self.registry.register(self)
        self.sampler: QueueSampler | None = None
        if stats_interval > 0:
            self.sampler = QueueSampler(
                worker.app.adapter,
                worker.config.queues,
                stats_interval,
                ready=worker.control.ready.is_set,
            )
            self.registry.register(self.sampler)
        self._known = frozenset(worker.app.tasks)
        self._ended_at_start = self._seed()
        self._server: Any = None
        subscribe = worker.events.subscribe
        subscribe([Fetched], self._fetched)
        subscribe([Started], self._started)
        subscribe([Succeeded], self._succeeded)
        subscribe([Failed], self._failed)
        subscribe([Interrupted], self._interrupted)
        subscribe([Retried], self._retried)
        subscribe([DeadLettered], self._dead_lettered)
        subscribe([Lost], self._lost)
        subscribe([Stale], self._stale)
        subscribe([LeasesRenewed], self._renewed)
        subscribe([BrokerError], self._broker_error)
        subscribe([Reconnected], lambda e: self.reconnects.add(()))

    def _seed(self) -> dict[tuple[str, ...], float]:
        """Put every counter's known label sets at 0, so each has a sample from the start (a
        rate or an ``increase() > 0`` alert has something to evaluate before the first event):

        - by task: each registered task on its own queue, where this worker consumes it;
        - by queue: each queue it consumes, with every dead-letter reason, stale operation
          and attempt label;
        - ``kind``: ``transient`` and ``permanent``; the unlabelled counters.

        Return the succeeded and failed series of ``ackwise_tasks_total`` (counted by the
        duration histogram, whose series start at the first observation).
        """
        queues = list(self.worker.config.queues)
        here = [(t.name, t.queue) for t in self.worker.app.tasks.values() if t.queue in queues]
        self.interrupted.seed((task, q, "interrupted") for task, q in here)
        self.retries.seed(here)
        self.lost.seed(here)
        self.dead_letters.seed((q, reason) for q in queues for reason in DEAD_LETTER_REASONS)
        self.stale.seed((q, operation) for q in queues for operation in STALE_OPERATIONS)
        for q in queues:  # attempts 1 to MAX_ATTEMPT_LABEL ("10+"): redeliveries too
            for attempt in range(1, MAX_ATTEMPT_LABEL + 1):
                self.deliveries.setdefault((q, attempt), 0)
        self.broker_errors.seed([("transient",), ("permanent",)])
        for counter in (self.renewed, self.renewal_failures, self.reconnects):
            counter.seed([()])
        return {(t, q, o): 0 for t, q in here for o in ("succeeded", "failed")}

    # -- serving ---------------------------------------------------------------------------
    def serve(self, port: int, host: str = "0.0.0.0") -> int:
        """Serve ``/metrics`` and ``/healthz`` (:mod:`ackwise.worker._health`) on ``host:port`` from
        a daemon thread; return the bound port.

        :raises ConfigurationError: the address cannot be listened on.
        """
        app = with_health(prom.make_wsgi_app(self.registry), self.worker)
        try:
            family = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)[0][0]
            server_class = type("Server", (ThreadingWSGIServer,), {"address_family": family})
            server: Any = make_server(host, port, app, server_class, handler_class=_QuietHandler)
        except OSError as exc:
            raise ConfigurationError(
                f"--metrics-port {port}: cannot listen on {host}:{port}: {exc.strerror or exc}"
            ) from None
        threading.Thread(target=server.serve_forever, name="metrics", daemon=True).start()
        self._server = server
        bound = int(server.server_address[1])
        log.info("metrics on http://%s:%d/metrics (liveness: /healthz)", host, bound)
        return bound

    def close(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None
        if self.sampler is not None:
            self.sampler.close()

    def describe(self) -> Iterator[Any]:
        return iter(())  # built per scrape

    def collect(self) -> Iterator[Any]:
        for family in self._families:
            yield family.family()
        tasks = CounterMetricFamily(
            "ackwise_tasks",
            "Executions by how they ended: succeeded, failed (raised) or interrupted "
            "(executor died, hard time limit, cold stop).",
            labels=["task", "queue", "outcome"],
        )
        ended = dict(self._ended_at_start)
        ended.update(self.duration.counts())
        ended.update(self.interrupted.values.copy())
        for key, n in ended.items():
            tasks.add_metric(list(key), n)
        yield tasks
        deliveries = CounterMetricFamily(
            "ackwise_deliveries",
            "Deliveries received from the broker, by attempt (the broker's delivery count).",
            labels=["queue", "attempt"],
        )
        redeliveries = CounterMetricFamily(
            "ackwise_redeliveries",
            "Deliveries with attempt > 1: the message was delivered before.",
            labels=["queue"],
        )
        by_label: dict[tuple[str, str], int] = {}
        again: dict[str, int] = {}
        for (queue, attempt), n in self.deliveries.copy().items():
            label = str(attempt) if attempt < MAX_ATTEMPT_LABEL else f"{MAX_ATTEMPT_LABEL}+"
            by_label[queue, label] = by_label.get((queue, label), 0) + n
            if attempt > 1:
                again[queue] = again.get(queue, 0) + n
        for (queue, label), n in by_label.items():
            deliveries.add_metric([queue, label], n)
        for queue, n in again.items():
            redeliveries.add_metric([queue], n)
        yield deliveries
        yield redeliveries
        w = self.worker
        for name, doc, value in (
            (
                "ackwise_worker_buffered_messages",
                "Messages received and not started yet (the prefetch buffer).",
                w.held - w.running,
            ),
            ("ackwise_worker_running_tasks", "Tasks running now.", w.running),
            (
                "ackwise_worker_prefetch_budget",
                "Messages the worker holds at most now, running included.",
                w.budget,
            ),
            ("ackwise_worker_concurrency", "Executor slots.", w.config.concurrency),
        ):
            yield GaugeMetricFamily(name, doc, value=value)

    # -- events: one dict update each, on the consumer thread --------------------------------
    def _task(self, name: str | None) -> str:
        return name if name is not None and name in self._known else UNKNOWN_TASK

    def _fetched(self, e: Fetched) -> None:
        deliveries, queue = self.deliveries, e.queue
        for attempt in e.attempts:
            key = (queue, attempt)
            deliveries[key] = deliveries.get(key, 0) + 1

    # Started and Succeeded come once per task: _Histogram.observe inlined.
    def _started(self, e: Started) -> None:
        if e.due_at:
            task = e.task if e.task in self._known else UNKNOWN_TASK
            waited = time.time() - e.due_at
            h = self.wait
            s = h.series.get((task, e.queue)) or h.new((task, e.queue))
            s[bisect.bisect_left(h.bounds, waited)] += 1
            s[-1] += waited if waited > 0 else 0.0

    def _succeeded(self, e: Succeeded) -> None:
        task = e.task if e.task in self._known else UNKNOWN_TASK
        h, duration = self.duration, e.duration
        s = h.series.get((task, e.queue, "succeeded")) or h.new((task, e.queue, "succeeded"))
        s[bisect.bisect_left(h.bounds, duration)] += 1
        s[-1] += duration

    def _failed(self, e: Failed) -> None:
        self.duration.observe((self._task(e.task), e.queue, "failed"), e.duration)

    def _interrupted(self, e: Interrupted) -> None:
        self.interrupted.add((self._task(e.task), e.queue, "interrupted"))

    def _retried(self, e: Retried) -> None:
        self.retries.add((self._task(e.task), e.queue))

    def _dead_lettered(self, e: DeadLettered) -> None:
        self.dead_letters.add((e.queue, e.reason))

    def _lost(self, e: Lost) -> None:
        self.lost.add((self._task(e.task), e.queue))

    def _stale(self, e: Stale) -> None:
        self.stale.add((e.queue, e.operation))

    def _renewed(self, e: LeasesRenewed) -> None:
        self.renewed.add((), e.renewed)
        if e.lost:
            self.renewal_failures.add((), e.lost)

    def _broker_error(self, e: BrokerError) -> None:
        self.broker_errors.add(("transient" if e.transient else "permanent",))


class QueueSampler(Collector):
    """Per-queue gauges from the broker's ``stats()``, read at most once per ``interval``.

    One thread owns the sampler's own adapter (adapters need not be thread-safe); a scrape
    asks it for fresh figures when the last are older than ``interval`` and waits for them
    up to ``wait`` seconds, else serves the last ones.  A figure the broker cannot report
    (:func:`ackwise.contract._figures.unknown_figures` of the opened adapter) has no sample: a 0
    would read as "nothing there".

    :param ready: whether the worker has declared its queues (its consumer is ready).  Before
        that nothing is read and no queue gauge has a sample: a queue not declared yet is not
        a failed read (RabbitMQ answers "not found" for it, and a scrape as early as the
        metrics port is served would count a stats error).
    """

    def __init__(
        self,
        adapter_factory: Callable[[], Any],
        queues: Sequence[str],
        interval: float,
        *,
        wait: float = 2.0,
        ready: Callable[[], bool] = lambda: True,
    ) -> None:
        self.ready = ready
        self.queues = list(queues)
        self.interval = interval
        self.wait = wait
        self._factory = adapter_factory
        self._rows: list[Any] = []
        self._unknown: dict[str, str] = {}  # of the adapter that read the rows
        self._sampled_at = 0.0  # monotonic: the last read that worked
        self._tried_at = float("-inf")  # the last read, failed or not: the rate bound
        self._errors = 0
        self._cv = threading.Condition()
        self._wanted = False
        self._closed = False
        self._thread = threading.Thread(target=self._run, name="ackwise-metrics-stats", daemon=True)
        self._thread.start()

    def describe(self) -> Iterator[Any]:
        return iter(())  # the families are built per scrape

    def collect(self) -> Iterator[Any]:
        with self._cv:
            if self.ready() and time.monotonic() - self._tried_at >= self.interval:
                self._tried_at = time.monotonic()
                self._wanted = True
                self._cv.notify_all()
                self._cv.wait_for(lambda: not self._wanted or self._closed, timeout=self.wait)
            rows, unknown = self._rows, self._unknown
            sampled_at, errors = self._sampled_at, self._errors
        families = {
            "ready": ("ackwise_queue_ready_messages", "Messages ready to be received."),
            "delayed": ("ackwise_queue_delayed_messages", "Messages waiting for their delay."),
            "in_flight": (
                "ackwise_queue_in_flight_messages",
                "Messages received and not settled (under a live lease).",
            ),
            "dead": ("ackwise_queue_dead_messages", "Messages in the dead-letter store."),
            "oldest_age": (
                "ackwise_queue_oldest_age_seconds",
                "Seconds the oldest ready message has waited.",
            ),
        }
        for field, (name, doc) in families.items():
            g = GaugeMetricFamily(name, doc, labels=["queue"])
            if field not in unknown:
                for row in rows:
                    g.add_metric([row.queue], float(getattr(row, field)))
            yield g
        age = GaugeMetricFamily(
            "ackwise_queue_stats_age_seconds",
            "Seconds since the queue gauges were read from the broker.",
        )
        age.add_metric([], time.monotonic() - sampled_at if sampled_at else float("nan"))
        yield age
        failures = CounterMetricFamily(
            "ackwise_queue_stats_errors", "Reads of the queues' stats() that failed."
        )
        failures.add_metric([], errors)
        yield failures

    def _run(self) -> None:
        adapter = None
        try:
            while True:
                with self._cv:
                    self._cv.wait_for(lambda: self._wanted or self._closed)
                    if self._closed:
                        return
                try:
                    if adapter is None:
                        adapter = self._factory()
                        adapter.open()
                    unknown = unknown_figures(adapter.capabilities)
                    rows = [adapter.stats(q) for q in self.queues]
                except AckwiseError as exc:
                    log.warning("metrics: reading the queues' stats failed: %s", exc)
                    with self._cv:
                        self._errors += 1
                        self._wanted = False
                        self._cv.notify_all()
                    if adapter is not None:
                        _close_quietly(adapter)
                        adapter = None
                    continue
                with self._cv:
                    self._rows, self._unknown = rows, unknown
                    self._sampled_at = time.monotonic()
                    self._wanted = False
                    self._cv.notify_all()
        finally:
            if adapter is not None:
                _close_quietly(adapter)

    def close(self) -> None:
        with self._cv:
            self._closed = True
            self._cv.notify_all()
        self._thread.join(timeout=5.0)


def _close_quietly(adapter: Any) -> None:
    try:
        adapter.close()
    except AckwiseError:
        log.debug("closing the metrics' adapter failed", exc_info=True)
