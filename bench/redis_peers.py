"""Redis benchmark: ackwise vs Celery, Dramatiq and Taskiq (and a raw redis-py LPUSH loop), in one
run, on one private redis-server.  See ``bench/README.md`` for the method.

    uv run --group bench python bench/redis_peers.py [--runs 3] [--tasks 20000]
                                                     [--out bench/results-redis.md] [--only PREFIXES]
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import datetime as dt
import json
import os
import platform
import statistics
import sys
import tempfile
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import _common  # embedded.Drain, startlog, CPU sampling: the shared method
import embedded
import redis
from _common import Cell, Drain
from redisbench import redis_tasks

from ackwise_conformance.brokers import provide

BENCH_DIR = Path(__file__).resolve().parent
#: Enqueue cells stop after this many seconds even when not all tasks were sent.
ENQUEUE_CAP = 5.0
BATCH = 500

WORKER_ENV = _common.worker_env("redisbench")


# -- the broker -----------------------------------------------------------------------------
class Server:
    """A private redis-server on a free port (no persistence: every system runs on the same)."""

    def __init__(self, tmp: Path) -> None:
        self.handle = provide("redis", tmp_dir=tmp, durable=False)
        self.url = self.handle.url
        self.client = redis.Redis.from_url(self.url)
        self.pid = _common.server_pid(self.handle)  # redis-server (bench/scaling.py samples it)

    def flush(self) -> None:
        self.client.flushall()

    def left(self, queue: str) -> int:
        """ackwise's tasks still waiting or in flight in ``queue`` (after the worker stopped)."""
        adapter = redis_tasks.make_ackwise_app(self.url, queue).adapter()
        adapter.open()
        try:
            st = adapter.stats(queue)
        finally:
            adapter.close()
        return st.ready + st.delayed + st.in_flight

    def stop(self) -> None:
        self.client.close()
        self.handle.stop()


# -- enqueue --------------------------------------------------------------------------------
def enq_raw(url: str, queue: str, tasks: int) -> float:
    """The floor: one redis-py LPUSH per call of a body the size of an ackwise envelope."""
    app = redis_tasks.make_ackwise_app(url, queue)
    body = _sample_envelope(app)
    app.close()
    r = redis.Redis.from_url(url)
    r.ping()
    try:
        return _common.timed(_common.hundred(lambda: r.lpush(queue, body)), tasks, ENQUEUE_CAP)
    finally:
        r.close()


def _sample_envelope(app: Any) -> bytes:
    adapter = app.adapter()
    adapter.open()
    q = "sample"
    app.bench_noop.apply_async(queue=q)
    (d,) = adapter.receive(q, max_messages=1, wait=1.0, lease=5.0)
    adapter.ack([d])
    adapter.close()
    return bytes(d.body)


def enq_ackwise(url: str, queue: str, tasks: int, batch: int | None) -> float:
    app = redis_tasks.make_ackwise_app(url, queue)
    return _common.enqueue_ackwise(app, tasks, batch, ENQUEUE_CAP)


def enq_celery(url: str, queue: str, tasks: int) -> float:
    app = redis_tasks.make_celery_app(url, queue)
    noop = app.bench_noop
    noop.delay()
    return _common.timed(_common.hundred(noop.delay), tasks, ENQUEUE_CAP)


def enq_dramatiq(url: str, queue: str, tasks: int) -> float:
    broker = redis_tasks.make_dramatiq_broker(url, queue)
    noop = broker.bench_noop
    noop.send()
    try:
        return _common.timed(_common.hundred(noop.send), tasks, ENQUEUE_CAP)
    finally:
        broker.close()


def enq_huey(url: str, queue: str, tasks: int) -> float:
    huey = redis_tasks.make_huey(url, queue)
    noop = huey.bench_noop
    noop()
    return _common.timed(_common.hundred(noop), tasks, ENQUEUE_CAP)


def enq_taskiq(url: str, queue: str, tasks: int) -> float:
    broker = redis_tasks.make_taskiq_broker(url, queue)
    noop = broker.bench_noop

    async def run() -> float:
        await broker.startup()
        await noop.kiq()
        sent = 0
        start = time.perf_counter()
        deadline = start + ENQUEUE_CAP
        while sent < tasks:
            for _ in range(100):
                await noop.kiq()  # one awaited call per task, like the others
            sent += 100
            if time.perf_counter() > deadline:
                break
        rate = sent / (time.perf_counter() - start)
        await broker.shutdown()
        return rate

    return asyncio.run(run())


