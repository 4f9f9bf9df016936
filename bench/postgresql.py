"""PostgreSQL benchmark: ackwise (postgresql://) vs Procrastinate, in one run, on one private
PostgreSQL server.  See ``bench/README.md`` for the method.

    uv run --group bench python bench/postgresql.py [--runs 3] [--tasks 20000]
                                                    [--out bench/results-postgresql.md] [--only PREFIXES]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import _common  # embedded.Drain, startlog, CPU sampling: the shared method
import psycopg
from _common import Cell, Drain
from pgbench import pg_tasks

from ackwise_conformance.brokers import provide

#: Enqueue cells stop after this many seconds even when not all tasks were sent.
ENQUEUE_CAP = 5.0
BATCH = 500

WORKER_ENV = _common.worker_env("pgbench")

#: One database per system on the one server.
DATABASES = {"ackwise": "bench_ackwise", "procrastinate": "bench_procrastinate"}
#: What a cell leaves behind, emptied before the next one (TRUNCATE ... RESTART IDENTITY).
TABLES = {
    "ackwise": ["ackwise_messages", "ackwise_queues"],
    "procrastinate": [
        "procrastinate_jobs",
        "procrastinate_events",
        "procrastinate_periodic_defers",
        "procrastinate_workers",
    ],
}
#: The Procrastinate worker's setting that matches ackwise's storage: a finished job's row is
#: deleted (ackwise deletes a message's row at its ack).  Procrastinate's default keeps it
#: (``never``: status ``succeeded``).
DELETE_JOBS = "successful"


def database(system: str) -> str:
    """``procrastinate-sync`` runs in Procrastinate's database."""
    return "procrastinate" if system.startswith("procrastinate") else "ackwise"


# -- the server -----------------------------------------------------------------------------
class Server:
    """A private PostgreSQL server on a free port, one database per system, emptied per cell."""

    def __init__(self, tmp: Path) -> None:
        # Always a private server, never the one a test run may name in the environment: the
        # driver creates and drops databases on it.
        os.environ.pop("ACKWISE_TEST_POSTGRESQL_URL", None)
        self.handle = provide("postgresql", tmp_dir=tmp, durable=False)
        # The server's process tree (runner, postmaster, every backend): its CPU is sampled
        # during drains.
        self.pid = _common.server_pid(self.handle)
        admin = psycopg.connect(self.handle.url, autocommit=True)
        try:
            self.version = str(admin.execute("SHOW server_version").fetchone()[0])  # type: ignore[index]
            self.settings = ", ".join(
                f"{name}={admin.execute(f'SHOW {name}').fetchone()[0]}"  # type: ignore[index]
                for name in ("fsync", "synchronous_commit", "full_page_writes", "shared_buffers")
            )
            for db in DATABASES.values():
                admin.execute(f"DROP DATABASE IF EXISTS {db}")
                admin.execute(f"CREATE DATABASE {db}")
        finally:
            admin.close()
        parts = urlsplit(self.handle.url)
        self.urls = {
            system: urlunsplit(parts._replace(path=f"/{db}")) for system, db in DATABASES.items()
        }
        self.conns = {
            system: psycopg.connect(url, autocommit=True) for system, url in self.urls.items()
        }
        # Procrastinate's schema (tables, functions, triggers), once: its own schema manager.
        app = pg_tasks.make_procrastinate_app(self.urls["procrastinate"], "setup")
        app.open()
        try:
            app.schema_manager.apply_schema()
        finally:
            app.close()

    def url(self, system: str) -> str:
        return self.urls[database(system)]

    def clean(self) -> None:
        """Empty both systems' tables (nothing runs between cells: no lock is waited for)."""
        for system, names in TABLES.items():
            conn = self.conns[system]
            rows = conn.execute(
                "SELECT tablename FROM pg_tables WHERE schemaname = current_schema() "
                "AND tablename = ANY(%s)",
                (names,),
            ).fetchall()
            if rows:
                listed = ", ".join(r[0] for r in rows)
                conn.execute(f"TRUNCATE {listed} RESTART IDENTITY CASCADE")  # type: ignore[arg-type]

    def analyze(self, system: str) -> None:
        """Planner statistics of the pre-filled table (the same step for both systems)."""
        table = "procrastinate_jobs" if database(system) == "procrastinate" else "ackwise_messages"
        self.conns[database(system)].execute(f"ANALYZE {table}")  # type: ignore[arg-type]

    def left(self, system: str, queue: str) -> int:
        """Tasks still waiting or claimed after the worker stopped (not started, or unfinished)."""
        if database(system) == "ackwise":
            adapter = pg_tasks.make_ackwise_app(self.url(system), queue).adapter()
            adapter.open()
            try:
                st = adapter.stats(queue)
            finally:
                adapter.close()
            return st.ready + st.delayed + st.in_flight
        row = (
            self.conns["procrastinate"]
            .execute(
                "SELECT count(*) FROM procrastinate_jobs WHERE queue_name = %s "
                "AND status IN ('todo', 'doing')",
                (queue,),
            )
            .fetchone()
        )
        return int(row[0])  # type: ignore[index]

    def failed(self, system: str, queue: str) -> int:
        """Procrastinate jobs that ended other than succeeded (they keep their row)."""
        if database(system) == "ackwise":
            return 0
        row = (
            self.conns["procrastinate"]
            .execute(
                "SELECT count(*) FROM procrastinate_jobs WHERE queue_name = %s "
                "AND status NOT IN ('todo', 'doing', 'succeeded')",
                (queue,),
            )
            .fetchone()
        )
        return int(row[0])  # type: ignore[index]

    def stop(self) -> None:
        for conn in self.conns.values():
            conn.close()
        self.handle.stop()


