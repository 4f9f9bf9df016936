"""SQS benchmark: ackwise vs Celery's SQS transport, in one run, on one moto server.

    uv run --group bench python bench/sqs.py [--runs 3] [--tasks 300] [--out bench/results-sqs.md]

Per run and system: enqueue ``--tasks`` no-op tasks, one ``delay()`` call per task (tasks/s);
then one worker process drains them (tasks started per second, first to last start, read from
a file the tasks append to, so the driver asks SQS nothing meanwhile); SQS API calls are counted
at the moto server (its request log) over the enqueue and over the drain.  Medians of the runs.
moto's request cost grows with queue depth (PEERS.md), so the figures measure moto as much as
the clients, and the queue is kept shallow.
"""

from __future__ import annotations

import argparse
import datetime as dt
import os
import platform
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from dataclasses import dataclass
from pathlib import Path

BENCH_DIR = Path(__file__).resolve().parent
sys.path.insert(0, str(BENCH_DIR / "sqsbench"))
for _name, _value in (
    ("AWS_ACCESS_KEY_ID", "testing"),
    ("AWS_SECRET_ACCESS_KEY", "testing"),
    ("AWS_DEFAULT_REGION", "us-east-1"),
):
    os.environ.setdefault(_name, _value)

from ackwise import App  # noqa: E402
from ackwise_conformance.brokers import BrokerHandle, provide  # noqa: E402

QUEUE = "bench"
DRAIN_TIMEOUT = 300.0
CELERY = "celery, threads x8, defaults (early ack, prefetch x4)"
CELERY_LATE = "celery, prefork x1, acks_late, prefetch x1"
SYSTEMS = ("ackwise", CELERY, CELERY_LATE)


@dataclass
class Cell:
    enqueue_rate: float
    enqueue_calls: float  # API calls per task while enqueueing
    drain_rate: float
    drain_calls: float  # API calls per task while draining


def requests(handle: BrokerHandle) -> int:
    """Requests moto has answered so far (werkzeug logs one line per request)."""
    log = handle._server.log_path  # type: ignore[union-attr]
    return sum(1 for line in log.read_text(errors="replace").splitlines() if '"POST ' in line)


def _wait_starts(path: Path, n: int, proc: subprocess.Popen[bytes]) -> list[float]:
    deadline = time.monotonic() + DRAIN_TIMEOUT
    while time.monotonic() < deadline:
        if path.exists():
            starts = [float(x) for x in path.read_text().split()]
            if len(starts) >= n:
                return starts
        if proc.poll() is not None:
            raise RuntimeError(f"worker exited with {proc.returncode}")
        time.sleep(0.05)
    raise TimeoutError(f"{n} tasks did not start within {DRAIN_TIMEOUT}s")


def _rate(starts: list[float]) -> float:
    starts = sorted(starts)
    return (len(starts) - 1) / max(starts[-1] - starts[0], 1e-9)


def _stop(proc: subprocess.Popen[bytes]) -> None:
    proc.send_signal(signal.SIGTERM)
    try:
        proc.wait(30)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(10)


def run_ackwise(handle: BrokerHandle, n: int, tmp: Path) -> Cell:
    prefix = f"a{uuid.uuid4().hex[:8]}-"
    url = f"{handle.url}&prefix={prefix}"
    starts = tmp / f"{prefix}starts"
    app = App("bench-sqs", broker=url)

    @app.task(name="bench.noop", queue=QUEUE)
    def noop(i: int) -> None:
        pass

    noop.delay(-1)  # declares the queue; drained with the rest
    before = requests(handle)
    t0 = time.perf_counter()
    for i in range(n - 1):
        noop.delay(i)
    enqueue = (n - 1) / (time.perf_counter() - t0)
    enqueue_calls = (requests(handle) - before) / (n - 1)
    app.close()
    env = {
        **os.environ,
        "PYTHONPATH": str(BENCH_DIR / "sqsbench"),
        "BENCH_SQS_ACKWISE_URL": url,
        "BENCH_SQS_STARTS": str(starts),
        "BENCH_SQS_QUEUE": QUEUE,
    }
    before = requests(handle)
    proc = subprocess.Popen(
        [
            *(sys.executable, "-m", "ackwise", "--loglevel", "WARNING", "worker", "sqs_tasks:app"),
            *("-Q", QUEUE, "--pool", "threads", "-c", "8", "--lease", "30"),
        ],
        env=env,
        stdin=subprocess.DEVNULL,
    )
    try:
        got = _wait_starts(starts, n, proc)
        # The last acks and the idle poll after them belong to the drain too.
        time.sleep(1.0)
    finally:
        _stop(proc)
    return Cell(enqueue, enqueue_calls, _rate(got), (requests(handle) - before) / n)