# -- prefill (not measured) -----------------------------------------------------------------
def prefill_ackwise(url: str, queue: str, tasks: int) -> None:
    app = redis_tasks.make_ackwise_app(url, queue)
    for i in range(0, tasks, BATCH):
        app.send_many([app.bench_noop.s() for _ in range(min(BATCH, tasks - i))])
    app.close()


def prefill_celery(url: str, queue: str, tasks: int) -> None:
    """Publish one task through Celery, then copy its raw message with fresh ids (fast)."""
    app = redis_tasks.make_celery_app(url, queue)
    app.bench_noop.delay()
    r = redis.Redis.from_url(url)
    raw = r.rpop(queue)
    assert raw is not None, "celery published nowhere"
    template = json.loads(raw)
    pipe = r.pipeline(transaction=False)
    for i in range(tasks):
        m = json.loads(raw)
        tid = str(uuid.uuid4())
        m["headers"]["id"] = m["headers"]["root_id"] = tid
        m["properties"]["correlation_id"] = tid
        m["properties"]["delivery_tag"] = str(uuid.uuid4())
        pipe.lpush(queue, json.dumps(m))
        if i % 1000 == 999:
            pipe.execute()
    pipe.execute()
    r.close()
    assert template["properties"]["body_encoding"] == "base64"
    base64.b64decode(template["body"])  # the body is shared: same args for every copy


def prefill_dramatiq(url: str, queue: str, tasks: int) -> None:
    broker = redis_tasks.make_dramatiq_broker(url, queue)
    for _ in range(tasks):
        broker.bench_noop.send()
    broker.close()


def prefill_huey(url: str, queue: str, tasks: int) -> None:
    """Serialize one Huey task message per task (fresh ids) and push them in pipelines."""
    huey = redis_tasks.make_huey(url, queue)
    r = redis.Redis.from_url(url)
    pipe = r.pipeline(transaction=False)
    for i in range(tasks):
        pipe.lpush(huey.storage.queue_key, huey.serialize_task(huey.bench_noop.s()))
        if i % 1000 == 999:
            pipe.execute()
    pipe.execute()
    r.close()


def prefill_taskiq(url: str, queue: str, tasks: int) -> None:
    broker = redis_tasks.make_taskiq_broker(url, queue)

    async def run() -> None:
        await broker.startup()
        for i in range(0, tasks, BATCH):
            await asyncio.gather(*(broker.bench_noop.kiq() for _ in range(min(BATCH, tasks - i))))
        await broker.shutdown()

    asyncio.run(run())


# -- workers --------------------------------------------------------------------------------
def worker_cmd(system: str, config: str, concurrency: int, python: str | None = None) -> list[str]:
    py = sys.executable
    if system == "ackwise-adapter":  # diagnostic: the adapter's receive loop, no worker
        return [py, str(BENCH_DIR / "redisbench" / "adapter_loop.py")]
    if system == "huey":
        return [
            *(py, "-m", "huey.bin.huey_consumer", "redis_tasks.huey_app"),
            *("-k", "thread", "-w", str(concurrency), "-q"),
        ]
    if system == "taskiq":
        return [
            *(py, "-m", "taskiq", "worker", "redis_tasks:taskiq_broker", "--workers", "1"),
            *("--max-async-tasks", str(concurrency), "--ack-type", "when_executed"),
            *("--log-level", "WARNING"),
        ]
    return _common.worker_cmd("redis_tasks", system, config, concurrency, python)


def start_worker(
    system: str,
    config: str,
    concurrency: int,
    url: str,
    queue: str,
    cell: Path,
    python: str | None = None,
) -> _common.WorkerProc:
    env = dict(WORKER_ENV)
    env.update(REDIS_BENCH_URL=url, REDIS_BENCH_QUEUE=queue, REDIS_BENCH_SYSTEM=system)
    return _common.start_worker(worker_cmd(system, config, concurrency, python), env, cell)