def _queue(kind: str) -> str:
    return f"{kind}-{uuid.uuid4().hex[:8]}"


# -- enqueue --------------------------------------------------------------------------------
def enq_ackwise(s: Server, tasks: int, batch: int | None) -> float:
    s.clean()
    app = pg_tasks.make_ackwise_app(s.url("ackwise"), _queue("enq"))
    return _common.enqueue_ackwise(app, tasks, batch, ENQUEUE_CAP)


def enq_procrastinate(s: Server, tasks: int, batch: int | None) -> float:
    """Procrastinate's ``defer()`` (``batch`` None) or ``batch_defer`` of ``batch`` jobs."""
    s.clean()
    app = pg_tasks.make_procrastinate_app(s.url("procrastinate"), _queue("enq"))
    app.open()  # synchronous: a psycopg ConnectionPool, as a web process would use
    noop = app.bench_noop
    noop.defer()  # connect: not timed
    try:
        if batch is None:
            return _common.timed(_common.hundred(noop.defer), tasks, ENQUEUE_CAP)
        kwargs: list[dict[str, Any]] = [{} for _ in range(batch)]

        def many() -> int:
            noop.batch_defer(*kwargs)
            return batch

        return _common.timed(many, tasks, ENQUEUE_CAP)
    finally:
        app.close()


# -- prefill (not measured) -----------------------------------------------------------------
def prefill_ackwise(s: Server, system: str, queue: str, tasks: int) -> None:
    app = pg_tasks.make_ackwise_app(s.url(system), queue)
    try:
        for i in range(0, tasks, BATCH):
            app.send_many([app.bench_noop.s() for _ in range(min(BATCH, tasks - i))])
    finally:
        app.close()


def prefill_procrastinate(s: Server, system: str, queue: str, tasks: int) -> None:
    app = pg_tasks.make_procrastinate_app(s.url(system), queue)
    app.open()
    try:
        for i in range(0, tasks, BATCH):
            app.bench_noop.batch_defer(*({} for _ in range(min(BATCH, tasks - i))))
    finally:
        app.close()


# -- workers --------------------------------------------------------------------------------
def worker_cmd(system: str, concurrency: int, queue: str, python: str | None = None) -> list[str]:
    if database(system) == "procrastinate":
        delete = "never" if system == "procrastinate-keep" else DELETE_JOBS
        return [
            *(sys.executable, "-m", "procrastinate", "--app", "pg_tasks.procrastinate_app"),
            *("--log-level", "warning", "worker", "--queues", queue),
            *("--concurrency", str(concurrency), "--delete-jobs", delete),
        ]
    return _common.worker_cmd("pg_tasks", "ackwise", "threads", concurrency, python)


