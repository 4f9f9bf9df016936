"""Embedded-broker benchmark: ackwise on ``sqlite://`` and ``memory://`` against Huey's SQLite
storage, on the same machine, in the same run.  See ``bench/README.md`` for the method.

    uv run --group bench python bench/embedded.py [--runs 3] [--tasks 20000]
                                                  [--out bench/results-embedded.md]
"""

from __future__ import annotations

import argparse
import datetime as dt
import importlib.metadata
import itertools
import os
import platform
import shlex
import signal
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import benchmod  # bench/ is the script's directory: first on sys.path
import startlog

import ackwise

try:
    import benchmod_huey
except ImportError as exc:  # pragma: no cover
    sys.exit(
        f"bench/embedded.py needs huey ({exc}): run it with "
        "`uv run --group bench python bench/embedded.py` (or `uv sync --all-groups` first)"
    )

BENCH_DIR = Path(__file__).resolve().parent
REPO = BENCH_DIR.parent
#: Drain window: first task start -> last task start, at most this many seconds.
WINDOW = 10.0
#: Enqueue cells stop after this many seconds even when not all tasks were sent.
ENQUEUE_CAP = 10.0
BATCH = 500
CLK_TCK = os.sysconf("SC_CLK_TCK")


# -- measuring ------------------------------------------------------------------------------
@dataclass
class Drain:
    rate: float  # tasks started per second, first -> last start within the window
    counted: int  # starts inside the window
    span: float  # seconds from the first to the last counted start
    cpu_us: float | None  # worker CPU (all its processes) per task over the same span
    started: int  # starts seen in total (> tasks would mean duplicates)
    left: int | None = None  # messages still in the queue after the worker stopped


def drain_figures(starts: Sequence[float], samples: Sequence[tuple[float, float]]) -> Drain:
    starts = sorted(starts)
    if len(starts) < 2:
        raise RuntimeError(f"only {len(starts)} task(s) started: nothing to measure")
    first = starts[0]
    inside = [t for t in starts if t <= first + WINDOW]
    last = inside[-1]
    span = last - first
    rate = (len(inside) - 1) / span
    cpu_us = None
    if samples and samples[0][0] <= first and samples[-1][0] >= last:
        cpu = interpolate(samples, last) - interpolate(samples, first)
        cpu_us = cpu / (len(inside) - 1) * 1e6
    return Drain(rate, len(inside), span, cpu_us, len(starts))


def interpolate(samples: Sequence[tuple[float, float]], t: float) -> float:
    for (t0, c0), (t1, c1) in itertools.pairwise(samples):
        if t0 <= t <= t1:
            return c0 if t1 == t0 else c0 + (c1 - c0) * (t - t0) / (t1 - t0)
    raise ValueError("time outside the sampled range")