def drain(
    server: Server,
    system: str,
    config: str,
    concurrency: int,
    tasks: int,
    cell: Path,
    python: str | None = None,
) -> tuple[Drain, None]:
    server.flush()
    queue = f"drain-{uuid.uuid4().hex[:8]}"
    PREFILL[system](server.url, queue, tasks)
    w = start_worker(system, config, concurrency, server.url, queue, cell, python)
    result, _ = _common.follow_drain(w, tasks, f"{system} {config} x{concurrency}")
    if system == "ackwise":
        result.left = server.left(queue)
    return result, None  # the broker's CPU is not sampled here


PREFILL: dict[str, Callable[[str, str, int], None]] = {
    "ackwise": prefill_ackwise,
    "celery": prefill_celery,
    "dramatiq": prefill_dramatiq,
    "taskiq": prefill_taskiq,
    "huey": prefill_huey,
}


# -- latency --------------------------------------------------------------------------------
class _Sender:
    """One enqueue call per task, with the send time as the task's argument."""

    def __init__(self, system: str, url: str, queue: str) -> None:
        self.system = system
        self.loop: asyncio.AbstractEventLoop | None = None
        if system == "ackwise":
            self.app = redis_tasks.make_ackwise_app(url, queue)
            self.send: Callable[[float], Any] = self.app.bench_noop.delay
        elif system == "celery":
            self.app = redis_tasks.make_celery_app(url, queue)
            self.send = self.app.bench_noop.delay
        elif system == "dramatiq":
            self.app = redis_tasks.make_dramatiq_broker(url, queue)
            self.send = self.app.bench_noop.send
        elif system == "huey":
            self.app = redis_tasks.make_huey(url, queue)
            self.send = self.app.bench_noop
        elif system == "ackwise-adapter":
            import ackwise
            from ackwise.spi import Outgoing, QueueSpec

            adapter = ackwise.open_adapter(url)
            adapter.open()
            adapter.declare(QueueSpec(queue))
            self.app = adapter

            def send(sent: float) -> None:
                adapter.publish(queue, [Outgoing(uuid.uuid4().hex, repr(sent).encode())])

            self.send = send
        else:
            self.app = redis_tasks.make_taskiq_broker(url, queue)
            self.loop = asyncio.new_event_loop()
            self.loop.run_until_complete(self.app.startup())
            noop = self.app.bench_noop
            loop = self.loop
            self.send = lambda sent: loop.run_until_complete(noop.kiq(sent))

    def close(self) -> None:
        if self.system == "ackwise" or self.system == "dramatiq":
            self.app.close()
        elif self.system == "taskiq":
            assert self.loop is not None
            self.loop.run_until_complete(self.app.shutdown())
            self.loop.close()


def latency(server: Server, system: str, config: str, cell: Path) -> tuple[float, ...]:
    """Return (p50 ms, p99 ms, achieved send rate) at a steady RATE, concurrency 1."""
    server.flush()
    queue = f"lat-{uuid.uuid4().hex[:8]}"
    sender = _Sender(system, server.url, queue)
    try:
        w = start_worker(system, config, 1, server.url, queue, cell)
        return _common.measure_latency(w, sender.send, f"{system} latency")
    finally:
        sender.close()


