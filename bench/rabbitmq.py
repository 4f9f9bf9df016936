"""RabbitMQ benchmark: ackwise vs Celery and Dramatiq (and a raw pika publish loop), in one run,
on one private RabbitMQ node.  See ``bench/README.md`` for the method.

    uv run --group bench python bench/rabbitmq.py [--runs 3] [--tasks 20000]
                                                  [--out bench/results-rabbitmq.md] [--only PREFIXES]
"""

from __future__ import annotations

import argparse
import copy
import json
import statistics
import sys
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

import _common  # embedded.Drain, startlog, CPU sampling: the shared method
import pika
from _common import Cell, Drain
from rabbitbench import rabbit_tasks

from ackwise_conformance.brokers import BrokerUnavailable, provide

#: Enqueue cells stop after this many seconds even when not all tasks were sent.
ENQUEUE_CAP = 5.0
BATCH = 500
#: Producer threads of the "-threads" enqueue cells (one app or broker object shared).
PRODUCER_THREADS = 8
SHARED_URL = "amqp://guest:guest@127.0.0.1:5672/%2F"
WORKER_ENV = _common.worker_env("rabbitbench")


# -- the broker -----------------------------------------------------------------------------
class Broker:
    """A private RabbitMQ node on free ports; else the shared one on 5672 (unique queues).

    Every cell uses queues of its own, deleted (with ackwise's, Celery's and Dramatiq's
    auxiliary queues and exchanges) when the cell is over.
    """

    def __init__(self, tmp: Path) -> None:
        self.pid: int | None = None
        try:
            self.handle: Any = provide("rabbitmq", tmp_dir=tmp)
        except (BrokerUnavailable, OSError) as exc:
            reason = exc.reason if isinstance(exc, BrokerUnavailable) else repr(exc)
            print(f"no private RabbitMQ node ({reason}): using {SHARED_URL}", file=sys.stderr)
            self.handle = None
            self.url = SHARED_URL
            self.where = (
                "**the shared RabbitMQ on 127.0.0.1:5672** (a private node could not be "
                f"started: {reason}); unique queue names, deleted after each cell; broker CPU "
                "not measured"
            )
        else:
            self.url = self.handle.url
            # The node's process group (private nodes only): its CPU is sampled during drains.
            self.pid = _common.server_pid(self.handle)
            if self.handle.source == "env":
                self.where = (
                    "the RabbitMQ of `$ACKWISE_TEST_RABBITMQ_URL` (queues deleted after each cell)"
                )
            else:
                self.where = (
                    f"a private node ({self.handle.source}) on a free port, started for the run "
                    "(queues deleted after each cell)"
                )
        parts = urlsplit(self.url)
        self.amqp = urlunsplit(parts._replace(query=""))  # for pika, kombu and Dramatiq
        conn = self.connect()
        # Private: pika's BlockingConnection has no public accessor for the server properties.
        version = conn._impl.server_properties.get("version", b"?")
        self.version = version.decode() if isinstance(version, bytes) else str(version)
        conn.close()

    def connect(self) -> pika.BlockingConnection:
        return pika.BlockingConnection(pika.URLParameters(self.amqp))

    def ackwise_url(self, classic: bool = False) -> str:
        if not classic:
            return self.url
        parts = urlsplit(self.url)
        query = [*parse_qsl(parts.query), ("queue_type", "classic")]
        return urlunsplit(parts._replace(query=urlencode(query, safe=":/")))

    def ready(self, queue: str) -> int:
        conn = self.connect()
        try:
            return int(conn.channel().queue_declare(queue, passive=True).method.message_count)
        finally:
            conn.close()

    def left(self, queue: str, expected: int) -> int:
        """Messages ready in ``queue`` once the stopped worker's unacked ones went back."""
        deadline = time.monotonic() + 5
        n = self.ready(queue)
        while n != expected and time.monotonic() < deadline:
            time.sleep(0.1)
            n = self.ready(queue)
        return n

    def delete(self, queue: str) -> None:
        """Delete ``queue`` and what ackwise, Celery and Dramatiq declared around it."""
        queues = [queue, f"{queue}.DQ", f"{queue}.XQ", f"ackwise.{queue}.dead"]
        queues += [f"ackwise.{queue}.wait.{k}" for k in range(32)]
        exchanges = [queue, f"ackwise.{queue}.dlx", f"ackwise.{queue}.deliver"]
        exchanges += [f"ackwise.{queue}.delay.{k}" for k in range(32)]
        conn = self.connect()
        try:
            ch = conn.channel()
            for q in queues:
                ch.queue_delete(q)
            for x in exchanges:
                ch.exchange_delete(x)
        finally:
            conn.close()

    def stop(self) -> None:
        if self.handle is not None:
            self.handle.stop()


