"""Helpers of the broker benchmarks (``bench/rabbitmq.py``), the method of ``bench/redis.py``.

``redis.py`` cannot be imported for its helpers (it rewrites ``sys.path`` and imports redis-py
and its task module on import), so the generic parts live here: the timed enqueue loop, a
worker process with its start log, the drain and latency measurements, the per-cell record of
each run's figures, and the report's small formatters.  The drain figures themselves (rate,
worker CPU per task) are ``embedded.drain_figures``, as for every benchmark in ``bench/``.
"""

from __future__ import annotations

import contextlib
import hashlib
import importlib.metadata
import os
import signal
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any


def _import_redis_py() -> None:
    """Import redis-py before ``bench/`` is searched: ``bench/redis.py`` would shadow it.

    ``embedded`` imports Huey, which imports ``redis``; with ``bench/`` first on ``sys.path``
    (it is the script's directory) that would import the Redis benchmark script instead.
    """
    here = Path(__file__).resolve().parent
    saved = sys.path[:]
    sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != here]
    try:
        import redis  # noqa: F401
    except ImportError:
        pass
    finally:
        sys.path[:] = saved


_import_redis_py()

import embedded  # noqa: E402
import startlog  # noqa: E402

Drain = embedded.Drain

#: Latency cells: steady rate, measured tasks, warm-up tasks.
RATE = 200.0
LAT_TASKS = 1000
LAT_WARMUP = 20


# -- enqueue --------------------------------------------------------------------------------
def timed(send: Callable[[], int], tasks: int, cap: float) -> float:
    """Call ``send`` (returns how many it sent) until ``tasks`` were sent or ``cap`` s passed."""
    sent = 0
    start = time.perf_counter()
    deadline = start + cap
    while sent < tasks:
        sent += send()
        if time.perf_counter() > deadline:
            break
    return sent / (time.perf_counter() - start)


def hundred(call: Callable[[], Any]) -> Callable[[], int]:
    def send() -> int:
        for _ in range(100):
            call()
        return 100

    return send


# -- worker processes -----------------------------------------------------------------------
@dataclass
class WorkerProc:
    proc: subprocess.Popen[bytes]
    starts: Path
    log: Path

    def count(self) -> int:
        return startlog.count_dir(str(self.starts))

    def alive(self) -> bool:
        return self.proc.poll() is None

    def log_tail(self) -> str:
        return self.log.read_text(errors="replace")[-3000:]


def start_worker(cmd: list[str], env_extra: dict[str, str], cell: Path) -> WorkerProc:
    """Start ``cmd`` in ``cell`` (its own session) with a start-log directory of its own."""
    starts = cell / "starts"
    starts.mkdir(parents=True)
    env = dict(os.environ)
    env.update(env_extra)
    env["BENCH_STARTS_DIR"] = str(starts)
    log_path = cell / "worker.log"
    with open(log_path, "wb") as log:
        proc = subprocess.Popen(
            cmd,
            cwd=cell,
            env=env,
            stdout=log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
        )
    return WorkerProc(proc, starts, log_path)


def stop_worker(w: WorkerProc) -> None:
    """SIGTERM, a few seconds' grace, then SIGKILL the whole process group (pool children).

    Everything measured was flushed to the starts directory before this is called.
    """
    proc = w.proc
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


def follow_drain(
    w: WorkerProc, tasks: int, what: str, also: int | None = None
) -> tuple[Drain, float]:
    """Follow a drain to its end (all started, or the window passed); return its figures.

    ``also``: another pid (the broker) whose CPU (with its descendants') is sampled over the
    same time; returned as µs per counted task beside the drain (NaN without it).
    """
    try:
        with contextlib.ExitStack() as stack:
            sampler = stack.enter_context(embedded.CpuSampler(w.proc.pid))
            other = stack.enter_context(embedded.CpuSampler(also)) if also is not None else None
            embedded._follow(w.count, tasks, w.alive, what)
            time.sleep(3 * startlog.FLUSH_EVERY)  # let every process flush its last starts
    except BaseException:
        sys.stderr.write(w.log_tail())
        raise
    finally:
        stop_worker(w)
    starts = startlog.read_dir(str(w.starts))
    result = embedded.drain_figures(starts, sampler.samples)
    other_us = float("nan")
    if other is not None:
        first = starts[0]
        other_us = cpu_us_over(other.samples, first, first + result.span, result.counted - 1)
    return result, other_us


def cpu_us_over(samples: list[tuple[float, float]], first: float, last: float, n: int) -> float:
    """CPU µs per task of a sampled process between two instants (``n`` tasks in between)."""
    if not samples or samples[0][0] > first or samples[-1][0] < last or n <= 0:
        return float("nan")
    cpu = embedded._interpolate(samples, last) - embedded._interpolate(samples, first)
    return cpu / n * 1e6