# -- the plan -------------------------------------------------------------------------------
def plan(baseline: str | None = None) -> list[Cell]:
    """Every cell; with ``baseline`` (``--baseline``'s interpreter) ackwise's drains twice."""

    def q() -> str:
        return f"enq-{uuid.uuid4().hex[:8]}"

    cells = [
        Cell("enq-raw", "enqueue", "redis-py", "`LPUSH`, one call per message (the floor)",
             lambda s, c, n: enq_raw(s.url, q(), n)),
        Cell("enq-ackwise", "enqueue", "ackwise", "`delay()`, one call per task",
             lambda s, c, n: enq_ackwise(s.url, q(), n, None)),
        Cell("enq-ackwise-batch", "enqueue", "ackwise", f"`send_many`, chunks of {BATCH}",
             lambda s, c, n: enq_ackwise(s.url, q(), n, BATCH)),
        Cell("enq-celery", "enqueue", "celery", "`delay()`, one call per task",
             lambda s, c, n: enq_celery(s.url, q(), n)),
        Cell("enq-dramatiq", "enqueue", "dramatiq", "`send()`, one call per task",
             lambda s, c, n: enq_dramatiq(s.url, q(), n)),
        Cell("enq-taskiq", "enqueue", "taskiq", "`await kiq()`, one call per task (streams)",
             lambda s, c, n: enq_taskiq(s.url, q(), n)),
        Cell("enq-huey", "enqueue", "huey", "calling the task, one call per task",
             lambda s, c, n: enq_huey(s.url, q(), n)),
    ]  # fmt: skip
    drains = [
        ("ackwise", "threads", 1, "threads x1, late ack, prefetch auto"),
        ("celery", "prefork", 1, "prefork x1, acks_late, prefetch x1"),
        ("dramatiq", "threads", 1, "threads x1"),
        ("taskiq", "async", 1, "async x1, streams, ack when executed"),
        ("huey", "thread", 1, "thread x1, at most once (no ack)"),
        ("ackwise", "threads", 8, "threads x8, late ack, prefetch auto"),
        ("celery", "threads", 8, "threads x8, acks_late, prefetch x1"),
        ("dramatiq", "threads", 8, "threads x8"),
        ("taskiq", "async", 8, "async x8, streams, ack when executed"),
        ("huey", "thread", 8, "thread x8, at most once (no ack)"),
    ]
    for system, config, c, text in drains:
        cells.append(
            Cell(
                f"drain-{system}-{c}",
                "drain",
                system,
                text,
                lambda s, cell, n, system=system, config=config, c=c: drain(
                    s, system, config, c, n, cell
                ),
            )
        )
        if system == "ackwise" and baseline:
            cells.append(
                Cell(
                    f"drain-{system}-{c}-baseline",
                    "drain",
                    "ackwise-baseline",
                    text,
                    lambda s, cell, n, config=config, c=c: drain(
                        s, "ackwise", config, c, n, cell, baseline
                    ),
                )
            )
    lat = [
        ("ackwise", "threads", "threads x1"),
        ("celery", "prefork", "prefork x1, acks_late, prefetch x1"),
        ("dramatiq", "threads", "threads x1"),
        ("taskiq", "async", "async x1, streams"),
        ("huey", "thread", "thread x1, at most once (no ack)"),
        ("ackwise-adapter", "-", "diagnostic: adapter receive loop alone, no worker"),
    ]
    for system, config, text in lat:
        cells.append(
            Cell(
                f"lat-{system}",
                "latency",
                system,
                text,
                lambda s, cell, n, system=system, config=config: latency(s, system, config, cell),
            )
        )
    return cells