def start_worker(
    s: Server, system: str, concurrency: int, queue: str, cell: Path, python: str | None = None
) -> _common.WorkerProc:
    env = dict(WORKER_ENV)
    env.update(PG_BENCH_URL=s.url(system), PG_BENCH_QUEUE=queue, PG_BENCH_SYSTEM=system)
    return _common.start_worker(worker_cmd(system, concurrency, queue, python), env, cell)


def drain(
    s: Server, system: str, concurrency: int, tasks: int, cell: Path, python: str | None = None
) -> tuple[Drain, float]:
    s.clean()
    queue = _queue("drain")
    PREFILL[database(system)](s, system, queue, tasks)
    s.analyze(system)
    w = start_worker(s, system, concurrency, queue, cell, python)
    result, server_us = _common.follow_drain(w, tasks, f"{system} x{concurrency}", also=s.pid)
    result.left = s.left(system, queue)
    failed = s.failed(system, queue)
    if failed:
        raise RuntimeError(f"{system} x{concurrency}: {failed} job(s) failed")
    return result, server_us


PREFILL: dict[str, Callable[[Server, str, str, int], None]] = {
    "ackwise": prefill_ackwise,
    "procrastinate": prefill_procrastinate,
}


# -- latency --------------------------------------------------------------------------------
def latency(s: Server, system: str, cell: Path) -> tuple[float, ...]:
    """(p50 ms, p99 ms, achieved send rate) at a steady RATE, concurrency 1."""
    s.clean()
    queue = _queue("lat")
    url = s.url(system)
    send: Callable[[float], Any]
    if system == "ackwise":
        app: Any = pg_tasks.make_ackwise_app(url, queue)
        send = app.bench_noop.delay
    else:
        app = pg_tasks.make_procrastinate_app(url, queue)
        app.open()
        noop = app.bench_noop

        def send(sent: float) -> None:
            noop.defer(sent=sent)

    try:
        w = start_worker(s, system, 1, queue, cell)
        return _common.measure_latency(w, send, f"{system} latency")
    finally:
        app.close()


# -- the plan -------------------------------------------------------------------------------
def plan(baseline: str | None = None) -> list[Cell]:
    """Every cell; with ``baseline`` (``--baseline``'s interpreter) ackwise's drains twice."""
    cells = [
        Cell("enq-ackwise", "enqueue", "ackwise", "`delay()`, one call per task",
             lambda s, c, n: enq_ackwise(s, n, None)),
        Cell("enq-ackwise-batch", "enqueue", "ackwise", f"`send_many`, chunks of {BATCH}",
             lambda s, c, n: enq_ackwise(s, n, BATCH)),
        Cell("enq-procrastinate", "enqueue", "procrastinate", "`defer()`, one call per task",
             lambda s, c, n: enq_procrastinate(s, n, None)),
        Cell("enq-procrastinate-batch", "enqueue", "procrastinate",
             f"`batch_defer`, chunks of {BATCH}", lambda s, c, n: enq_procrastinate(s, n, BATCH)),
    ]  # fmt: skip
    drains = [
        ("ackwise", 1, "threads x1, late ack, prefetch auto (4)"),
        ("procrastinate", 1, f"concurrency 1, `async def` task, delete-jobs {DELETE_JOBS}"),
        ("procrastinate-sync", 1, f"concurrency 1, `def` task (thread), delete-jobs {DELETE_JOBS}"),
        (
            "procrastinate-keep",
            1,
            "concurrency 1, `async def` task, delete-jobs never (its default)",
        ),
        ("ackwise", 8, "threads x8, late ack, prefetch auto (32)"),
        ("procrastinate", 8, f"concurrency 8, `async def` task, delete-jobs {DELETE_JOBS}"),
    ]
    for system, c, text in drains:
        cells.append(
            Cell(
                f"drain-{system}-{c}",
                "drain",
                system,
                text,
                lambda s, cell, n, system=system, c=c: drain(s, system, c, n, cell),
            )
        )
        if system == "ackwise" and baseline:
            cells.append(
                Cell(
                    f"drain-{system}-{c}-baseline",
                    "drain",
                    "ackwise-baseline",
                    text,
                    lambda s, cell, n, c=c: drain(s, "ackwise", c, n, cell, baseline),
                )
            )
    lat = [
        ("ackwise", "threads x1"),
        ("procrastinate", "concurrency 1, `async def` task, LISTEN/NOTIFY on"),
    ]
    for system, text in lat:
        cells.append(
            Cell(
                f"lat-{system}",
                "latency",
                system,
                text,
                lambda s, cell, n, system=system: latency(s, system, cell),
            )
        )
    return cells