def _cell_queue(kind: str) -> str:
    return f"bench-{kind}-{uuid.uuid4().hex[:8]}"


# -- enqueue --------------------------------------------------------------------------------
_envelope: list[tuple[bytes, Any]] = []


def _sample_envelope(b: Broker) -> tuple[bytes, Any]:
    """The body and properties of one message ``delay()`` published (read back once)."""
    if not _envelope:
        queue = _cell_queue("sample")
        app = rabbit_tasks.make_ackwise_app(b.url, queue)
        app.bench_noop.delay()
        app.close()
        conn = b.connect()
        ch = conn.channel()
        method, props, body = ch.basic_get(queue, auto_ack=True)
        conn.close()
        b.delete(queue)
        assert method is not None, "ackwise published nowhere"
        _envelope.append((body, props))
    return _envelope[0]


def enq_pika(b: Broker, queue: str, tasks: int, queue_type: str) -> float:
    """The floor: one pika ``basic_publish`` per message, each waiting for its confirm."""
    body, sample = _sample_envelope(b)
    props = pika.BasicProperties(
        message_id=sample.message_id, delivery_mode=2, timestamp=sample.timestamp
    )
    conn = b.connect()
    try:
        ch = conn.channel()
        ch.queue_declare(queue, durable=True, arguments={"x-queue-type": queue_type})
        ch.confirm_delivery()
        return _common.timed(
            _common.hundred(lambda: ch.basic_publish("", queue, body, props, mandatory=True)),
            tasks,
            ENQUEUE_CAP,
        )
    finally:
        conn.close()


def enq_ackwise(url: str, queue: str, tasks: int, batch: int | None, threads: int = 1) -> float:
    app = rabbit_tasks.make_ackwise_app(url, queue)
    return _common.enqueue_ackwise(app, tasks, batch, ENQUEUE_CAP, threads)


def enq_celery(url: str, queue: str, tasks: int, confirm: bool) -> float:
    app = rabbit_tasks.make_celery_app(url, queue, confirm)
    noop = app.bench_noop
    noop.delay()
    try:
        return _common.timed(_common.hundred(noop.delay), tasks, ENQUEUE_CAP)
    finally:
        app.close()


def enq_dramatiq(url: str, queue: str, tasks: int, confirm: bool, threads: int = 1) -> float:
    """Dramatiq's ``send()``; from ``threads`` threads sharing the broker (one connection and
    channel per thread: its design) when more than one."""
    broker = rabbit_tasks.make_dramatiq_broker(url, queue, confirm)
    noop = broker.bench_noop
    noop.send()
    try:
        if threads > 1:
            return _common.timed_threads(_common.hundred(noop.send), tasks, ENQUEUE_CAP, threads)
        return _common.timed(_common.hundred(noop.send), tasks, ENQUEUE_CAP)
    finally:
        broker.close()


def enqueue(b: Broker, key: str, tasks: int) -> float:
    queue = _cell_queue("enq")
    try:
        if key.startswith("enq-pika-"):
            return enq_pika(b, queue, tasks, key.removeprefix("enq-pika-"))
        threads = PRODUCER_THREADS if key.endswith("-threads") else 1
        if key.startswith("enq-ackwise"):
            batch = BATCH if key == "enq-ackwise-batch" else None
            url = b.ackwise_url(key == "enq-ackwise-classic")
            return enq_ackwise(url, queue, tasks, batch, threads)
        if key == "enq-dramatiq-threads":
            return enq_dramatiq(b.amqp, queue, tasks, True, threads)
        confirm = not key.endswith("-noconfirm")
        if key.startswith("enq-celery"):
            return enq_celery(b.amqp, queue, tasks, confirm)
        return enq_dramatiq(b.amqp, queue, tasks, confirm)
    finally:
        b.delete(queue)


# -- prefill (not measured) -----------------------------------------------------------------
def prefill_ackwise(b: Broker, url: str, queue: str, tasks: int) -> None:
    app = rabbit_tasks.make_ackwise_app(url, queue)
    for i in range(0, tasks, BATCH):
        app.send_many([app.bench_noop.s() for _ in range(min(BATCH, tasks - i))])
    app.close()