# -- latency --------------------------------------------------------------------------------
def measure_latency(w: WorkerProc, send: Callable[[float], Any], what: str) -> tuple[float, ...]:
    """Warm the worker up, send LAT_TASKS at a steady RATE; return (p50 ms, p99 ms, rate).

    ``send(sent)`` enqueues one task whose argument is ``sent``; the task records now - sent
    (warm-up tasks pass -1 and are ignored).  The worker is stopped at the end.
    """
    try:
        deadline = time.monotonic() + 60
        while w.count() == 0:  # until the worker runs tasks, then LAT_WARMUP more
            if time.monotonic() > deadline or not w.alive():
                raise RuntimeError(f"{what}: the worker did not start tasks")
            send(-1.0)
            time.sleep(0.1)
        for _ in range(LAT_WARMUP):
            send(-1.0)
            time.sleep(1 / RATE)
        time.sleep(0.2)
        warm = w.count()
        step = 1.0 / RATE
        t0 = time.perf_counter() + 0.01
        for i in range(LAT_TASKS):
            target = t0 + i * step
            while (pause := target - time.perf_counter()) > 0:
                time.sleep(pause)
            send(time.time())
        rate = LAT_TASKS / (time.perf_counter() - t0)
        embedded._follow(lambda: w.count() - warm, LAT_TASKS, w.alive, what)
        time.sleep(3 * startlog.FLUSH_EVERY)
    except BaseException:
        sys.stderr.write(w.log_tail())
        raise
    finally:
        stop_worker(w)
    values = sorted(v for v in startlog.read_dir(str(w.starts)) if v >= 0)
    if len(values) < LAT_TASKS * 0.99:
        raise RuntimeError(f"{what}: only {len(values)} latency samples")
    p50 = values[len(values) // 2] * 1000
    p99 = values[min(len(values) - 1, int(len(values) * 0.99))] * 1000
    return p50, p99, rate


# -- cells and their figures ----------------------------------------------------------------
@dataclass
class Cell:
    key: str
    kind: str  # enqueue, drain, latency
    system: str
    config: str
    run: Callable[..., Any]
    values: list[float] = field(default_factory=list)  # tasks/s, or p50 ms for latency
    cpu: list[float] = field(default_factory=list)  # worker CPU µs/task (drain)
    extra: list[float] = field(default_factory=list)  # broker CPU µs/task (drain), p99 ms
    notes: list[str] = field(default_factory=list)

    @property
    def median(self) -> float:
        return statistics.median(self.values)

    def median_of(self, figures: list[float]) -> float | None:
        good = [x for x in figures if x == x]  # NaN: not measured in that run
        return statistics.median(good) if good else None


def select(cells: list[Cell], only: str) -> list[Cell]:
    prefixes = [p.strip() for p in only.split(",") if p.strip()]
    if not prefixes:
        return cells
    return [c for c in cells if any(c.key.startswith(p) for p in prefixes)]


def record_drain(c: Cell, result: Drain, broker_cpu: float, run: int, tasks: int) -> str:
    """Keep a drain's figures in ``c`` (warnings too); return the progress line's text."""
    c.values.append(result.rate)
    c.cpu.append(result.cpu_us if result.cpu_us is not None else float("nan"))
    c.extra.append(broker_cpu)
    if result.started > tasks:
        c.notes.append(f"{c.key} run {run}: {result.started} starts for {tasks} tasks (duplicates)")
    never = tasks - result.started
    if result.left is not None and result.left != never:
        why = (
            "started but not acked when the worker was stopped, so back in the queue (at least "
            "once: not a loss)"
            if result.left > never
            else "LOST: neither started nor in the queue"
        )
        c.notes.append(
            f"{c.key} run {run}: {result.left} left in the queue after the worker stopped, "
            f"{never} never started: {abs(result.left - never)} {why}"
        )
    return (
        f"{result.rate:,.0f}/s ({result.counted} starts in {result.span:.2f}s), worker cpu "
        f"{result.cpu_us or 0:.0f}µs, broker cpu {broker_cpu:.0f}µs, {result.left} left"
    )


# -- report helpers -------------------------------------------------------------------------
def tree_state() -> str:
    """Uncommitted changes to ackwise's code (core/, adapters/): "" or a note with their hash."""
    diff = embedded._git("diff", "HEAD", "--", "core", "adapters")
    if not diff:
        return ""
    digest = hashlib.sha256(diff.encode()).hexdigest()[:12]
    return f" + uncommitted changes in core/ or adapters/ (diff sha256 {digest})"


def version(dist: str) -> str:
    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return "?"


def fmt(x: float | None) -> str:
    return "-" if x is None else f"{x:,.0f}"


def runs(values: list[float], form: str = "{:,.0f}") -> str:
    return ", ".join("-" if v != v else form.format(v) for v in values)