# -- report ---------------------------------------------------------------------------------
def _ratio_rows(cells: list[Cell]) -> list[str]:
    by = {c.key: c for c in cells if c.values}
    out: list[str] = []

    def row(name: str, a_key: str, b_key: str, unit: str, p99: bool = False) -> None:
        if a_key not in by or b_key not in by:
            return
        a, b = by[a_key], by[b_key]
        av = statistics.median(a.extra) if p99 else a.median
        bv = statistics.median(b.extra) if p99 else b.median
        shown = (lambda v: f"{v:.2f} {unit}") if unit == "ms" else _common.fmt
        out.append(f"| {name} | {shown(av)} | {shown(bv)} | **{av / bv:.2f}x** |")

    row("drain, concurrency 1 (tasks/s)", "drain-ackwise-1", "drain-procrastinate-1", "/s")
    row("drain, concurrency 8 (tasks/s)", "drain-ackwise-8", "drain-procrastinate-8", "/s")
    row(
        "drain, concurrency 1, vs a `def` task (tasks/s)",
        "drain-ackwise-1",
        "drain-procrastinate-sync-1",
        "/s",
    )
    row(
        "drain, concurrency 1, vs its default `--delete-jobs never` (tasks/s)",
        "drain-ackwise-1",
        "drain-procrastinate-keep-1",
        "/s",
    )
    row("enqueue, one call per task (tasks/s)", "enq-ackwise", "enq-procrastinate", "/s")
    row("enqueue, batches of 500 (tasks/s)", "enq-ackwise-batch", "enq-procrastinate-batch", "/s")
    row("latency p50 (lower is better)", "lat-ackwise", "lat-procrastinate", "ms")
    row("latency p99 (lower is better)", "lat-ackwise", "lat-procrastinate", "ms", p99=True)
    return out


def render(
    cells: list[Cell], args: argparse.Namespace, command: str, elapsed: float, s: Server,
    load: tuple[float, float], head: str, tree: str,
) -> str:  # fmt: skip
    versions = ", ".join(
        f"{d} {_common.version(d)}"
        for d in (
            "ackwise",
            "ackwise-postgresql",
            "psycopg",
            "psycopg-binary",
            "psycopg-pool",
            "procrastinate",
        )
    )
    lines = [
        "# PostgreSQL benchmark: ackwise vs Procrastinate (same run, same PostgreSQL)",
        "",
        *_common.run_header(args.runs, args.tasks, elapsed, load, head, tree),
        "",
        f'Server: PostgreSQL {s.version}, private (`provide("postgresql", durable=False)`: '
        f"{s.settings}), on a free port over TCP 127.0.0.1; one database per system "
        f"(`{DATABASES['ackwise']}`, `{DATABASES['procrastinate']}`), tables emptied "
        "(`TRUNCATE`) before every cell.",
        "",
        f"Versions: {versions}",
        "",
        f"Rerun: `{command}`",
        "",
        *_common.enqueue_table(cells, "one producer thread"),
    ]
    lines += _common.drain_table(cells, args.tasks, "PostgreSQL")
    lines += _common.latency_table(cells)
    lines += _common.report_end(
        cells,
        _ratio_rows(cells),
        "ackwise / Procrastinate",
        "procrastinate",
        args.baseline_note,
        "Method and fairness notes",
        METHOD,
    )
    return "\n".join(lines)