def _copy_template(
    b: Broker, queue: str, tasks: int, fresh: Callable[[bytes, Any], tuple[bytes, Any]]
) -> None:
    """Take the one message the system published and publish ``tasks`` fresh copies of it.

    No confirms (the prefill is not measured); done when the queue holds all of them.
    """
    conn = b.connect()
    try:
        ch = conn.channel()
        deadline = time.monotonic() + 10
        while True:
            method, props, body = ch.basic_get(queue, auto_ack=True)
            if method is not None:
                break
            if time.monotonic() > deadline:
                raise RuntimeError(f"{queue}: the template message never arrived")
            time.sleep(0.01)
        for _ in range(tasks):
            ch.basic_publish("", queue, *fresh(body, props))
        while ch.queue_declare(queue, passive=True).method.message_count < tasks:
            if time.monotonic() > deadline + 60:
                raise RuntimeError(f"{queue}: the prefill did not arrive")
            time.sleep(0.05)
    finally:
        conn.close()


def prefill_celery(b: Broker, url: str, queue: str, tasks: int) -> None:
    """Publish one task through Celery, then copy its message with fresh task ids."""
    app = rabbit_tasks.make_celery_app(url, queue)
    app.bench_noop.delay()
    app.close()

    def fresh(body: bytes, props: Any) -> tuple[bytes, Any]:
        tid = str(uuid.uuid4())
        p = copy.copy(props)
        p.headers = {**props.headers, "id": tid, "root_id": tid}
        p.correlation_id = tid
        return body, p

    _copy_template(b, queue, tasks, fresh)


def prefill_dramatiq(b: Broker, url: str, queue: str, tasks: int) -> None:
    """Publish one message through Dramatiq, then copy it with fresh message ids."""
    broker = rabbit_tasks.make_dramatiq_broker(url, queue)
    broker.bench_noop.send()
    broker.close()

    def fresh(body: bytes, props: Any) -> tuple[bytes, Any]:
        m = json.loads(body)
        m["message_id"] = str(uuid.uuid4())
        return json.dumps(m, separators=(",", ":")).encode(), props

    _copy_template(b, queue, tasks, fresh)


PREFILL: dict[str, Callable[[Broker, str, str, int], None]] = {
    "ackwise": prefill_ackwise,
    "celery": prefill_celery,
    "dramatiq": prefill_dramatiq,
}


# -- workers --------------------------------------------------------------------------------
def start_worker(
    system: str,
    config: str,
    concurrency: int,
    url: str,
    queue: str,
    cell: Path,
    python: str | None = None,
    dramatiq_queue_type: str = "classic",
) -> _common.WorkerProc:
    env = dict(WORKER_ENV)
    env.update(RABBIT_BENCH_URL=url, RABBIT_BENCH_QUEUE=queue, RABBIT_BENCH_SYSTEM=system)
    env.update(RABBIT_BENCH_DRAMATIQ_QUEUE_TYPE=dramatiq_queue_type)
    cmd = _common.worker_cmd("rabbit_tasks", system, config, concurrency, python)
    return _common.start_worker(cmd, env, cell)


def _system_url(b: Broker, system: str, classic: bool) -> str:
    return b.ackwise_url(classic) if system == "ackwise" else b.amqp


def drain(
    b: Broker,
    system: str,
    config: str,
    concurrency: int,
    tasks: int,
    cell: Path,
    classic: bool,
    python: str | None = None,
) -> tuple[Drain, float]:
    queue = _cell_queue("drain")
    url = _system_url(b, system, classic)
    try:
        PREFILL[system](b, url, queue, tasks)
        w = start_worker(system, config, concurrency, url, queue, cell, python)
        result, broker_us = _common.follow_drain(
            w, tasks, f"{system} {config} x{concurrency}", also=b.pid
        )
        result.left = b.left(queue, tasks - result.started)
        return result, broker_us
    finally:
        b.delete(queue)