def run_celery(handle: BrokerHandle, n: int, tmp: Path, *, late: bool = False) -> Cell:
    prefix = f"c{uuid.uuid4().hex[:8]}-"
    starts = tmp / f"{prefix}starts"
    port = handle.port
    celery_url = f"sqs://testing:testing@127.0.0.1:{port}"
    os.environ.update(
        BENCH_SQS_CELERY_URL=celery_url,
        BENCH_SQS_CELERY_PREFIX=prefix,
        BENCH_SQS_QUEUE=QUEUE,
        BENCH_SQS_STARTS=str(starts),
        BENCH_SQS_CELERY_LATE="1" if late else "",
    )
    import importlib

    import sqs_tasks

    importlib.reload(sqs_tasks)
    task = sqs_tasks.celery_noop
    task.delay(-1)  # creates the queue
    before = requests(handle)
    t0 = time.perf_counter()
    for i in range(n - 1):
        task.delay(i)
    enqueue = (n - 1) / (time.perf_counter() - t0)
    enqueue_calls = (requests(handle) - before) / (n - 1)
    env = {**os.environ, "PYTHONPATH": str(BENCH_DIR / "sqsbench")}
    before = requests(handle)
    proc = subprocess.Popen(
        [
            *(sys.executable, "-m", "celery", "-A", "sqs_tasks:celery_app", "worker"),
            *("-l", "WARNING", "-Q", QUEUE),
            *(("-P", "prefork", "-c", "1") if late else ("-P", "threads", "-c", "8")),
            *("--without-gossip", "--without-mingle", "--without-heartbeat"),
        ],
        env=env,
        stdin=subprocess.DEVNULL,
    )
    try:
        got = _wait_starts(starts, n, proc)
        time.sleep(1.0)
    finally:
        _stop(proc)
    return Cell(enqueue, enqueue_calls, _rate(got), (requests(handle) - before) / n)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--tasks", type=int, default=300)
    parser.add_argument("--out", default=str(BENCH_DIR / "results-sqs.md"))
    args = parser.parse_args()
    started = time.monotonic()
    results: dict[str, list[Cell]] = {name: [] for name in SYSTEMS}
    with tempfile.TemporaryDirectory() as d:
        tmp = Path(d)
        handle = provide("sqs", tmp_dir=tmp)
        try:
            for run in range(args.runs):
                for system in SYSTEMS:
                    if system == "ackwise":
                        cell = run_ackwise(handle, args.tasks, tmp)
                    else:
                        cell = run_celery(handle, args.tasks, tmp, late=system == CELERY_LATE)
                    results[system].append(cell)
                    print(f"run {run + 1} {system}: {cell}", flush=True)
        finally:
            handle.stop()
    write(args, results, time.monotonic() - started)


def _med(cells: list[Cell], field: str) -> float:
    return statistics.median(getattr(c, field) for c in cells)


def _runs(cells: list[Cell], field: str, fmt: str) -> str:
    return ", ".join(format(getattr(c, field), fmt) for c in cells)


def write(args: argparse.Namespace, results: dict[str, list[Cell]], took: float) -> None:
    from importlib.metadata import version

    a, c, cl = results["ackwise"], results[CELERY], results[CELERY_LATE]
    git = subprocess.run(
        ["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, cwd=BENCH_DIR
    ).stdout.strip()
    drain_ratio = _med(a, "drain_rate") / _med(c, "drain_rate")
    late_ratio = _med(a, "drain_rate") / _med(cl, "drain_rate")
    lines = [
        "# SQS benchmark: ackwise vs Celery's SQS transport (same run, same moto server)",
        "",
        f"Run {dt.datetime.now(dt.UTC):%Y-%m-%d %H:%M} UTC, git {git}, CPython "
        f"{platform.python_version()}, {os.cpu_count()} CPUs; moto {version('moto')} server "
        "(ackwise_conformance.moto_server) on a free port, over HTTP; "
        f"{args.runs} run(s), {args.tasks} tasks per cell, {took / 60:.1f} min.",
        "",
        f"Versions: ackwise {version('ackwise')}, boto3 {version('boto3')}, celery "
        f"{version('celery')}, kombu {version('kombu')}.",
        "",
        f"Rerun: `uv run --group bench python bench/sqs.py --runs {args.runs} --tasks "
        f"{args.tasks}`",
        "",
        "One worker process each. ackwise: threads x8, late ack (its default: at least once), "
        "lease 30 s, prefetch 32 (default 4 x concurrency). Celery: threads x8 with its defaults "
        "(early ack: at most once), and prefork x1 with acks_late and prefetch x1 (at least once,"
        " the PEERS.md configuration); `wait_time_seconds=1`, `polling_interval=0`. "
        "API calls are counted at moto (one request"
        " log line each), over the enqueue and over the drain (worker start to its stop, which"
        " includes its start-up calls and one idle poll).",
        "",
        "| system | enqueue tasks/s | API calls/task (enqueue) | drain tasks/s | API calls/task "
        "(drain) | runs (drain tasks/s) |",
        "|---|---:|---:|---:|---:|---|",
    ]
    for name, cells in results.items():
        lines.append(
            f"| {name} | {_med(cells, 'enqueue_rate'):,.0f} | {_med(cells, 'enqueue_calls'):.2f}"
            f" | {_med(cells, 'drain_rate'):,.1f} | {_med(cells, 'drain_calls'):.3f} | "
            f"{_runs(cells, 'drain_rate', ',.1f')} |"
        )
    calls = _med(a, "drain_calls")
    lines += [
        "",
        "Against the issue's targets:",
        "",
        f"- drain ≥ 3x Celery's: ackwise / Celery (threads x8, early ack) = **{drain_ratio:.1f}x** "
        f"({'met' if drain_ratio >= 3 else 'not met'}); ackwise / Celery (prefork x1, acks_late, "
        f"prefetch x1) = **{late_ratio:.1f}x** ({'met' if late_ratio >= 3 else 'not met'})",
        f"- ≤ 0.5 SQS API calls per task at steady load: ackwise **{calls:.3f}** "
        f"({'met' if calls <= 0.5 else 'not met'}); Celery {_med(c, 'drain_calls'):.3f} and "
        f"{_med(cl, 'drain_calls'):.3f}",
        f"- enqueue (one call per task, no target): ackwise / Celery = "
        f"{_med(a, 'enqueue_rate') / _med(c, 'enqueue_rate'):.2f}x",
        "",
    ]
    Path(args.out).write_text("\n".join(lines))
    print("\n".join(lines))


if __name__ == "__main__":
    main()