METHOD = f"""
- One server for every cell: a private PostgreSQL started for the run
  (`ackwise_conformance.brokers.provide("postgresql", durable=False)`: `initdb`, then `postgres`
  with `fsync=off`, `synchronous_commit=off`, `full_page_writes=off`, `max_connections=200`,
  otherwise PostgreSQL's defaults). Both systems run on it, each in a database of its own,
  over TCP; every table a cell writes is emptied with `TRUNCATE` before the next cell, and the
  pre-filled table gets an `ANALYZE` (both systems) before the worker starts.
- **Delivery guarantees differ.** ackwise acks late (`Ack.LATE`, the default): a receive marks
  rows in flight with a 30 s lease, and the row is deleted after the task returned; a worker
  that dies leaves rows that come back when their lease expires, with no help (at least once).
  Procrastinate marks a fetched job `doing` with the worker's id and, at the end, sets its
  status (here deletes the row, below); a job whose worker died stays `doing` until something
  calls its stalled-job recovery (`JobManager.get_stalled_jobs` with heartbeats, then a retry:
  the application schedules that itself). Neither system loses a started-but-unfinished task
  silently, but only ackwise re-runs it by itself.
- **Row kept or deleted.** Procrastinate's worker keeps finished jobs by default
  (`--delete-jobs never`: an `UPDATE` to `succeeded`, plus a row in `procrastinate_events` per
  status change, by trigger). The cells here use `--delete-jobs {DELETE_JOBS}`, ackwise's
  storage outcome (the row of a finished task is gone); its event rows are still written.
  The row `procrastinate-keep` is its default (`never`), at concurrency 1.
- **Wake-ups**: both LISTEN/NOTIFY, both on (the defaults): ackwise's idle receive LISTENs on
  its queue's channel, every publish NOTIFYs at commit; Procrastinate's worker LISTENs
  (`listen_notify=True`), an insert trigger NOTIFYs; its polling interval (5 s) is a fallback
  only.
- **Fetching**: ackwise takes a batch per receive (one `UPDATE ... FOR UPDATE SKIP LOCKED`
  statement; automatic prefetch, which on PostgreSQL is 4 x concurrency: 4 at c = 1, 32 at
  c = 8) and acks in batches; Procrastinate fetches one job per call of `procrastinate_fetch_job_v2` (`SKIP
  LOCKED`) and finishes each with its own call, on a `psycopg_pool.AsyncConnectionPool` with
  its defaults (4 connections) plus one LISTEN connection. Procrastinate creates that pool
  with `check=AsyncConnectionPool.check_connection` (fixed, unless one passes a pool of
  one's own): every connection taken from the pool is first checked with an
  empty query, one more round trip per database call (fetch, finish; `defer` too).
- **Execution**: ackwise `python -m ackwise worker pg_tasks:ackwise_app --pool threads -c N`
  runs each task on an executor thread. Procrastinate `python -m procrastinate --app
  pg_tasks.procrastinate_app worker --queues Q --concurrency N --delete-jobs {DELETE_JOBS}`
  (one process, asyncio) runs an `async def` task on its event loop (its cheapest path, the
  headline rows) and a `def` task in a thread (`sync_to_async`, the extra row
  `procrastinate-sync`, the shape of ackwise's threads pool). Both log at WARNING.
- **Enqueue**: one producer thread, up to the task count or {ENQUEUE_CAP:.0f} s, after one
  untimed call that connects. ackwise `delay()` (one transaction per task) and `send_many` in
  chunks of {BATCH} (one multi-row `INSERT` per chunk); Procrastinate `defer()` (one call of
  its `procrastinate_defer_jobs_v1` per task) and `batch_defer` of {BATCH} jobs, on its
  synchronous connector (`app.open()`: a psycopg `ConnectionPool`).
- **Drain**: the queue is pre-filled (not timed: ackwise `send_many`, Procrastinate
  `batch_defer`, chunks of {BATCH}), then ONE worker process. Rate = tasks started per second
  from the first start to the last, within at most 10 s of the first. Worker CPU: utime + stime
  of the worker process (from `/proc`, every 20 ms) over the same span, per task; PostgreSQL
  CPU: the same for the server's whole process tree (postmaster and every backend, the
  driver's idle ones included): what each system's SQL costs the database. On 2 cores the
  server and the worker share the machine. After the worker stopped, the rows left waiting or
  claimed must equal the tasks never started (else a warning).
- **Latency**: the worker warmed up, the producer sends one task every 5 ms (1,000 tasks, after
  20 warm-up tasks) with its `time.time()` as the argument, the task records now - sent.
  Concurrency 1 for both systems.
- The machine is a shared 2-core VM: compare within a run; rerun a cell with `--only`.
"""


def main() -> int:
    return _common.run_report(
        "postgresql",
        "postgresql.py",
        "results-postgresql.md",
        __doc__,
        plan,
        Server,
        lambda s: f"PostgreSQL {s.version}: {s.settings}",
        render,
    )


if __name__ == "__main__":
    sys.exit(main())