# -- latency --------------------------------------------------------------------------------
def latency(b: Broker, system: str, config: str, cell: Path, classic: bool) -> tuple[float, ...]:
    """(p50 ms, p99 ms, achieved send rate) at a steady RATE, concurrency 1; ``classic``: on
    a classic queue (ackwise; Dramatiq's own) rather than a quorum queue (Dramatiq's, set by
    this bench)."""
    queue = _cell_queue("lat")
    url = _system_url(b, system, classic)
    dramatiq_queue_type = "classic" if classic else "quorum"
    close: Callable[[], Any]
    if system == "ackwise":
        app = rabbit_tasks.make_ackwise_app(url, queue)
        send: Callable[[float], Any] = app.bench_noop.delay
        close = app.close
    elif system == "celery":
        capp = rabbit_tasks.make_celery_app(url, queue)
        send, close = capp.bench_noop.delay, capp.close
    else:
        broker = rabbit_tasks.make_dramatiq_broker(url, queue, queue_type=dramatiq_queue_type)
        send, close = broker.bench_noop.send, broker.close
    try:
        w = start_worker(system, config, 1, url, queue, cell, None, dramatiq_queue_type)
        return _common.measure_latency(w, send, f"{system} latency")
    finally:
        close()
        b.delete(queue)


# -- the plan -------------------------------------------------------------------------------
def plan(baseline: str | None = None) -> list[Cell]:
    """Every cell; with ``baseline`` (``--baseline``'s interpreter) ackwise's drains twice."""

    def enq(key: str) -> Callable[[Broker, Path, int], float]:
        return lambda b, cell, n: enqueue(b, key, n)

    confirm = "publisher confirm per message"
    cells = [
        Cell("enq-pika-quorum", "enqueue", "pika",
             f"`basic_publish`, {confirm}, quorum queue (the floor)", enq("enq-pika-quorum")),
        Cell("enq-pika-classic", "enqueue", "pika",
             f"`basic_publish`, {confirm}, classic queue (the floor)", enq("enq-pika-classic")),
        Cell("enq-ackwise", "enqueue", "ackwise",
             "`delay()`, one call per task (confirms: always), quorum queue", enq("enq-ackwise")),
        Cell("enq-ackwise-batch", "enqueue", "ackwise",
             f"`send_many`, chunks of {BATCH} (one confirm wait per chunk), quorum queue",
             enq("enq-ackwise-batch")),
        Cell("enq-ackwise-classic", "enqueue", "ackwise",
             "`delay()`, one call per task, `?queue_type=classic` (extra)",
             enq("enq-ackwise-classic")),
        Cell("enq-dramatiq", "enqueue", "dramatiq",
             "`send()`, one call per task, `confirm_delivery=True`", enq("enq-dramatiq")),
        Cell("enq-ackwise-threads", "enqueue", "ackwise",
             f"`delay()` from {PRODUCER_THREADS} threads sharing the app, quorum queue",
             enq("enq-ackwise-threads")),
        Cell("enq-dramatiq-threads", "enqueue", "dramatiq",
             f"`send()` from {PRODUCER_THREADS} threads, `confirm_delivery=True`",
             enq("enq-dramatiq-threads")),
        Cell("enq-dramatiq-noconfirm", "enqueue", "dramatiq",
             "`send()`, its default `confirm_delivery=False` (no confirms)",
             enq("enq-dramatiq-noconfirm")),
        Cell("enq-celery", "enqueue", "celery",
             "`delay()`, one call per task, `confirm_publish=True`", enq("enq-celery")),
        Cell("enq-celery-noconfirm", "enqueue", "celery",
             "`delay()`, its default (no `confirm_publish`: no confirms)",
             enq("enq-celery-noconfirm")),
    ]  # fmt: skip
    drains = [
        ("ackwise", "threads", 1, False, "threads x1, late ack, prefetch auto, quorum queue"),
        ("celery", "prefork", 1, False, "prefork x1, acks_late, prefetch x1"),
        ("dramatiq", "threads", 1, False, "threads x1 (prefetch 2)"),
        ("ackwise-classic", "threads", 1, True, "threads x1, late ack, `?queue_type=classic`"),
        ("ackwise", "threads", 8, False, "threads x8, late ack, prefetch auto, quorum queue"),
        ("celery", "threads", 8, False, "threads x8, acks_late, prefetch x1"),
        ("dramatiq", "threads", 8, False, "threads x8 (prefetch 16)"),
        ("ackwise-classic", "threads", 8, True, "threads x8, late ack, `?queue_type=classic`"),
    ]
    for name, config, c, classic, text in drains:
        system = name.split("-")[0]
        cells.append(
            Cell(
                f"drain-{name}-{c}",
                "drain",
                name,
                text,
                lambda b, cell, n, system=system, config=config, c=c, classic=classic: drain(
                    b, system, config, c, n, cell, classic
                ),
            )
        )
        if name == "ackwise" and baseline:
            cells.append(
                Cell(
                    f"drain-{name}-{c}-baseline",
                    "drain",
                    "ackwise-baseline",
                    text,
                    lambda b, cell, n, config=config, c=c: drain(
                        b, "ackwise", config, c, n, cell, False, baseline
                    ),
                )
            )
    lat = [
        ("ackwise", "threads", False, "threads x1, quorum queue"),
        ("celery", "prefork", False, "prefork x1, acks_late, prefetch x1"),
        ("dramatiq", "threads", True, "threads x1"),
        ("ackwise-classic", "threads", True, "threads x1, `?queue_type=classic`"),
        ("dramatiq-quorum", "threads", False, "threads x1, its queues declared quorum (not its default)"),
    ]  # fmt: skip
    for name, config, classic, text in lat:
        system = name.split("-")[0]
        cells.append(
            Cell(
                f"lat-{name}",
                "latency",
                name,
                text,
                lambda b, cell, n, system=system, config=config, classic=classic: latency(
                    b, system, config, cell, classic
                ),
            )
        )
    return cells