def _proc_cpu(pid: int) -> float:
    """utime + stime of one process (all its threads), seconds."""
    with open(f"/proc/{pid}/stat", "rb") as f:
        fields = f.read().rsplit(b")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / CLK_TCK


def _children(pid: int) -> list[int]:
    out: list[int] = []
    try:
        tids = os.listdir(f"/proc/{pid}/task")
    except FileNotFoundError:
        return out
    for tid in tids:
        try:
            with open(f"/proc/{pid}/task/{tid}/children") as f:
                out.extend(int(p) for p in f.read().split())
        except FileNotFoundError:
            pass
    return out


class CpuSampler:
    """Samples the CPU time of a process and its descendants every ``every`` seconds.

    ``pid``: one process, or several whose trees are summed.  Reads ``/proc`` only: the measured
    process does nothing for it.  Resolution is one clock tick (10 ms) per sample, i.e. well
    under 1 % of a multi-second drain.  The first sample is taken before ``__enter__`` returns.
    """

    def __init__(self, pid: int | Sequence[int], every: float = 0.02) -> None:
        self.pids = [pid] if isinstance(pid, int) else list(pid)
        self.every = every
        self.samples: list[tuple[float, float]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="cpu-sampler", daemon=True)

    def _total(self) -> float:
        total = 0.0
        todo = list(self.pids)
        while todo:
            p = todo.pop()
            try:
                total += _proc_cpu(p)
            except (FileNotFoundError, ProcessLookupError):
                continue
            todo.extend(_children(p))
        return total

    def _run(self) -> None:
        while not self._stop.wait(self.every):
            self.samples.append((time.time(), self._total()))
        self.samples.append((time.time(), self._total()))

    def __enter__(self) -> CpuSampler:
        self.samples.append((time.time(), self._total()))
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()


def follow(
    count: Callable[[], int], tasks: int, alive: Callable[[], bool], what: str, startup: float = 60
) -> None:
    """Wait until all ``tasks`` started or the drain window passed since the first start."""
    deadline = time.monotonic() + startup
    first_seen: float | None = None
    while True:
        n = count()
        now = time.monotonic()
        if n and first_seen is None:
            first_seen = now
        if n >= tasks:
            return
        if first_seen is not None and now - first_seen > WINDOW + 0.5:
            return
        if first_seen is None and now > deadline:
            raise RuntimeError(f"{what}: no task started within {startup:.0f}s")
        if not alive():
            raise RuntimeError(f"{what}: the worker exited early")
        time.sleep(0.05)


# -- cells ------------------------------------------------------------------------------------
def _timed_loop(send: Callable[[], int], tasks: int) -> float:
    """Call ``send`` (returns how many it sent) until ``tasks`` are sent; return tasks/s."""
    sent = 0
    start = time.perf_counter()
    deadline = start + ENQUEUE_CAP
    while sent < tasks:
        sent += send()
        if time.perf_counter() > deadline:
            break
    return sent / (time.perf_counter() - start)


def ackwise_enqueue(url: str, tasks: int, batch: int | None) -> float:
    app = benchmod.make_app(url)
    noop = app.tasks["benchmod.noop"]
    noop.delay()  # open the producer connection and declare the queue: not timed
    try:
        if batch is None:

            def one() -> int:
                for _ in range(100):
                    noop.delay()
                return 100

            return _timed_loop(one, tasks)

        def many() -> int:
            app.send_many([noop.s() for _ in range(batch)])
            return batch

        return _timed_loop(many, tasks)
    finally:
        app.close()


def huey_enqueue(path: str, tasks: int, sync: str) -> float:
    huey = benchmod_huey.make_huey(path, sync)
    noop = huey.bench_noop
    noop()  # open the connection: not timed

    def one() -> int:
        for _ in range(100):
            noop()
        return 100

    try:
        return _timed_loop(one, tasks)
    finally:
        huey.storage.close()


def _prefill_ackwise(url: str, tasks: int) -> None:
    app = benchmod.make_app(url)
    noop = app.tasks["benchmod.noop"]
    for i in range(0, tasks, BATCH):
        app.send_many([noop.s() for _ in range(min(BATCH, tasks - i))])
    app.close()


def _prefill_huey(path: str, tasks: int) -> None:
    huey = benchmod_huey.make_huey(path, "normal")
    rows = [(huey.storage.name, huey.serialize_task(huey.bench_noop.s()), 0) for _ in range(tasks)]
    with huey.storage.db(commit=True) as curs:
        curs.executemany("INSERT INTO task (queue, data, priority) VALUES (?, ?, ?)", rows)
    huey.storage.close()


def _run_worker_process(
    cmd: list[str],
    env_extra: dict[str, str],
    cell: Path,
    tasks: int,
    what: str,
    left: Callable[[], int],
) -> Drain:
    starts_dir = cell / "starts"
    starts_dir.mkdir()
    env = dict(os.environ)
    env.update(env_extra)
    env["BENCH_STARTS_DIR"] = str(starts_dir)
    env["PYTHONPATH"] = os.pathsep.join(p for p in [str(BENCH_DIR), env.get("PYTHONPATH")] if p)
    log_path = cell / "worker.log"
    with open(log_path, "wb") as log:
        proc = subprocess.Popen(
            cmd, cwd=cell, env=env, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL
        )
        try:
            with CpuSampler(proc.pid) as sampler:
                follow(
                    lambda: startlog.count_dir(str(starts_dir)),
                    tasks,
                    lambda: proc.poll() is None,
                    what,
                )
                time.sleep(3 * startlog.FLUSH_EVERY)  # let every process flush its last starts
        except BaseException:
            proc.kill()
            proc.wait()
            sys.stderr.write(log_path.read_text(errors="replace"))
            raise
        finally:
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
                try:
                    proc.wait(timeout=30)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait()
    result = drain_figures(startlog.read_dir(str(starts_dir)), sampler.samples)
    result.left = left()
    return result


def _ackwise_left(url: str) -> int:
    adapter = ackwise.open_adapter(url)
    adapter.open()
    try:
        s = adapter.stats("default")
        return s.ready + s.delayed + s.in_flight
    finally:
        adapter.close()


def _huey_left(path: str) -> int:
    huey = benchmod_huey.make_huey(path, "normal")
    try:
        return int(huey.storage.queue_size())
    finally:
        huey.storage.close()


def ackwise_sqlite_drain(
    cell: Path, tasks: int, pool: str, concurrency: int, python: str | None = None
) -> Drain:
    """``python``: the interpreter that runs the worker (default: this one; ``bench/ab.py``
    gives another checkout's)."""
    url = f"sqlite:///{cell / 'ackwise.db'}"
    _prefill_ackwise(url, tasks)
    cmd = [python or sys.executable, "-m", "ackwise", "--loglevel", "WARNING", "worker"]
    cmd += ["benchmod:app"]
    cmd += ["--pool", pool, "-c", str(concurrency)]
    env = {"ACKWISE_BENCH_BROKER": url}
    what = f"ackwise {pool} -c {concurrency}"
    return _run_worker_process(cmd, env, cell, tasks, what, lambda: _ackwise_left(url))


def huey_drain(cell: Path, tasks: int, workers: int) -> Drain:
    path = str(cell / "huey.db")
    _prefill_huey(path, tasks)
    cmd = [sys.executable, "-m", "huey.bin.huey_consumer", "benchmod_huey.huey"]
    cmd += ["-w", str(workers), "-k", "thread", "-q"]
    env = {"HUEY_BENCH_DB": path, "HUEY_BENCH_SYNC": "normal"}
    return _run_worker_process(
        cmd, env, cell, tasks, f"huey -w {workers}", lambda: _huey_left(path)
    )


def ackwise_memory_drain(tasks: int, concurrency: int) -> Drain:
    app = benchmod.make_app(f"memory://bench-{uuid.uuid4().hex}")
    noop = app.tasks["benchmod.noop"]
    for i in range(0, tasks, BATCH):
        app.send_many([noop.s() for _ in range(min(BATCH, tasks - i))])
    startlog.reset()
    worker = ackwise.Worker(app, ackwise.WorkerConfig(pool="threads", concurrency=concurrency))
    thread = threading.Thread(target=worker.run, name="bench-worker", daemon=True)
    with CpuSampler(os.getpid(), every=0.05) as sampler:
        thread.start()
        try:
            follow(lambda: len(startlog.starts), tasks, thread.is_alive, "memory worker")
        finally:
            worker.request_stop()
            thread.join(30)
    starts = list(startlog.starts)
    startlog.reset()
    adapter = app.adapter()
    adapter.open()
    st = adapter.stats("default")
    adapter.close()
    app.close()
    result = drain_figures(starts, sampler.samples)
    result.left = st.ready + st.delayed + st.in_flight
    return result


# -- the plan ---------------------------------------------------------------------------------
@dataclass
class Cell:
    key: str
    kind: str  # "enqueue" or "drain"
    system: str
    broker: str
    config: str
    run: Callable[[Path, int], float | Drain]
    values: list[float] = field(default_factory=list)
    cpu: list[float] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    @property
    def median(self) -> float:
        return statistics.median(self.values)

    @property
    def cpu_median(self) -> float | None:
        return statistics.median(self.cpu) if self.cpu else None


def plan() -> list[Cell]:
    def sq(cell: Path) -> str:
        return f"sqlite:///{cell / 'ackwise.db'}"

    return [
        Cell(
            "enq-sqlite-delay",
            "enqueue",
            "ackwise",
            "sqlite://",
            "`delay()`, one call per task",
            lambda c, n: ackwise_enqueue(sq(c), n, None),
        ),
        Cell(
            "enq-sqlite-batch",
            "enqueue",
            "ackwise",
            "sqlite://",
            f"`send_many`, chunks of {BATCH}",
            lambda c, n: ackwise_enqueue(sq(c), n, BATCH),
        ),
        Cell(
            "enq-huey",
            "enqueue",
            "huey",
            "SqliteHuey",
            "`task()`, one call per task (synchronous=NORMAL)",
            lambda c, n: huey_enqueue(str(c / "huey.db"), n, "normal"),
        ),
        Cell(
            "enq-huey-default",
            "enqueue",
            "huey",
            "SqliteHuey",
            "`task()`, one call per task (Huey default: synchronous=FULL)",
            lambda c, n: huey_enqueue(str(c / "huey.db"), n, "default"),
        ),
        Cell(
            "enq-memory-delay",
            "enqueue",
            "ackwise",
            "memory://",
            "`delay()`, one call per task",
            lambda c, n: ackwise_enqueue(f"memory://enq-{uuid.uuid4().hex}", n, None),
        ),
        Cell(
            "enq-memory-batch",
            "enqueue",
            "ackwise",
            "memory://",
            f"`send_many`, chunks of {BATCH}",
            lambda c, n: ackwise_enqueue(f"memory://enq-{uuid.uuid4().hex}", n, BATCH),
        ),
        Cell(
            "drain-sqlite-threads-1",
            "drain",
            "ackwise",
            "sqlite://",
            "worker process, `--pool threads -c 1`",
            lambda c, n: ackwise_sqlite_drain(c, n, "threads", 1),
        ),
        Cell(
            "drain-huey-1",
            "drain",
            "huey",
            "SqliteHuey",
            "consumer process, `-k thread -w 1`",
            lambda c, n: huey_drain(c, n, 1),
        ),
        Cell(
            "drain-sqlite-threads-8",
            "drain",
            "ackwise",
            "sqlite://",
            "worker process, `--pool threads -c 8`",
            lambda c, n: ackwise_sqlite_drain(c, n, "threads", 8),
        ),
        Cell(
            "drain-huey-8",
            "drain",
            "huey",
            "SqliteHuey",
            "consumer process, `-k thread -w 8`",
            lambda c, n: huey_drain(c, n, 8),
        ),
        Cell(
            "drain-sqlite-prefork-8",
            "drain",
            "ackwise",
            "sqlite://",
            "worker process, `--pool prefork -c 8` (extra)",
            lambda c, n: ackwise_sqlite_drain(c, n, "prefork", 8),
        ),
        Cell(
            "drain-memory-threads-1",
            "drain",
            "ackwise",
            "memory://",
            "in-process `Worker`, threads c=1",
            lambda c, n: ackwise_memory_drain(n, 1),
        ),
        Cell(
            "drain-memory-threads-8",
            "drain",
            "ackwise",
            "memory://",
            "in-process `Worker`, threads c=8",
            lambda c, n: ackwise_memory_drain(n, 8),
        ),
    ]


RATIOS = [
    ("enqueue, one call per task", "enq-sqlite-delay", "enq-huey"),
    ("enqueue, batch (ackwise) vs one call per task (Huey has no batch API)",
     "enq-sqlite-batch", "enq-huey"),
    ("drain, concurrency 1 (threads -c 1 vs -w 1)", "drain-sqlite-threads-1", "drain-huey-1"),
    ("drain, concurrency 8 (threads -c 8 vs -w 8)", "drain-sqlite-threads-8", "drain-huey-8"),
    ("drain, concurrency 8 (prefork -c 8 vs threads -w 8)",
     "drain-sqlite-prefork-8", "drain-huey-8"),
]  # fmt: skip


# -- report -----------------------------------------------------------------------------------
def _version(dist: str) -> str:
    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return "not installed"


def git(*args: str) -> str:
    try:
        return subprocess.run(
            ["git", *args], cwd=REPO, capture_output=True, text=True, check=True
        ).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "?"


def cpu_model() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "?"


def _filesystem(path: str) -> str:
    best, fstype = "", "?"
    try:
        with open("/proc/mounts") as f:
            for line in f:
                parts = line.split()
                mnt = parts[1]
                inside = path.startswith(mnt.rstrip("/") + "/") or path == mnt
                if inside and len(mnt) >= len(best):
                    best, fstype = mnt, parts[2]
    except OSError:
        pass
    return f"{fstype} ({best})"


def _fmt(x: float) -> str:
    return f"{x:,.0f}"


def render(
    cells: list[Cell], args: argparse.Namespace, command: str, tmp_root: str, elapsed: float
) -> str:
    by_key = {c.key: c for c in cells}
    lines: list[str] = []
    add = lines.append
    core_dirty = git("status", "--porcelain", "--", "core")
    add("# Embedded brokers: ackwise (`sqlite://`, `memory://`) vs Huey (`SqliteHuey`)")
    add("")
    add(
        f"Date: {dt.datetime.now(dt.UTC).strftime('%Y-%m-%d %H:%M UTC')}. "
        f"{args.runs} runs, {args.tasks:,} tasks per cell; every cell's figure is the **median** "
        f"of the runs, each run's figure follows it. Whole benchmark: {elapsed:.0f} s."
    )
    add("")
    add(f"Rerun: `{command}`")
    add("")
    add("## Machine")
    add("")
    add(f"- CPU: {os.cpu_count()} cores (`nproc` {len(os.sched_getaffinity(0))}), {cpu_model()}")
    add(
        f"- OS: {platform.system()} {platform.release()}; temp dir {tmp_root} on {_filesystem(tmp_root)}"
    )
    add(f"- Python {platform.python_version()} ({platform.python_implementation()}), "
        f"SQLite {sqlite3.sqlite_version}")  # fmt: skip
    add(
        f"- ackwise {_version('ackwise')} (git {git('rev-parse', '--short', 'HEAD')}"
        f"{', core/ has uncommitted changes' if core_dirty else ''}), "
        f"msgspec {_version('msgspec')}, pluggy {_version('pluggy')}; huey {_version('huey')}"
    )
    add("")
    add("## Drain: one worker process, 20,000 no-op tasks pre-filled (tasks started per second)")
    add("")
    add("| system | broker | config | median tasks/s | runs | worker CPU µs/task (median) |")
    add("|---|---|---|---:|---|---:|")
    for c in cells:
        if c.kind != "drain" or not c.values:
            continue
        cpu = c.cpu_median
        add(
            f"| {c.system} | {c.broker} | {c.config} | **{_fmt(c.median)}** | "
            f"{' / '.join(_fmt(v) for v in c.values)} | {'-' if cpu is None else _fmt(cpu)} |"
        )
    add("")
    add("## Enqueue: one producer thread (tasks per second)")
    add("")
    add("| system | broker | how | median tasks/s | runs |")
    add("|---|---|---|---:|---|")
    for c in cells:
        if c.kind != "enqueue" or not c.values:
            continue
        add(
            f"| {c.system} | {c.broker} | {c.config} | **{_fmt(c.median)}** | "
            f"{' / '.join(_fmt(v) for v in c.values)} |"
        )
    add("")
    add("## Ratios ackwise / Huey (medians; > 1: ackwise faster)")
    add("")
    add("| comparison | ackwise | Huey | ratio |")
    add("|---|---:|---:|---:|")
    for label, a, h in RATIOS:
        ca, ch = by_key.get(a), by_key.get(h)
        if ca is None or ch is None or not ca.values or not ch.values:
            continue
        add(f"| {label} | {_fmt(ca.median)} | {_fmt(ch.median)} | {ca.median / ch.median:.2f} |")
    add("")
    add("## Targets")
    add("")
    add("| target | measured | met |")
    add("|---|---|---|")
    target = by_key.get("drain-sqlite-threads-8")
    if target is not None and target.values:
        add(
            f"| `sqlite://` drain, late ack, threads -c 8 >= 3,000 tasks/s (issue 2) | "
            f"{_fmt(target.median)} tasks/s | {'yes' if target.median >= 3000 else 'NO'} |"
        )
    for c, want in ((1, 1.5), (8, 4.0)):
        ca, ch = by_key.get(f"drain-sqlite-threads-{c}"), by_key.get(f"drain-huey-{c}")
        if ca is None or ch is None or not ca.values or not ch.values:
            continue
        r = ca.median / ch.median
        add(
            f"| `sqlite://` drain, concurrency {c} >= {want}x SqliteHuey (issue 19) | "
            f"{_fmt(ca.median)} vs {_fmt(ch.median)}: {r:.2f}x | {'yes' if r >= want else 'NO'} |"
        )
    notes = [n for c in cells for n in c.notes]
    if notes:
        add("")
        add("Warnings:")
        for n in notes:
            add(f"- {n}")
    add("")
    add("## Method")
    add("")
    add(METHOD.strip())
    add("")
    return "\n".join(lines)


METHOD = f"""
- **Delivery guarantees differ.** ackwise runs its default, `Ack.LATE`: a message is deleted
  from the broker only after the task returned (at least once; the acks of one loop round go in
  one transaction). Huey deletes the message when it dequeues it, before the task runs (at most
  once: a crash mid-task loses it). ackwise does strictly more broker work per task.
- **Durability matched.** ackwise `sqlite://` defaults to WAL + `synchronous=NORMAL` (no fsync
  per commit; survives any process crash). Huey is given the same (`PRAGMA synchronous=NORMAL`
  on its connections, `bench/benchmod_huey.py`); its own default (SQLite's `FULL`, an fsync per
  commit) is shown as an extra enqueue row. Every cell uses a fresh database file in a fresh temp
  dir on the local disk.
- **Drain**: the queue is pre-filled with {{tasks}} no-op tasks (ackwise with
  `send_many`, Huey with one bulk `INSERT` of `huey.serialize_task()` messages: the prefill is
  not measured), then ONE worker process is started (`python -m ackwise --loglevel WARNING
  worker benchmod:app --pool P -c N`; `python -m huey.bin.huey_consumer benchmod_huey.huey -k
  thread -w N -q`, i.e. Huey's per-task INFO log lines off; ackwise logs nothing per task).
  Rate = (started - 1) / (last start - first start), over the starts inside the first
  {WINDOW:.0f} s after the first start (all of them when the drain is shorter). Process start-up
  and import time are therefore excluded. The worker is stopped (SIGTERM) afterwards.
- **Start timestamps** come from inside the worker: the no-op task's only statement is
  `startlog.mark()` (one `time.time()` + `list.append`, < 1 µs, paid identically by both
  systems). A daemon thread in every process that imported the task module appends new
  timestamps to `<dir>/<pid>.f64` every {startlog.FLUSH_EVERY} s (prefork children included);
  the driver only stats/reads those files, so it never touches the broker or the worker's
  database during the drain. `memory://` runs in the driver process and reads the list directly.
- **Worker CPU µs/task**: utime + stime of the worker process and all its descendants (prefork
  children), read from `/proc/<pid>/stat` every 20 ms by the driver (50 ms for in-process
  `memory://`, where the figure covers the whole driver process), linearly interpolated at the
  first and last counted start, divided by (started - 1). Resolution: one 10 ms clock tick.
- **Enqueue**: one producer thread, {{tasks}} tasks (at most {ENQUEUE_CAP:.0f} s), after one
  untimed call that opens the connection. ackwise `delay()` is one `BEGIN IMMEDIATE`
  transaction per task; `send_many` publishes {BATCH} tasks in one transaction. Huey has no
  batch publish: one transaction per task.
- `memory://` is in-process only: enqueue and the `Worker` (in a thread) share the driver's
  process and GIL, so it shows the worker's own overhead without a broker round trip.
- Prefetch: ackwise default (automatic: 4 x concurrency, deepening to 64 on `sqlite://` while
  tasks are short; a threads pool takes about 5 ms of work beyond its idle threads). Lease 30 s
  (no renewal falls in a 10 s window).
- Noise: this is a shared 2-core VM; run-to-run spread is shown next to each median.
"""


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--tasks", type=int, default=20_000)
    parser.add_argument("--out", default=str(BENCH_DIR / "results-embedded.md"))
    parser.add_argument(
        "--only", default="", help="comma-separated cell key prefixes (default: all cells)"
    )
    args = parser.parse_args()
    cells = plan()
    if args.only:
        prefixes = [p.strip() for p in args.only.split(",") if p.strip()]
        cells = [c for c in cells if any(c.key.startswith(p) for p in prefixes)]
    command = " ".join(
        ["uv run --group bench python bench/embedded.py", shlex.join(sys.argv[1:])]
    ).strip()
    started = time.monotonic()
    tmp_root = tempfile.mkdtemp(prefix="ackwise-bench-")
    try:
        for run in range(1, args.runs + 1):
            for c in cells:
                cell_dir = Path(tmp_root) / f"run{run}-{c.key}"
                cell_dir.mkdir()
                result = c.run(cell_dir, args.tasks)
                if isinstance(result, Drain):
                    c.values.append(result.rate)
                    if result.cpu_us is not None:
                        c.cpu.append(result.cpu_us)
                    if result.started > args.tasks:
                        c.notes.append(
                            f"{c.key} run {run}: {result.started} starts for {args.tasks} tasks"
                        )
                    if result.left is not None and result.left != args.tasks - result.started:
                        c.notes.append(
                            f"{c.key} run {run}: {result.left} messages left in the queue after "
                            f"{result.started} of {args.tasks} started and the worker stopped"
                        )
                    detail = (
                        f"{result.rate:9,.0f} tasks/s  ({result.counted} starts in "
                        f"{result.span:.2f} s, cpu "
                        f"{'-' if result.cpu_us is None else f'{result.cpu_us:.0f}'} µs/task, "
                        f"{result.left} left after stop)"
                    )
                else:
                    c.values.append(result)
                    detail = f"{result:9,.0f} tasks/s"
                print(f"run {run}  {c.key:24s} {detail}", file=sys.stderr, flush=True)
    finally:
        subprocess.run(["rm", "-rf", tmp_root], check=False)
    text = render(
        cells, args, command, os.path.dirname(tmp_root), time.monotonic() - started
    ).replace("{tasks}", f"{args.tasks:,}")
    Path(args.out).write_text(text)
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