# -- report ---------------------------------------------------------------------------------
def render(
    cells: list[Cell], args: argparse.Namespace, command: str, elapsed: float, server: str
) -> str:
    by = {c.key: c for c in cells if c.values}
    lines = [
        "# Redis benchmark: ackwise vs Celery, Dramatiq, Taskiq, Huey (same run, same Redis)",
        "",
        f"Run {dt.datetime.now(dt.UTC).strftime('%Y-%m-%d %H:%M UTC')}, git "
        f"{embedded.git('rev-parse', '--short', 'HEAD')}, {platform.python_implementation()} "
        f"{platform.python_version()}, {os.cpu_count()} CPUs ({embedded.cpu_model()}), "
        f"{server}; {args.runs} run(s) per cell, {args.tasks:,} tasks, {elapsed / 60:.1f} min.",
        "",
        "Versions: "
        + ", ".join(
            f"{d} {_common.version(d)}"
            for d in (
                "ackwise",
                "redis",
                "hiredis",
                "celery",
                "kombu",
                "dramatiq",
                "taskiq",
                "taskiq-redis",
                "huey",
            )
        ),
        "",
        f"Rerun: `{command}`",
        "",
        *_common.enqueue_table(cells, "one producer"),
    ]
    lines += [
        "",
        "## Drain, 20,000 no-op tasks, one worker process (tasks started/s, median)",
        "",
        "| system | config | tasks/s | worker CPU µs/task | runs |",
        "|---|---|---:|---:|---|",
    ]
    for c in cells:
        if c.kind == "drain" and c.values:
            cpu = c.median_of(c.cpu)
            lines.append(
                f"| {c.system} | {c.config} | {_common.fmt(c.median)} | "
                f"{'?' if cpu is None else _common.fmt(cpu)} | {_common.runs(c.values)} |"
            )
    lines += _common.latency_table(cells)
    lines += [
        "",
        "## Targets (issues 4 and 19)",
        "",
        "At-least-once peers: Celery (acks_late), Dramatiq, Taskiq (ack when executed); Huey acks "
        "nothing (at most once) and is compared on latency only.",
        "",
        "| target | measured | ratio | met |",
        "|---|---|---:|---|",
    ]

    def ratio_row(name: str, num: str, den: list[str], want: float, lower: bool = False) -> None:
        """``num`` against the best of ``den``: at least ``want`` times its rate, or (``lower``:
        p99 latencies) at most ``want`` times its p99 (``want`` 1.0: strictly below it)."""
        if num not in by or not [d for d in den if d in by]:
            return
        a = by[num]
        dens = [by[d] for d in den if d in by]
        if lower:
            best = min(dens, key=lambda c: statistics.median(c.extra))
            av, bv = statistics.median(a.extra), statistics.median(best.extra)
            r = av / bv
            ok = r <= want if want != 1.0 else av < bv
            lines.append(
                f"| {name} | ackwise {av:.2f} ms vs {best.system} {bv:.2f} ms | "
                f"{r:.2f}x | {'yes' if ok else 'NO'} |"
            )
            return
        best = max(dens, key=lambda c: c.median)
        r = a.median / best.median
        lines.append(
            f"| {name} | ackwise {_common.fmt(a.median)} vs {best.system} {_common.fmt(best.median)} | "
            f"{r:.2f}x | {'yes' if r >= want else 'NO'} (>= {want}x) |"
        )

    ratio_row("single-call enqueue >= 80% of raw LPUSH", "enq-ackwise", ["enq-raw"], 0.8)
    ratio_row(
        "drain c=1 >= 5x the best at-least-once peer",
        "drain-ackwise-1",
        ["drain-celery-1", "drain-dramatiq-1", "drain-taskiq-1"],
        5.0,
    )
    ratio_row(
        "drain c=8 >= 10x the best at-least-once peer",
        "drain-ackwise-8",
        ["drain-celery-8", "drain-dramatiq-8", "drain-taskiq-8"],
        10.0,
    )
    cpu = (
        by["drain-ackwise-1"].median_of(by["drain-ackwise-1"].cpu)
        if "drain-ackwise-1" in by
        else None
    )
    if cpu is not None:
        lines.append(
            f"| worker CPU at c=1 <= 60 µs/task | ackwise {cpu:.0f} µs | - | "
            f"{'yes' if cpu <= 60 else 'NO'} |"
        )
    ratio_row("p99 latency <= 1.2x Huey's", "lat-ackwise", ["lat-huey"], 1.2, lower=True)
    ratio_row(
        "p99 latency below every at-least-once peer's",
        "lat-ackwise",
        ["lat-celery", "lat-dramatiq", "lat-taskiq"],
        1.0,
        lower=True,
    )
    lines += _common.baseline_section(
        cells, args.baseline_note, ["drain-ackwise-1", "drain-ackwise-8"]
    )
    notes = [n for c in cells for n in c.notes]
    if notes:
        lines += ["", "## Warnings", ""] + [f"- {n}" for n in notes]
    lines.append("")
    return "\n".join(lines)


def main() -> int:
    args, command = _common.parse_args(
        __doc__.splitlines()[0], "redis_peers.py", "results-redis.md"
    )
    cells = _common.select(plan(args.baseline), args.only)
    started = time.monotonic()
    load_start = os.getloadavg()[0]
    with tempfile.TemporaryDirectory(prefix="ackwise-bench-redis-") as tmp:
        server = Server(Path(tmp) / "redis")
        info = server.client.info("server")
        where = (
            f"private redis-server {info['redis_version']} on a free port "
            f"(no persistence; flushed between cells)"
        )
        try:
            _common.run_cells(cells, server, Path(tmp), args.runs, args.tasks, width=22)
        finally:
            server.stop()
    where += f"; load average {load_start:.2f} at the start, {os.getloadavg()[0]:.2f} at the end"
    text = render(cells, args, command, time.monotonic() - started, where)
    Path(args.out).write_text(text)
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
