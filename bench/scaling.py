"""Scaling benchmark: ackwise's drain rate with 1, 2 and 4 worker processes on Redis, RabbitMQ and
PostgreSQL, with the workers' and the broker's CPU per task.  See ``bench/README.md``.

    uv run --group bench python bench/scaling.py [--runs 3] [--tasks 20000]
                                                 [--out bench/results-scaling.md] [--only PREFIXES]

``--only`` takes comma-separated prefixes of the cell keys ``<broker>-<processes>``: ``redis``,
``rabbitmq``, ``postgresql``, or one cell such as ``redis-4``.
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
import tempfile
import time
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import _common  # the drain method shared by every benchmark in bench/
import embedded
import postgresql
import rabbitmq
import redis_peers
from _common import Cell, Drain, WorkerProc
from pgbench import pg_tasks
from rabbitbench import rabbit_tasks
from redisbench import redis_tasks

PROCESSES = (1, 2, 4)
#: Every worker process: the pool and concurrency of the other benchmarks' "x8" drain cells.
POOL = "threads"
CONCURRENCY = 8
#: Seconds for every worker of a cell to run its first warm-up task.
STARTUP = 60.0
#: One warm-up task every this many seconds until every worker ran one.
TRICKLE = 0.02
#: After the warm-up: time for the late acks of its last tasks to reach the broker.
SETTLE = 0.3


# -- the brokers ----------------------------------------------------------------------------
class Target:
    """One private broker and how a cell drives ackwise on it (the broker drivers' helpers)."""

    name = ""
    title = ""
    pid: int | None = None  # the broker's process tree, sampled during the drain
    where = ""  # the broker, for the report

    def reset(self) -> None:
        """Empty what the previous cell left (before any worker starts)."""

    def app(self, queue: str) -> Any:
        raise NotImplementedError

    def prefill(self, queue: str, tasks: int) -> None:
        raise NotImplementedError

    def start(self, queue: str, cell: Path) -> WorkerProc:
        raise NotImplementedError

    def left(self, queue: str, never: int) -> int:
        """Tasks still waiting or in flight once the workers stopped."""
        raise NotImplementedError

    def discard(self, queue: str) -> None:
        """Delete the cell's queue where the broker keeps it otherwise."""

    def stop(self) -> None:
        raise NotImplementedError


class Redis(Target):
    name, title = "redis", "Redis"

    def __init__(self, tmp: Path) -> None:
        self.server = redis_peers.Server(tmp)
        self.pid = self.server.pid
        version = self.server.client.info("server")["redis_version"]
        self.where = (
            f"Redis {version}, a private redis-server on a free port (no persistence), "
            "flushed before every cell"
        )

    def reset(self) -> None:
        self.server.flush()

    def app(self, queue: str) -> Any:
        return redis_tasks.make_ackwise_app(self.server.url, queue)

    def prefill(self, queue: str, tasks: int) -> None:
        redis_peers.prefill_ackwise(self.server.url, queue, tasks)

    def start(self, queue: str, cell: Path) -> WorkerProc:
        url = self.server.url
        return redis_peers.start_worker("ackwise", POOL, CONCURRENCY, url, queue, cell)

    def left(self, queue: str, never: int) -> int:
        return self.server.left(queue)

    def stop(self) -> None:
        self.server.stop()


class RabbitMQ(Target):
    name, title = "rabbitmq", "RabbitMQ"

    def __init__(self, tmp: Path) -> None:
        self.broker = rabbitmq.Broker(tmp)
        self.pid = self.broker.pid
        self.where = (
            f"RabbitMQ {self.broker.version}, {self.broker.where}; ackwise's default queue type "
            "(quorum), a fresh queue per cell"
        )

    def app(self, queue: str) -> Any:
        return rabbit_tasks.make_ackwise_app(self.broker.url, queue)

    def prefill(self, queue: str, tasks: int) -> None:
        rabbitmq.prefill_ackwise(self.broker, self.broker.url, queue, tasks)

    def start(self, queue: str, cell: Path) -> WorkerProc:
        url = self.broker.url
        return rabbitmq.start_worker("ackwise", POOL, CONCURRENCY, url, queue, cell)

    def left(self, queue: str, never: int) -> int:
        return self.broker.left(queue, never)

    def discard(self, queue: str) -> None:
        self.broker.delete(queue)

    def stop(self) -> None:
        self.broker.stop()


class PostgreSQL(Target):
    name, title = "postgresql", "PostgreSQL"

    def __init__(self, tmp: Path) -> None:
        self.server = postgresql.Server(tmp)
        self.pid = self.server.pid
        self.where = (
            f"PostgreSQL {self.server.version}, a private server on a free port over TCP "
            f"({self.server.settings}), tables emptied (`TRUNCATE`) before every cell"
        )

    def reset(self) -> None:
        self.server.clean()

    def app(self, queue: str) -> Any:
        return pg_tasks.make_ackwise_app(self.server.url("ackwise"), queue)

    def prefill(self, queue: str, tasks: int) -> None:
        postgresql.prefill_ackwise(self.server, "ackwise", queue, tasks)
        self.server.analyze("ackwise")

    def start(self, queue: str, cell: Path) -> WorkerProc:
        # postgresql.worker_cmd: ackwise's threads pool, like POOL
        return postgresql.start_worker(self.server, "ackwise", CONCURRENCY, queue, cell)

    def left(self, queue: str, never: int) -> int:
        return self.server.left("ackwise", queue)

    def stop(self) -> None:
        self.server.stop()


TARGETS: dict[str, Callable[[Path], Target]] = {
    "redis": Redis,
    "rabbitmq": RabbitMQ,
    "postgresql": PostgreSQL,
}
TITLES = {"redis": Redis.title, "rabbitmq": RabbitMQ.title, "postgresql": PostgreSQL.title}


# -- one cell -------------------------------------------------------------------------------
def signal_all(workers: Sequence[WorkerProc], sig: signal.Signals) -> None:
    """``sig`` to every worker's process group (each worker leads its own session)."""
    for w in workers:
        try:
            os.killpg(w.proc.pid, sig)
        except ProcessLookupError:
            pass


def warm_up(t: Target, queue: str, workers: Sequence[WorkerProc], what: str) -> None:
    """Trickle warm-up tasks until every worker ran one (imported, connected, receiving), then
    wait until all of them ran."""

    def fail(why: str) -> None:
        for w in workers:
            sys.stderr.write(w.log_tail())
        raise RuntimeError(f"{what}: {why}")

    app = t.app(queue)
    sent = 0
    deadline = time.monotonic() + STARTUP
    try:
        while any(w.count() == 0 for w in workers):
            if not all(w.alive() for w in workers):
                fail("a worker exited during the warm-up")
            if time.monotonic() > deadline:
                fail(f"not every worker ran a warm-up task within {STARTUP:.0f}s")
            app.bench_noop.delay(-1.0)  # the warm-up marker of startlog.record
            sent += 1
            time.sleep(TRICKLE)
        while sum(w.count() for w in workers) < sent:
            if time.monotonic() > deadline:
                fail(f"the {sent} warm-up tasks did not all run within {STARTUP:.0f}s")
            time.sleep(0.05)
    finally:
        app.close()
    time.sleep(SETTLE)


def drain(
    t: Target, processes: int, cell: Path, tasks: int, notes: list[str]
) -> tuple[Drain, float]:
    """``processes`` workers on one queue: started and warmed up on the empty queue, paused
    (SIGSTOP) while it is pre-filled, resumed together once the CPU samplers run."""
    what = f"{t.name} x{processes} processes"
    queue = f"scaling-{uuid.uuid4().hex[:8]}"
    t.reset()
    workers: list[WorkerProc] = []
    try:
        for i in range(1, processes + 1):
            workers.append(t.start(queue, cell / f"worker-{i}"))
        warm_up(t, queue, workers, what)
        signal_all(workers, signal.SIGSTOP)
        for w in workers:  # the warm-up's starts: paused workers write none until resumed
            for f in w.starts.glob("*.f64"):
                f.unlink()
        t.prefill(queue, tasks)
        result, broker_us = _common.follow_drain(
            workers, tasks, what, also=t.pid, go=lambda: signal_all(workers, signal.SIGCONT)
        )
        result.left = t.left(queue, tasks - result.started)
        idle = [str(i) for i, w in enumerate(workers, 1) if w.count() == 0]
        if idle:
            notes.append(f"{cell.name}: worker(s) {', '.join(idle)} started no task")
        return result, broker_us
    finally:
        if any(w.alive() for w in workers):  # a failure before follow_drain stopped them
            signal_all(workers, signal.SIGCONT)
            _common.stop_workers(workers)
        t.discard(queue)


@dataclass
class Scale(Cell):
    broker: str = ""
    processes: int = 1


def plan() -> list[Scale]:
    cells: list[Scale] = []
    for broker in TARGETS:
        for k in PROCESSES:
            notes: list[str] = []  # the cell's own list: drain() adds its warnings
            cells.append(
                Scale(
                    f"{broker}-{k}",
                    "drain",
                    broker,
                    f"{k} x `--pool {POOL} -c {CONCURRENCY}`",
                    lambda t, cell, n, k=k, notes=notes: drain(t, k, cell, n, notes),
                    notes=notes,
                    broker=broker,
                    processes=k,
                )
            )
    return cells


def rotate(cells: list[Scale], run: int) -> list[Scale]:
    """Run ``run``'s order of one broker's cells: each process count comes first in turn."""
    k = (run - 1) % len(cells)
    return cells[k:] + cells[:k]


# -- report ---------------------------------------------------------------------------------
def speedup(c: Scale, one: Scale | None) -> str:
    return f"{c.median / one.median:.2f}x" if one is not None and one.values else "-"


def render(
    cells: list[Scale], args: argparse.Namespace, command: str, elapsed: float,
    load: tuple[float, float], head: str, tree: str, where: dict[str, str],
) -> str:  # fmt: skip
    cpus = os.cpu_count() or 1
    over = [k for k in PROCESSES if k > cpus]
    measured = [c for c in cells if c.values]
    by = {(c.broker, c.processes): c for c in measured}
    brokers = [b for b in TARGETS if any(c.broker == b for c in measured)]
    versions = ", ".join(
        f"{d} {_common.version(d)}"
        for d in (
            "ackwise",
            "ackwise-redis",
            "ackwise-rabbitmq",
            "ackwise-postgresql",
            "redis",
            "hiredis",
            "pika",
            "psycopg",
        )
    )
    lines = [
        "# Scaling benchmark: ackwise's drain with 1, 2, 4 worker processes "
        "(Redis, RabbitMQ, PostgreSQL)",
        "",
        *_common.run_header(args.runs, args.tasks, elapsed, load, head, tree),
        "",
        f"**This host has {cpus} CPUs**, shared by the broker, the driver and every worker "
        "process"
        + (
            f": {' and '.join(map(str, over))} worker processes oversubscribe it, so those rows "
            "show what extra processes cost on a full machine, not parallel headroom"
            if over
            else ""
        )
        + ". Absolute rates vary between hosts and runs: only ratios within this file compare.",
        "",
        "Brokers (one at a time, a fresh one per run): "
        + "; ".join(where[b] for b in brokers if b in where)
        + ".",
        "",
        f"Versions: {versions}",
        "",
        f"Rerun: `{command}`",
        "",
        "## Ratios (drain rate with N worker processes / with 1, medians)",
        "",
        "| broker | 1 process (tasks/s) | "
        + " | ".join(f"{k} processes" for k in PROCESSES[1:])
        + " |",
        "|---|---:|" + "---:|" * len(PROCESSES[1:]),
    ]
    for b in brokers:
        one = by.get((b, 1))
        shown = [speedup(by[b, k], one) if (b, k) in by else "-" for k in PROCESSES[1:]]
        lines.append(
            f"| {TITLES[b]} | {_common.fmt(one.median) if one else '-'} | "
            + " | ".join(shown)
            + " |"
        )
    for b in brokers:
        lines += [
            "",
            f"## {TITLES[b]}: drain of {args.tasks:,} no-op tasks (tasks started/s, median)",
            "",
            "| worker processes | tasks/s | speed-up vs 1 process | worker CPU µs/task (all "
            "processes) | broker CPU µs/task | runs (tasks/s) |",
            "|---:|---:|---:|---:|---:|---|",
        ]
        for k in PROCESSES:
            if (b, k) not in by:
                continue
            c = by[b, k]
            lines.append(
                f"| {k} | {_common.fmt(c.median)} | {speedup(c, by.get((b, 1)))} | "
                f"{_common.fmt(c.median_of(c.cpu))} | {_common.fmt(c.median_of(c.extra))} | "
                f"{_common.runs(c.values)} |"
            )
    lines += _common.report_end(cells, [], "", "", "", "Method", METHOD)
    return "\n".join(lines)


METHOD = f"""
- **Brokers**: one at a time, each started for the run and stopped after its cells
  (`ackwise_conformance.brokers.provide(name, durable=False)` on free ports: redis-server
  without persistence; RabbitMQ, whose queues are quorum queues whatever `durable` says;
  PostgreSQL with `fsync=off`, `synchronous_commit=off`; the `ACKWISE_TEST_*_URL` variables
  are ignored), through the Redis, RabbitMQ and PostgreSQL drivers' own helpers
  (`redis_peers.py`, `rabbitmq.py`, `postgresql.py`: their servers, pre-fill, worker start
  and counts of what is left). Runs are interleaved: every cell of run 1, then of run 2, and
  so on, each broker fresh for each run; within a broker the order of the process counts
  rotates from run to run (each count comes first once in three runs), so the first cell
  after a broker's start is not always the same one.
- **Workers**: N processes of `python -m ackwise worker <tasks>:ackwise_app --pool {POOL} -c
  {CONCURRENCY}` (the task modules of the drivers above: one no-op task, late ack, the
  default; automatic prefetch), all on one queue.
- **Start**: the workers start on the empty queue; warm-up tasks are sent one every
  {TRICKLE * 1000:.0f} ms until every worker has run one (imported, connected, receiving),
  then they are all paused (SIGSTOP), their warm-up starts deleted, the queue pre-filled
  (`send_many`, chunks of 500; PostgreSQL: then `ANALYZE`), and they are resumed together
  (SIGCONT) once the CPU samplers run. Why: a worker takes 0.3 to 0.5 s from its start to
  its first task, and a drain is short (20,000 tasks from Redis: about 0.4 s with 4
  processes); started cold on a full queue, 4 workers' first starts spread over about 0.1 s
  (measured on Redis on a 2-CPU host: a quarter of the drain, run by fewer processes) and the
  late ones' start-up CPU would count as the drain's. A broker may hand
  messages to a paused worker's pending receive (RabbitMQ pushes up to the prefetch to each
  consumer); the 30 s lease outlasts the pause.
- **Figures**: rate = tasks started per second from the first start (any worker) to the last,
  within at most 10 s of the first (`embedded.drain_figures`, as every drain in `bench/`).
  Worker CPU: utime + stime of every worker process (and its children), read from `/proc`
  every 20 ms, over the same span, summed, per task. Broker CPU: the same for the broker's
  process tree (redis-server; the RabbitMQ node; PostgreSQL's postmaster and every backend,
  the driver's idle connections included). Speed-up: the median rate with N processes over
  the median with one. After the workers stopped, the tasks left waiting or in flight must
  equal the tasks never started (else a warning).
- The broker, the driver and the workers share this host's CPUs (see above): the curve shows
  what adding processes does on this machine; compare within this file only.
"""


def main() -> int:
    args, command = _common.parse_args(
        __doc__.splitlines()[0], "scaling.py", "results-scaling.md", baseline=False
    )
    cells = _common.select(plan(), args.only)
    if not cells:
        sys.exit(f"--only {args.only!r}: no cell (keys: <broker>-<processes>, e.g. redis-4)")
    for name in TARGETS:  # always private brokers, never one named in the environment
        os.environ.pop(f"ACKWISE_TEST_{name.upper()}_URL", None)
    started = time.monotonic()
    load_start = os.getloadavg()[0]
    tree_start = _common.tree_state()
    head_start = embedded.git("rev-parse", "HEAD")
    where: dict[str, str] = {}
    with tempfile.TemporaryDirectory(prefix="ackwise-bench-scaling-") as tmp:
        for run in range(1, args.runs + 1):
            for broker, start in TARGETS.items():
                mine = [c for c in cells if c.broker == broker]
                if not mine:
                    continue
                target = start(Path(tmp) / f"{broker}-{run}")
                where[broker] = target.where
                print(f"run {run}: {target.where}", file=sys.stderr, flush=True)
                try:
                    _common.run_cells(
                        rotate(mine, run), target, Path(tmp), 1, args.tasks, width=12, first=run
                    )
                finally:
                    target.stop()
    load = (load_start, os.getloadavg()[0])
    _common.note_tree_change(cells, tree_start, head_start)
    text = render(
        cells, args, command, time.monotonic() - started, load, head_start, tree_start, where
    )
    Path(args.out).write_text(text)
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