# -- report ---------------------------------------------------------------------------------
PEERS = {"celery", "dramatiq"}


def _best(cells: list[Cell], keys: list[str], lower: bool = False) -> Cell | None:
    have = [c for c in cells if c.key in keys and c.values]
    if not have:
        return None
    return (min if lower else max)(have, key=lambda c: c.median)


def _ratio_rows(cells: list[Cell]) -> list[str]:
    by = {c.key: c for c in cells if c.values}
    rows: list[str] = []

    def row(name: str, key: str, peers: list[str]) -> None:
        best = _best(cells, peers)
        if key not in by or best is None:
            return
        a = by[key]
        rows.append(
            f"| {name} | {a.system} {_common.fmt(a.median)} | {best.system} "
            f"{_common.fmt(best.median)} ({best.key}) | **{a.median / best.median:.2f}x** |"
        )

    row("enqueue, one call per task, both with confirms", "enq-ackwise", ["enq-dramatiq"])
    row(
        f"enqueue, one call per task from {PRODUCER_THREADS} threads, both with confirms",
        "enq-ackwise-threads",
        ["enq-dramatiq-threads"],
    )
    row("enqueue, one call per task, vs Dramatiq's default (no confirms)", "enq-ackwise",
        ["enq-dramatiq-noconfirm"])  # fmt: skip
    row("enqueue, ackwise `send_many` vs Dramatiq `send()` (confirms)", "enq-ackwise-batch",
        ["enq-dramatiq"])  # fmt: skip
    row("enqueue, ackwise `delay()` vs the raw pika floor (quorum)", "enq-ackwise",
        ["enq-pika-quorum"])  # fmt: skip
    row("enqueue, one call per task, vs Celery (both with confirms)", "enq-ackwise",
        ["enq-celery"])  # fmt: skip
    for n in (1, 8):
        peers = [f"drain-celery-{n}", f"drain-dramatiq-{n}"]
        row(f"drain, concurrency {n}, vs the best peer", f"drain-ackwise-{n}", peers)
        row(f"drain, concurrency {n}, ackwise on a classic queue (extra)",
            f"drain-ackwise-classic-{n}", peers)  # fmt: skip
    comparisons = [
        ("quorum queues", "lat-ackwise", ["lat-dramatiq-quorum"]),
        ("classic queues", "lat-ackwise-classic", ["lat-dramatiq"]),
        ("ackwise's quorum vs the peers' own classic", "lat-ackwise", ["lat-celery", "lat-dramatiq"]),
    ]  # fmt: skip
    for label, figures in (("p50", _p50), ("p99", _p99)):
        for what, key, keys in comparisons:
            lat_peers = [c for c in cells if c.key in keys and c.values]
            if key not in by or not lat_peers:
                continue
            a = figures(by[key])
            best_lat = min(lat_peers, key=figures)
            bv = figures(best_lat)
            rows.append(
                f"| latency {label}, concurrency 1, {what} (lower is better) | {by[key].system} "
                f"{a:.2f} ms | {best_lat.system} {bv:.2f} ms | **{a / bv:.2f}x** |"
            )
    return rows


def _p50(c: Cell) -> float:
    return statistics.median(c.values)


def _p99(c: Cell) -> float:
    return statistics.median(c.extra)


