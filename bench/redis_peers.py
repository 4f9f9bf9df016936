"""Redis benchmark: ackwise vs Celery, Dramatiq and Taskiq (and a raw redis-py LPUSH loop), in one
run, on one private redis-server.  See ``bench/README.md`` for the method.

    uv run --group bench python bench/redis_peers.py [--runs 3] [--tasks 20000]
                                               [--out bench/results-redis.md] [--only PREFIXES]
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

BENCH_DIR = Path(__file__).resolve().parent
# This file is named redis.py: keep its directory off the front of sys.path, or ``import redis``
# (redis-py) would import this script.  The worker-side modules live in bench/redisbench/.
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != BENCH_DIR]
sys.path.insert(0, str(BENCH_DIR / "redisbench"))
import redis  # noqa: E402  (redis-py, cached before bench/ is searched)

sys.path.append(str(BENCH_DIR))

import argparse  # noqa: E402
import asyncio  # noqa: E402
import base64  # noqa: E402
import datetime as dt  # noqa: E402
import importlib.metadata  # noqa: E402
import json  # noqa: E402
import platform  # noqa: E402
import shlex  # noqa: E402
import signal  # noqa: E402
import statistics  # noqa: E402
import subprocess  # noqa: E402
import tempfile  # noqa: E402
import time  # noqa: E402
import uuid  # noqa: E402
from collections.abc import Callable  # noqa: E402
from dataclasses import dataclass, field  # noqa: E402
from typing import Any  # noqa: E402

# The drain figures, CPU sampling and follow loop of the embedded benchmark (same method).
import embedded  # noqa: E402
import startlog  # noqa: E402

from ackwise_conformance.brokers import provide  # noqa: E402

if sys.path[0] == str(BENCH_DIR):  # embedded.py puts bench/ first again
    sys.path.pop(0)
import redis_tasks  # noqa: E402

Drain = embedded.Drain
WINDOW = embedded.WINDOW
#: Enqueue cells stop after this many seconds even when not all tasks were sent.
ENQUEUE_CAP = 5.0
BATCH = 500
#: Latency cells: steady rate, measured tasks, warm-up tasks.
RATE = 200.0
LAT_TASKS = 1000
LAT_WARMUP = 20

WORKER_ENV = {"PYTHONPATH": str(BENCH_DIR / "redisbench")}


# -- the broker -----------------------------------------------------------------------------
class Server:
    """A private redis-server on a free port (no persistence: every system runs on the same)."""

    def __init__(self, tmp: Path) -> None:
        self.handle = provide("redis", tmp_dir=tmp, durable=False)
        self.url = self.handle.url
        self.client = redis.Redis.from_url(self.url)

    def flush(self) -> None:
        self.client.flushall()

    def stop(self) -> None:
        self.client.close()
        self.handle.stop()


# -- enqueue --------------------------------------------------------------------------------
def _timed(send: Callable[[], int], tasks: int) -> float:
    sent = 0
    start = time.perf_counter()
    deadline = start + ENQUEUE_CAP
    while sent < tasks:
        sent += send()
        if time.perf_counter() > deadline:
            break
    return sent / (time.perf_counter() - start)


def _hundred(call: Callable[[], Any]) -> Callable[[], int]:
    def send() -> int:
        for _ in range(100):
            call()
        return 100

    return send


def enq_raw(url: str, queue: str, tasks: int) -> float:
    """The floor: one redis-py LPUSH per call of a body the size of an ackwise envelope."""
    app = redis_tasks.make_ackwise_app(url, queue)
    body = _sample_envelope(app)
    app.close()
    r = redis.Redis.from_url(url)
    r.ping()
    try:
        return _timed(_hundred(lambda: r.lpush(queue, body)), tasks)
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
    noop = app.bench_noop
    noop.delay()  # connect and declare: not timed
    try:
        if batch is None:
            return _timed(_hundred(noop.delay), tasks)

        def many() -> int:
            app.send_many([noop.s() for _ in range(batch)])
            return batch

        return _timed(many, tasks)
    finally:
        app.close()


def enq_celery(url: str, queue: str, tasks: int) -> float:
    app = redis_tasks.make_celery_app(url, queue)
    noop = app.bench_noop
    noop.delay()
    return _timed(_hundred(noop.delay), tasks)


def enq_dramatiq(url: str, queue: str, tasks: int) -> float:
    broker = redis_tasks.make_dramatiq_broker(url, queue)
    noop = broker.bench_noop
    noop.send()
    try:
        return _timed(_hundred(noop.send), tasks)
    finally:
        broker.close()


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


def prefill_taskiq(url: str, queue: str, tasks: int) -> None:
    broker = redis_tasks.make_taskiq_broker(url, queue)

    async def run() -> None:
        await broker.startup()
        for i in range(0, tasks, BATCH):
            await asyncio.gather(*(broker.bench_noop.kiq() for _ in range(min(BATCH, tasks - i))))
        await broker.shutdown()

    asyncio.run(run())


# -- workers --------------------------------------------------------------------------------
def worker_cmd(system: str, config: str, concurrency: int) -> list[str]:
    py = sys.executable
    if system == "ackwise":
        return [
            *(py, "-m", "ackwise", "--loglevel", "WARNING", "worker"),
            *("redis_tasks:ackwise_app", "--pool", config, "-c", str(concurrency)),
        ]
    if system == "celery":
        return [
            *(py, "-m", "celery", "-A", "redis_tasks:celery_app", "worker", "-l", "WARNING"),
            *("-P", config, "-c", str(concurrency), "--prefetch-multiplier", "1"),
            *("--without-gossip", "--without-mingle", "--without-heartbeat"),
        ]
    if system == "dramatiq":
        return [
            *(py, "-m", "dramatiq", "redis_tasks:dramatiq_broker", "--processes", "1"),
            *("--threads", str(concurrency), "--skip-logging"),
        ]
    if system == "ackwise-adapter":  # diagnostic: the adapter's receive loop, no worker
        return [py, str(BENCH_DIR / "redisbench" / "adapter_loop.py")]
    if system == "taskiq":
        return [
            *(py, "-m", "taskiq", "worker", "redis_tasks:taskiq_broker", "--workers", "1"),
            *("--max-async-tasks", str(concurrency), "--ack-type", "when_executed"),
            *("--log-level", "WARNING"),
        ]
    raise ValueError(system)


def start_worker(
    system: str, config: str, concurrency: int, url: str, queue: str, cell: Path
) -> tuple[subprocess.Popen[bytes], Path, Path]:
    starts = cell / "starts"
    starts.mkdir(parents=True)
    env = dict(os.environ)
    env.update(WORKER_ENV)
    env.update(
        REDIS_BENCH_URL=url,
        REDIS_BENCH_QUEUE=queue,
        REDIS_BENCH_SYSTEM=system,
        BENCH_STARTS_DIR=str(starts),
    )
    log_path = cell / "worker.log"
    with open(log_path, "wb") as log:
        proc = subprocess.Popen(
            worker_cmd(system, config, concurrency),
            cwd=cell,
            env=env,
            stdout=log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
        )
    return proc, starts, log_path


def stop_worker(proc: subprocess.Popen[bytes]) -> None:
    """SIGTERM, a few seconds' grace, then SIGKILL the whole process group (pool children).

    Everything measured was flushed to the starts directory before this is called.
    """
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            pass
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    proc.wait()


def drain(
    server: Server, system: str, config: str, concurrency: int, tasks: int, cell: Path
) -> Drain:
    server.flush()
    queue = f"drain-{uuid.uuid4().hex[:8]}"
    PREFILL[system](server.url, queue, tasks)
    proc, starts, log_path = start_worker(system, config, concurrency, server.url, queue, cell)
    try:
        with embedded.CpuSampler(proc.pid) as sampler:
            embedded._follow(
                lambda: startlog.count_dir(str(starts)),
                tasks,
                lambda: proc.poll() is None,
                f"{system} {config} x{concurrency}",
            )
            time.sleep(3 * startlog.FLUSH_EVERY)
    except BaseException:
        sys.stderr.write(log_path.read_text(errors="replace")[-3000:])
        raise
    finally:
        stop_worker(proc)
    result = embedded.drain_figures(startlog.read_dir(str(starts)), sampler.samples)
    if system == "ackwise":
        adapter = redis_tasks.make_ackwise_app(server.url, queue).adapter()
        adapter.open()
        st = adapter.stats(queue)
        adapter.close()
        result.left = st.ready + st.delayed + st.in_flight
    return result


PREFILL: dict[str, Callable[[str, str, int], None]] = {
    "ackwise": prefill_ackwise,
    "celery": prefill_celery,
    "dramatiq": prefill_dramatiq,
    "taskiq": prefill_taskiq,
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
        elif system == "ackwise-adapter":
            import ackwise

            adapter = ackwise.open_adapter(url)
            adapter.open()
            adapter.declare(ackwise.QueueSpec(queue))
            self.app = adapter

            def send(sent: float) -> None:
                adapter.publish(queue, [ackwise.Outgoing(uuid.uuid4().hex, repr(sent).encode())])

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


def latency(server: Server, system: str, config: str, cell: Path) -> tuple[float, float, float]:
    """Return (p50 ms, p99 ms, achieved send rate) at a steady RATE, concurrency 1."""
    server.flush()
    queue = f"lat-{uuid.uuid4().hex[:8]}"
    sender = _Sender(system, server.url, queue)
    proc, starts, log_path = start_worker(system, config, 1, server.url, queue, cell)
    try:
        # Warm up: until the worker runs tasks, then LAT_WARMUP more.
        deadline = time.monotonic() + 60
        while startlog.count_dir(str(starts)) == 0:
            if time.monotonic() > deadline or proc.poll() is not None:
                raise RuntimeError(f"{system}: the worker did not start tasks")
            sender.send(-1.0)
            time.sleep(0.1)
        for _ in range(LAT_WARMUP):
            sender.send(-1.0)
            time.sleep(1 / RATE)
        warm = startlog.count_dir(str(starts))
        time.sleep(0.2)
        warm = startlog.count_dir(str(starts))
        step = 1.0 / RATE
        t0 = time.perf_counter() + 0.01
        for i in range(LAT_TASKS):
            target = t0 + i * step
            while (pause := target - time.perf_counter()) > 0:
                time.sleep(pause)
            sender.send(time.time())
        rate = LAT_TASKS / (time.perf_counter() - t0)
        embedded._follow(
            lambda: startlog.count_dir(str(starts)) - warm,
            LAT_TASKS,
            lambda: proc.poll() is None,
            f"{system} latency",
        )
        time.sleep(3 * startlog.FLUSH_EVERY)
    except BaseException:
        sys.stderr.write(log_path.read_text(errors="replace")[-3000:])
        raise
    finally:
        stop_worker(proc)
        sender.close()
    values = sorted(v for v in startlog.read_dir(str(starts)) if v >= 0)
    if len(values) < LAT_TASKS * 0.99:
        raise RuntimeError(f"{system}: only {len(values)} latency samples")
    p50 = values[len(values) // 2] * 1000
    p99 = values[min(len(values) - 1, int(len(values) * 0.99))] * 1000
    return p50, p99, rate


# -- the plan -------------------------------------------------------------------------------
@dataclass
class Cell:
    key: str
    kind: str  # enqueue, drain, latency
    system: str
    config: str
    run: Callable[[Server, Path, int], Any]
    values: list[float] = field(default_factory=list)
    cpu: list[float] = field(default_factory=list)
    p99: list[float] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    @property
    def median(self) -> float:
        return statistics.median(self.values)


def plan() -> list[Cell]:
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
    ]  # fmt: skip
    drains = [
        ("ackwise", "threads", 1, "threads x1, late ack, prefetch auto"),
        ("celery", "prefork", 1, "prefork x1, acks_late, prefetch x1"),
        ("dramatiq", "threads", 1, "threads x1"),
        ("taskiq", "async", 1, "async x1, streams, ack when executed"),
        ("ackwise", "threads", 8, "threads x8, late ack, prefetch auto"),
        ("celery", "threads", 8, "threads x8, acks_late, prefetch x1"),
        ("dramatiq", "threads", 8, "threads x8"),
        ("taskiq", "async", 8, "async x8, streams, ack when executed"),
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
    lat = [
        ("ackwise", "threads", "threads x1"),
        ("celery", "prefork", "prefork x1, acks_late, prefetch x1"),
        ("dramatiq", "threads", "threads x1"),
        ("taskiq", "async", "async x1, streams"),
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
def _version(dist: str) -> str:
    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return "?"


def _fmt(x: float) -> str:
    return f"{x:,.0f}"


def render(
    cells: list[Cell], args: argparse.Namespace, command: str, elapsed: float, server: str
) -> str:
    by = {c.key: c for c in cells if c.values}
    lines = [
        "# Redis benchmark: ackwise vs Celery, Dramatiq, Taskiq (same run, same Redis)",
        "",
        f"Run {dt.datetime.now(dt.UTC).strftime('%Y-%m-%d %H:%M UTC')}, git "
        f"{embedded._git('rev-parse', '--short', 'HEAD')}, {platform.python_implementation()} "
        f"{platform.python_version()}, {os.cpu_count()} CPUs ({embedded._cpu_model()}), "
        f"{server}; {args.runs} run(s) per cell, {args.tasks:,} tasks, {elapsed / 60:.1f} min.",
        "",
        "Versions: "
        + ", ".join(
            f"{d} {_version(d)}"
            for d in (
                "ackwise",
                "redis",
                "hiredis",
                "celery",
                "kombu",
                "dramatiq",
                "taskiq",
                "taskiq-redis",
            )
        ),
        "",
        f"Rerun: `{command}`",
        "",
        "## Enqueue, one producer (tasks/s, median)",
        "",
        "| system | how | tasks/s | runs |",
        "|---|---|---:|---|",
    ]
    for c in cells:
        if c.kind == "enqueue" and c.values:
            lines.append(
                f"| {c.system} | {c.config} | {_fmt(c.median)} | "
                + ", ".join(_fmt(v) for v in c.values)
                + " |"
            )
    lines += [
        "",
        "## Drain, 20,000 no-op tasks, one worker process (tasks started/s, median)",
        "",
        "| system | config | tasks/s | worker CPU µs/task | runs |",
        "|---|---|---:|---:|---|",
    ]
    for c in cells:
        if c.kind == "drain" and c.values:
            cpu = f"{statistics.median(c.cpu):,.0f}" if c.cpu else "?"
            lines.append(
                f"| {c.system} | {c.config} | {_fmt(c.median)} | {cpu} | "
                + ", ".join(_fmt(v) for v in c.values)
                + " |"
            )
    lines += [
        "",
        f"## Enqueue -> start latency at a steady {RATE:.0f} tasks/s, concurrency 1 (ms, median of runs)",
        "",
        "| system | config | p50 | p99 | runs (p50 / p99) |",
        "|---|---|---:|---:|---|",
    ]
    for c in cells:
        if c.kind == "latency" and c.values:
            lines.append(
                f"| {c.system} | {c.config} | {c.median:.2f} | {statistics.median(c.p99):.2f} | "
                + ", ".join(f"{a:.2f} / {b:.2f}" for a, b in zip(c.values, c.p99, strict=True))
                + " |"
            )
    lines += [
        "",
        "## Targets (issue 4)",
        "",
        "| target | measured | ratio | met |",
        "|---|---|---:|---|",
    ]

    def ratio_row(name: str, num: str, den: list[str], want: float, lower: bool = False) -> None:
        if num not in by or not [d for d in den if d in by]:
            return
        a = by[num]
        dens = [by[d] for d in den if d in by]
        if lower:
            best = min(dens, key=lambda c: statistics.median(c.p99))
            av, bv = statistics.median(a.p99), statistics.median(best.p99)
            r = av / bv
            ok = av < bv
            lines.append(
                f"| {name} | ackwise {av:.2f} ms vs {best.system} {bv:.2f} ms | "
                f"{r:.2f}x | {'yes' if ok else 'NO'} |"
            )
            return
        best = max(dens, key=lambda c: c.median)
        r = a.median / best.median
        lines.append(
            f"| {name} | ackwise {_fmt(a.median)} vs {best.system} {_fmt(best.median)} | "
            f"{r:.2f}x | {'yes' if r >= want else 'NO'} (>= {want}x) |"
        )

    ratio_row("single-call enqueue >= 80% of raw LPUSH", "enq-ackwise", ["enq-raw"], 0.8)
    ratio_row(
        "drain c=8 >= 3x the best peer",
        "drain-ackwise-8",
        ["drain-celery-8", "drain-dramatiq-8", "drain-taskiq-8"],
        3.0,
    )
    ratio_row(
        "drain c=1 >= 3x the best peer",
        "drain-ackwise-1",
        ["drain-celery-1", "drain-dramatiq-1", "drain-taskiq-1"],
        3.0,
    )
    ratio_row(
        "p99 latency below every peer's",
        "lat-ackwise",
        ["lat-celery", "lat-dramatiq", "lat-taskiq"],
        1.0,
        lower=True,
    )
    notes = [n for c in cells for n in c.notes]
    if notes:
        lines += ["", "## Warnings", ""] + [f"- {n}" for n in notes]
    lines.append("")
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--tasks", type=int, default=20_000)
    parser.add_argument("--out", default=str(BENCH_DIR / "results-redis.md"))
    parser.add_argument("--only", default="", help="comma-separated prefixes of cell keys")
    args = parser.parse_args()
    command = " ".join(
        ["uv run --group bench python bench/redis_peers.py", shlex.join(sys.argv[1:])]
    ).strip()
    cells = plan()
    if args.only:
        prefixes = [p.strip() for p in args.only.split(",") if p.strip()]
        cells = [c for c in cells if any(c.key.startswith(p) for p in prefixes)]
    started = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="ackwise-bench-redis-") as tmp:
        server = Server(Path(tmp) / "redis")
        info = server.client.info("server")
        where = (
            f"private redis-server {info['redis_version']} on a free port "
            f"(no persistence; flushed between cells)"
        )
        try:
            for run in range(1, args.runs + 1):
                for c in cells:
                    cell_dir = Path(tmp) / f"{c.key}-{run}"
                    cell_dir.mkdir()
                    t = time.monotonic()
                    result = c.run(server, cell_dir, args.tasks)
                    if isinstance(result, Drain):
                        c.values.append(result.rate)
                        if result.cpu_us is not None:
                            c.cpu.append(result.cpu_us)
                        if result.started > args.tasks:
                            c.notes.append(
                                f"{c.key} run {run}: {result.started} starts for "
                                f"{args.tasks} tasks (duplicates)"
                            )
                        if result.left is not None and result.left != args.tasks - result.started:
                            c.notes.append(
                                f"{c.key} run {run}: {result.left} left in the queue, "
                                f"{args.tasks - result.started} never started"
                            )
                        shown = f"{result.rate:,.0f}/s cpu {result.cpu_us or 0:.0f}µs"
                    elif isinstance(result, tuple):
                        p50, p99, rate = result
                        c.values.append(p50)
                        c.p99.append(p99)
                        shown = f"p50 {p50:.2f} ms p99 {p99:.2f} ms (sent at {rate:.0f}/s)"
                    else:
                        c.values.append(result)
                        shown = f"{result:,.0f}/s"
                    print(
                        f"run {run} {c.key:<22} {shown}  ({time.monotonic() - t:.1f}s)",
                        file=sys.stderr,
                        flush=True,
                    )
        finally:
            server.stop()
    text = render(cells, args, command, time.monotonic() - started, where)
    Path(args.out).write_text(text)
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
