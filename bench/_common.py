"""Helpers of the broker benchmarks (``bench/redis_peers.py``, ``rabbitmq.py``, ``sqs.py``).

The generic parts of their common method: the timed enqueue loop, a worker process with its
start log, the drain and latency measurements, the per-cell record of each run's figures, and
the report's small formatters.  The drain figures themselves (rate, worker CPU per task) are
``embedded.drain_figures``, as for every benchmark in ``bench/``.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime as dt
import hashlib
import importlib.metadata
import os
import platform
import shlex
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import embedded
import startlog

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


def timed_threads(send: Callable[[], int], tasks: int, cap: float, threads: int) -> float:
    """:func:`timed` from ``threads`` producer threads at once, sharing ``tasks``: tasks/s."""
    lock = threading.Lock()
    sent = [0]
    errors: list[BaseException] = []
    start = time.perf_counter()
    deadline = start + cap

    def produce() -> None:
        try:
            while True:
                with lock:
                    if sent[0] >= tasks or time.perf_counter() > deadline:
                        return
                n = send()
                with lock:
                    sent[0] += n
        except BaseException as exc:  # reported by the driver, not lost in a thread
            errors.append(exc)

    pool = [threading.Thread(target=produce) for _ in range(threads)]
    for t in pool:
        t.start()
    for t in pool:
        t.join()
    if errors:
        raise errors[0]
    return sent[0] / (time.perf_counter() - start)


def hundred(call: Callable[[], Any]) -> Callable[[], int]:
    def send() -> int:
        for _ in range(100):
            call()
        return 100

    return send


def enqueue_ackwise(app: Any, tasks: int, batch: int | None, cap: float, threads: int = 1) -> float:
    """ackwise's ``delay()`` (``batch`` None) or ``send_many`` in chunks of ``batch``: tasks/s;
    ``delay()`` from ``threads`` producer threads sharing the app when more than one.

    ``app``: a task module's ackwise app with its no-op task as ``app.bench_noop``; closed here.
    """
    noop = app.bench_noop
    noop.delay()  # connect and declare: not timed
    try:
        if batch is None:
            if threads > 1:
                return timed_threads(hundred(noop.delay), tasks, cap, threads)
            return timed(hundred(noop.delay), tasks, cap)

        def many() -> int:
            app.send_many([noop.s() for _ in range(batch)])
            return batch

        return timed(many, tasks, cap)
    finally:
        app.close()


# -- worker processes -----------------------------------------------------------------------
BENCH_DIR = Path(__file__).resolve().parent


def worker_env(subfolder: str) -> dict[str, str]:
    """``PYTHONPATH`` for a driver's workers: ``bench/<subfolder>`` (its task module), ``bench/``.

    The one place the broker benchmarks set a module search path: the worker imports the task
    module by its own name (``redis_tasks:ackwise_app``) and the task module imports
    ``startlog`` from ``bench/``.  The driver imports it as ``<subfolder>.<module>``, ``bench/``
    being its script's directory.
    """
    return {"PYTHONPATH": os.pathsep.join([str(BENCH_DIR / subfolder), str(BENCH_DIR)])}


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


def worker_cmd(
    module: str, system: str, config: str, concurrency: int, python: str | None = None
) -> list[str]:
    """The worker of ackwise, Celery or Dramatiq, one process, on the task module ``module``.

    ``python``: the interpreter that runs it (default: this one); a ``--baseline``'s for the
    baseline cells.
    """
    py = python or sys.executable
    if system == "ackwise":
        return [
            *(py, "-m", "ackwise", "--loglevel", "WARNING", "worker"),
            *(f"{module}:ackwise_app", "--pool", config, "-c", str(concurrency)),
        ]
    if system == "celery":
        return [
            *(py, "-m", "celery", "-A", f"{module}:celery_app", "worker", "-l", "WARNING"),
            *("-P", config, "-c", str(concurrency), "--prefetch-multiplier", "1"),
            *("--without-gossip", "--without-mingle", "--without-heartbeat"),
        ]
    if system == "dramatiq":
        return [
            *(py, "-m", "dramatiq", f"{module}:dramatiq_broker", "--processes", "1"),
            *("--threads", str(concurrency), "--skip-logging"),
        ]
    raise ValueError(system)


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
    stop_workers([w])


def stop_workers(workers: Sequence[WorkerProc]) -> None:
    """:func:`stop_worker` for several workers at once: one grace period for all of them."""
    for w in workers:
        if w.proc.poll() is None:
            w.proc.send_signal(signal.SIGTERM)
    deadline = time.monotonic() + 5
    for w in workers:
        try:
            w.proc.wait(timeout=max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            pass
    for w in workers:
        try:
            os.killpg(w.proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        w.proc.wait()


def follow_drain(
    w: WorkerProc | Sequence[WorkerProc],
    tasks: int,
    what: str,
    also: int | None = None,
    go: Callable[[], None] | None = None,
) -> tuple[Drain, float]:
    """Follow a drain to its end (all started, or the window passed); return its figures.

    ``w``: the worker, or several draining one queue (their starts and their CPU summed).
    ``also``: another pid (the broker) whose CPU (with its descendants') is sampled over the
    same time; returned as µs per counted task beside the drain (NaN without it).
    ``go``: called once the CPU samplers run (``bench/scaling.py`` resumes paused workers).
    """
    workers = [w] if isinstance(w, WorkerProc) else list(w)
    try:
        with contextlib.ExitStack() as stack:
            sampler = stack.enter_context(embedded.CpuSampler([x.proc.pid for x in workers]))
            other = stack.enter_context(embedded.CpuSampler(also)) if also is not None else None
            if go is not None:
                go()
            embedded.follow(
                lambda: sum(x.count() for x in workers),
                tasks,
                lambda: all(x.alive() for x in workers),
                what,
            )
            time.sleep(3 * startlog.FLUSH_EVERY)  # let every process flush its last starts
    except BaseException:
        for x in workers:
            sys.stderr.write(x.log_tail())
        raise
    finally:
        stop_workers(workers)
    starts = sorted(t for x in workers for t in startlog.read_dir(str(x.starts)))
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
    cpu = embedded.interpolate(samples, last) - embedded.interpolate(samples, first)
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
        embedded.follow(lambda: w.count() - warm, LAT_TASKS, w.alive, what)
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


# -- the command line -----------------------------------------------------------------------
def parse_args(
    description: str, script: str, out: str, baseline: bool = True
) -> tuple[argparse.Namespace, str]:
    """The options of a broker benchmark and the command that reruns it (its "Rerun:" line).

    ``baseline``: offer ``--baseline`` (``args.baseline`` is None without it).
    """
    global LAT_TASKS  # --lat-tasks sets it for measure_latency
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--tasks", type=int, default=20_000)
    parser.add_argument("--out", default=str(BENCH_DIR / out))
    parser.add_argument("--only", default="", help="comma-separated prefixes of cell keys")
    parser.add_argument(
        "--lat-tasks",
        type=int,
        default=LAT_TASKS,
        help="tasks per latency run (its p99 is the 1%% slowest of them: more, a steadier p99)",
    )
    if baseline:
        parser.add_argument(
            "--baseline",
            metavar="PYTHON",
            help="another checkout's interpreter (its .venv/bin/python): adds drain cells whose "
            "ackwise worker it runs (ackwise-baseline), interleaved with the others",
        )
    args = parser.parse_args()
    LAT_TASKS = args.lat_tasks
    args.baseline = getattr(args, "baseline", None)
    args.baseline_note = describe_baseline(args.baseline) if args.baseline else ""
    command = " ".join(
        [f"uv run --group bench python bench/{script}", shlex.join(sys.argv[1:])]
    ).strip()
    return args, command


def describe_baseline(python: str) -> str:
    """Where ``--baseline``'s ackwise lives and at which commit; exits with one line if none."""
    try:
        probe = subprocess.run(
            [python, "-c", "import ackwise; print(ackwise.__file__)"],
            capture_output=True,
            text=True,
            check=False,
        )
    except OSError as e:
        sys.exit(f"--baseline {python}: expected an interpreter that imports ackwise ({e})")
    if probe.returncode != 0:
        last = (probe.stderr.strip().splitlines() or ["no output"])[-1]
        sys.exit(f"--baseline {python}: expected an interpreter that imports ackwise ({last})")
    source = Path(probe.stdout.strip()).parent
    head = subprocess.run(
        ["git", "-C", str(source), "log", "-1", "--format=%h"],
        capture_output=True,
        text=True,
        check=False,
    ).stdout.strip()
    dirty = subprocess.run(
        ["git", "-C", str(source), "status", "--porcelain", "--", ":/core", ":/adapters"],
        capture_output=True,
        text=True,
        check=False,
    ).stdout.strip()
    return f"ackwise from {source}, git {head or '?'}{' + uncommitted changes' if dirty else ''}"


def baseline_section(cells: Sequence[Cell], note: str, keys: list[str]) -> list[str]:
    """The report's "against the baseline" table: each ``key`` vs ``<key>`` on the baseline."""
    by = {c.key: c for c in cells if c.values}
    pairs = [(by[k], by[f"{k}-baseline"]) for k in keys if k in by and f"{k}-baseline" in by]
    if not pairs:
        return []
    lines = [
        "",
        "## Against the baseline (same run, cells interleaved)",
        "",
        f"Baseline: {note}.",
        "",
        "| cell | this tree | baseline | ratio | runs (this / baseline) |",
        "|---|---:|---:|---:|---|",
    ]
    for a, b in pairs:
        lines.append(
            f"| {a.key} | {fmt(a.median)} | {fmt(b.median)} | **{a.median / b.median:.2f}x** | "
            f"{runs(a.values)} / {runs(b.values)} |"
        )
    return lines


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


C = TypeVar("C", bound=Cell)


def select(cells: list[C], only: str) -> list[C]:
    prefixes = [p.strip() for p in only.split(",") if p.strip()]
    if not prefixes:
        return cells
    return [c for c in cells if any(c.key.startswith(p) for p in prefixes)]


def record_drain(c: Cell, result: Drain, broker_cpu: float | None, run: int, tasks: int) -> str:
    """Keep a drain's figures in ``c`` (warnings too); return the progress line's text.

    ``broker_cpu``: None where the benchmark does not sample the broker's CPU at all.
    """
    c.values.append(result.rate)
    c.cpu.append(result.cpu_us if result.cpu_us is not None else float("nan"))
    c.extra.append(broker_cpu if broker_cpu is not None else float("nan"))
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
    shown = [
        f"{result.rate:,.0f}/s ({result.counted} starts in {result.span:.2f}s)",
        f"worker cpu {result.cpu_us or 0:.0f}µs",
    ]
    if broker_cpu is not None:
        shown.append(f"broker cpu {broker_cpu:.0f}µs")
    if result.left is not None:  # the Redis benchmark counts what is left for ackwise only
        shown.append(f"{result.left} left")
    return ", ".join(shown)


def record(c: Cell, result: Any, run: int, tasks: int) -> str:
    """Keep one run's result of ``c`` by its kind; return the progress line's text.

    ``result``: tasks/s (enqueue); ``(Drain, broker CPU µs per task or None)`` (drain);
    ``(p50 ms, p99 ms, achieved send rate)`` (latency).
    """
    if c.kind == "drain":
        drained, broker_us = result
        return record_drain(c, drained, broker_us, run, tasks)
    if c.kind == "latency":
        p50, p99, rate = result
        c.values.append(p50)
        c.extra.append(p99)
        return f"p50 {p50:.2f} ms p99 {p99:.2f} ms (sent at {rate:.0f}/s)"
    c.values.append(result)
    return f"{result:,.0f}/s"


def run_cells(
    cells: Sequence[Cell],
    broker: Any,
    tmp: Path,
    rounds: int,
    tasks: int,
    width: int,
    first: int = 1,
) -> None:
    """Run every cell ``rounds`` times (``c.run(broker, cell_dir, tasks)``), progress to stderr.

    ``first``: the number of the first run (a caller that orders each run itself).
    """
    for run in range(first, first + rounds):
        for c in cells:
            cell_dir = tmp / f"{c.key}-{run}"
            cell_dir.mkdir()
            t = time.monotonic()
            shown = record(c, c.run(broker, cell_dir, tasks), run, tasks)
            print(
                f"run {run} {c.key:<{width}} {shown}  ({time.monotonic() - t:.1f}s)",
                file=sys.stderr,
                flush=True,
            )


# -- report helpers -------------------------------------------------------------------------
def rows(cells: list[C], kind: str, figures: Callable[[C], list[str]]) -> list[str]:
    """The table rows of the measured cells of one kind: system, configuration, figures."""
    return [
        "| " + " | ".join([c.system, c.config, *figures(c)]) + " |"
        for c in cells
        if c.kind == kind and c.values
    ]


def enqueue_table(cells: list[Cell], producer: str) -> list[str]:
    """The enqueue section of a report: tasks/s medians, and each run's."""
    return [
        f"## Enqueue, {producer} (tasks/s, median)",
        "",
        "| system | how | tasks/s | runs |",
        "|---|---|---:|---|",
        *rows(cells, "enqueue", lambda c: [fmt(c.median), runs(c.values)]),
    ]


def drain_table(cells: list[Cell], tasks: int, server: str) -> list[str]:
    """The drain section of a report: tasks/s medians, the worker's and the ``server``'s CPU
    per task (``Cell.cpu``, ``Cell.extra``), and each run's rate."""
    return [
        "",
        f"## Drain, {tasks:,} no-op tasks, one worker process (tasks started/s, median)",
        "",
        f"| system | config | tasks/s | worker CPU µs/task | {server} CPU µs/task | runs |",
        "|---|---|---:|---:|---:|---|",
        *(
            f"| {c.system} | {c.config} | {fmt(c.median)} | {fmt(c.median_of(c.cpu))} | "
            f"{fmt(c.median_of(c.extra))} | {runs(c.values)} |"
            for c in cells
            if c.kind == "drain" and c.values
        ),
    ]


def report_end(
    cells: Sequence[Cell],
    ratios: list[str],
    ratio_title: str,
    peer: str,
    baseline_note: str,
    method_title: str,
    method: str,
) -> list[str]:
    """What ends a report: the ratios, the baseline, the cells' warnings, the method."""
    lines: list[str] = []
    if ratios:
        lines += [
            "",
            f"## Ratios (medians; {ratio_title})",
            "",
            f"| comparison | ackwise | {peer} | ratio |",
            "|---|---:|---:|---:|",
            *ratios,
        ]
    lines += baseline_section(cells, baseline_note, ["drain-ackwise-1", "drain-ackwise-8"])
    notes = [n for c in cells for n in c.notes]
    if notes:
        lines += ["", "## Warnings", ""] + [f"- {n}" for n in notes]
    lines += ["", f"## {method_title}", "", method.strip(), ""]
    return lines


def latency_table(cells: list[Cell]) -> list[str]:
    """The latency section of a report: p50 and p99 medians, and each run's."""
    return [
        "",
        f"## Enqueue -> start latency at a steady {RATE:.0f} tasks/s, concurrency 1 "
        "(ms, median of runs)",
        "",
        "| system | config | p50 | p99 | runs (p50 / p99) |",
        "|---|---|---:|---:|---|",
        *rows(
            cells,
            "latency",
            lambda c: [
                f"{c.median:.2f}",
                f"{statistics.median(c.extra):.2f}",
                ", ".join(f"{a:.2f} / {p:.2f}" for a, p in zip(c.values, c.extra, strict=True)),
            ],
        ),
    ]


def run_header(
    runs: int, tasks: int, elapsed: float, load: tuple[float, float], head: str, tree: str
) -> list[str]:
    """A report's first lines: when, at which commit, how many runs; the machine and its load."""
    return [
        f"Run {dt.datetime.now(dt.UTC).strftime('%Y-%m-%d %H:%M UTC')}, git {head[:7]}{tree} at "
        f"the start; {runs} run(s) per cell, {tasks:,} tasks; {elapsed / 60:.1f} min.",
        "",
        f"Machine: {platform.python_implementation()} {platform.python_version()}, "
        f"{os.cpu_count()} CPUs ({embedded.cpu_model()}), {platform.system()} "
        f"{platform.release()}; load average {load[0]:.2f} at the start, {load[1]:.2f} at the end.",
    ]


def tree_state() -> str:
    """Uncommitted changes to ackwise's code (core/, adapters/): "" or a note with their hash."""
    diff = embedded.git("diff", "HEAD", "--", "core", "adapters")
    if not diff:
        return ""
    digest = hashlib.sha256(diff.encode()).hexdigest()[:12]
    return f" + uncommitted changes in core/ or adapters/ (diff sha256 {digest})"


def note_tree_change(cells: Sequence[Cell], tree_start: str, head_start: str) -> None:
    """A warning on the first cell when the commit or core/, adapters/ changed during the run."""
    if cells and (tree_state(), embedded.git("rev-parse", "HEAD")) != (tree_start, head_start):
        cells[0].notes.append(
            "core/ or adapters/ changed during the run (a commit or uncommitted edits): the runs "
            "of an ackwise cell may have measured different code"
        )


def server_pid(handle: Any) -> int | None:
    """The pid of the broker process ``provide`` started (the root of its process tree), or
    None (a container, an external broker)."""
    pid: int | None = handle.pid
    return pid


def version(dist: str) -> str:
    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return "?"


def fmt(x: float | None) -> str:
    return "-" if x is None else f"{x:,.0f}"


def runs(values: list[float], form: str = "{:,.0f}") -> str:
    return ", ".join("-" if v != v else form.format(v) for v in values)


def run_report(
    name: str,
    script: str,
    out: str,
    doc: str,
    plan: Callable[[str | None], list[Cell]],
    start: Callable[[Path], Any],
    describe: Callable[[Any], str],
    render: Callable[..., str],
) -> int:
    """A peer benchmark's ``main``: run the cells ``plan`` selects on the server ``start``
    gives (stopped after), note a change of the tree during the run, write the report."""
    args, command = parse_args(doc.splitlines()[0], script, out)
    cells = select(plan(args.baseline), args.only)
    started = time.monotonic()
    load_start = os.getloadavg()[0]
    tree_start = tree_state()
    head_start = embedded.git("rev-parse", "HEAD")
    with tempfile.TemporaryDirectory(prefix=f"ackwise-bench-{name}-") as tmp:
        server = start(Path(tmp) / name)
        print(describe(server), file=sys.stderr, flush=True)
        try:
            run_cells(cells, server, Path(tmp), args.runs, args.tasks, width=26)
        finally:
            server.stop()
    load = (load_start, os.getloadavg()[0])
    note_tree_change(cells, tree_start, head_start)
    text = render(
        cells, args, command, time.monotonic() - started, server, load, head_start, tree_start
    )
    Path(args.out).write_text(text)
    print(text)
    return 0