def render(
    cells: list[Cell], args: argparse.Namespace, command: str, elapsed: float, b: Broker,
    load: tuple[float, float], head: str, tree: str,
) -> str:  # fmt: skip
    versions = ", ".join(
        f"{d} {_common.version(d)}"
        for d in ("ackwise", "ackwise-rabbitmq", "pika", "celery", "kombu", "amqp", "dramatiq")
    )
    lines = [
        "# RabbitMQ benchmark: ackwise vs Celery, Dramatiq (same run, same RabbitMQ)",
        "",
        *_common.run_header(args.runs, args.tasks, elapsed, load, head, tree),
        "",
        f"Broker: RabbitMQ {b.version}, {b.where}.",
        "",
        f"Versions: {versions}",
        "",
        f"Rerun: `{command}`",
        "",
        *_common.enqueue_table(cells, "one producer thread"),
    ]
    lines += _common.drain_table(cells, args.tasks, "broker")
    lines += _common.latency_table(cells)
    lines += _common.report_end(
        cells,
        _ratio_rows(cells),
        "ackwise / the best peer at equal concurrency",
        "peer",
        args.baseline_note,
        "Method",
        METHOD.replace("(1,000 tasks,", f"({_common.LAT_TASKS:,} tasks a run,"),
    )
    return "\n".join(lines)


METHOD = """
- One broker for every cell (named above): by default a private RabbitMQ node started for
  the run on free ports (`ackwise_conformance.brokers.provide("rabbitmq")`; its management
  plugin is on, with `management.disable_stats`), else the shared node on 5672; each cell runs
  on fresh queues, deleted afterwards.
- **Queue types differ by default**: ackwise declares a quorum queue (replicated log, fsync
  batches) unless the URL says `?queue_type=classic`; Celery and Dramatiq declare durable classic
  queues. Every system publishes persistent messages (`delivery_mode=2`). The `ackwise-classic`
  rows run ackwise on the peers' queue type; the `dramatiq-quorum` latency row runs Dramatiq
  with its queues declared quorum (`x-queue-type`, a subclass of its broker), so that each
  queue type is compared with itself.
- **Publisher confirms**: ackwise always waits for RabbitMQ's confirm (one per `delay()`, one
  per `send_many` chunk, pipelined). Neither peer does by default; their headline rows turn it
  on (Celery `broker_transport_options={"confirm_publish": True}`, Dramatiq
  `RabbitmqBroker(confirm_delivery=True)`), and their defaults are shown as extra rows.
- **Enqueue**: one producer thread, up to the task count or 5 s, after one untimed call that
  connects and declares. The floor is a pika `BlockingChannel` in confirm mode publishing the
  ackwise envelope's bytes (`mandatory`, persistent), one confirm per message.
- **Drain**: the queue is pre-filled (not timed: ackwise with `send_many`; Celery and
  Dramatiq by copying one message their own call published, with fresh task / message ids),
  then ONE worker process: `python -m ackwise worker rabbit_tasks:ackwise_app --pool threads -c
  N` (late ack, default automatic prefetch: 4 x N up to 64 while tasks are short); `celery worker -P prefork -c 1` / `-P threads -c 8`
  with `acks_late`, prefetch multiplier 1, no gossip/mingle/heartbeat; `dramatiq --processes 1
  --threads N` (its default prefetch, 2 x N). Rate = tasks started per second from the first
  start to the last, within at most 10 s of the first. Worker CPU: utime + stime of the worker
  and its children (from `/proc`, every 20 ms) over the same span, per task; broker CPU: the
  same for the RabbitMQ node's process group (shows what each client's protocol use costs the
  broker: on 2 cores the broker and the worker share the machine). After the worker stopped, the
  messages left in the queue must equal the tasks never started (else a warning).
- **Latency**: the worker warmed up, the producer sends one task every 5 ms (1,000 tasks, after
  20 warm-up tasks) with its `time.time()` as the argument, the task records now - sent.
  Concurrency 1 for every system (Celery prefork x1). Producers publish with confirms as above.
- The machine is a shared 2-core VM: compare within a run; rerun a cell with `--only`.
"""


def main() -> int:
    return _common.run_report(
        "rabbitmq",
        "rabbitmq.py",
        "results-rabbitmq.md",
        __doc__,
        plan,
        Broker,
        lambda b: f"RabbitMQ {b.version}: {b.where}",
        render,
    )


if __name__ == "__main__":
    sys.exit(main())
