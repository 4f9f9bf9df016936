"""SQS benchmark: ackwise vs Celery's SQS transport, in one run, on one moto server.  See
``bench/README.md`` for the method.

    uv run --group bench python bench/sqs.py [--runs 3] [--tasks 3000]
                                             [--out bench/results-sqs.md] [--only PREFIXES]
                                             [--stock-moto]

Enqueue cells: one call per task (``delay()``), and ackwise's ``send_many`` (``SendMessageBatch``,
10 per call); tasks/s and SQS API calls per task.  Drain cells: a queue pre-filled with
``--tasks`` no-op tasks, one worker process; tasks started per second (first to last start, at
most 10 s), worker and moto CPU per task, SQS API calls per task (counted at moto: one request
log line each, from the worker's start to its stop).  Medians of ``--runs``.
"""

from __future__ import annotations

import argparse
import base64
import datetime as dt
import json
import os
import platform
import shlex
import sys
import tempfile
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

for _name, _value in (
    ("AWS_ACCESS_KEY_ID", "testing"),
    ("AWS_SECRET_ACCESS_KEY", "testing"),
    ("AWS_DEFAULT_REGION", "us-east-1"),
):
    os.environ.setdefault(_name, _value)

import _common  # noqa: E402  (embedded.Drain, startlog, CPU sampling: the shared method)
import boto3  # noqa: E402
import embedded  # noqa: E402
from _common import Cell, Drain  # noqa: E402
from sqsbench import sqs_tasks  # noqa: E402

from ackwise_conformance.brokers import provide  # noqa: E402

BENCH_DIR = Path(__file__).resolve().parent
#: Enqueue cells stop after this many seconds even when not all tasks were sent.
ENQUEUE_CAP = 5.0
PREFILL_BATCH = 500
#: ackwise's worker settings in every drain: its defaults.
ACKWISE = "late ack, prefetch auto (4 x c, up to 64 while tasks are short)"
WORKER_ENV = _common.worker_env("sqsbench")


# -- the broker -----------------------------------------------------------------------------
class Broker:
    """moto's server as the suite runs it (``ackwise_sqs._moto_server``), on a free port.

    Requests are counted from moto's request log (werkzeug writes one line per request).
    Every cell uses a queue of its own, deleted (with ackwise's dead-letter queue) after it.
    """

    def __init__(self, tmp: Path) -> None:
        self.handle: Any = provide("sqs", tmp_dir=tmp)
        self.port: int = self.handle.port
        self.url: str = self.handle.url
        self.celery_url = f"sqs://testing:testing@127.0.0.1:{self.port}"
        # moto's process (its CPU is sampled) and its request log (API calls are counted there).
        self.pid: int = self.handle.pid
        self._log: Path = self.handle.log_path
        self._read = 0
        self._count = 0
        self.client = boto3.client(
            "sqs", endpoint_url=f"http://127.0.0.1:{self.port}", region_name="us-east-1"
        )

    def requests(self) -> int:
        """Requests moto has answered so far."""
        with self._log.open("rb") as f:
            f.seek(self._read)
            data = f.read()
        complete = data[: data.rfind(b"\n") + 1]
        self._read += len(complete)
        self._count += complete.count(b'"POST ')
        return self._count

    def queue_url(self, name: str) -> str:
        return str(self.client.get_queue_url(QueueName=name)["QueueUrl"])

    def left(self, name: str) -> int:
        attrs = self.client.get_queue_attributes(
            QueueUrl=self.queue_url(name),
            AttributeNames=["ApproximateNumberOfMessages", "ApproximateNumberOfMessagesNotVisible"],
        )["Attributes"]
        return sum(int(v) for v in attrs.values())

    def delete(self, name: str) -> None:
        for q in (name, f"{name}-dlq"):
            try:
                self.client.delete_queue(QueueUrl=self.queue_url(q))
            except self.client.exceptions.QueueDoesNotExist:
                pass

    def stop(self) -> None:
        self.handle.stop()


def _cell_queue(kind: str) -> str:
    return f"bench-{kind}-{uuid.uuid4().hex[:10]}"


# -- enqueue --------------------------------------------------------------------------------
def _timed(b: Broker, send: Callable[[], int], tasks: int) -> tuple[float, float]:
    """(tasks/s, API calls per task) of ``send`` called until ``tasks`` were sent or the cap."""
    sent = 0

    def counted() -> int:
        nonlocal sent
        n = send()
        sent += n
        return n

    before = b.requests()
    rate = _common.timed(counted, tasks, ENQUEUE_CAP)
    time.sleep(0.2)  # moto writes its log line after the answer
    return rate, (b.requests() - before) / max(1, sent)


def enq_ackwise(b: Broker, tasks: int, batch: bool) -> tuple[float, float]:
    queue = _cell_queue("enq")
    app = sqs_tasks.make_ackwise_app(b.url, queue)
    try:
        app.bench_noop.delay()  # declares the queue before the clock starts
        if not batch:
            return _timed(b, _common.hundred(app.bench_noop.delay), tasks)

        def many() -> int:
            app.send_many([app.bench_noop.s() for _ in range(PREFILL_BATCH)])
            return PREFILL_BATCH

        return _timed(b, many, tasks)
    finally:
        app.close()
        b.delete(queue)


def enq_celery(b: Broker, tasks: int) -> tuple[float, float]:
    queue = _cell_queue("enq")
    app = sqs_tasks.make_celery_app(b.celery_url, queue)
    try:
        app.bench_noop.delay()  # creates the queue before the clock starts
        return _timed(b, _common.hundred(app.bench_noop.delay), tasks)
    finally:
        app.close()
        b.delete(queue)


# -- prefill --------------------------------------------------------------------------------
def prefill_ackwise(b: Broker, queue: str, tasks: int) -> None:
    app = sqs_tasks.make_ackwise_app(b.url, queue)
    try:
        for i in range(0, tasks, PREFILL_BATCH):
            app.send_many([app.bench_noop.s() for _ in range(min(PREFILL_BATCH, tasks - i))])
    finally:
        app.close()


def prefill_celery(b: Broker, queue: str, tasks: int) -> None:
    """Publish one task through Celery, then copy its message with fresh task ids."""
    app = sqs_tasks.make_celery_app(b.celery_url, queue)
    try:
        app.bench_noop.delay()
    finally:
        app.close()
    url = b.queue_url(queue)
    got = b.client.receive_message(
        QueueUrl=url, MaxNumberOfMessages=1, WaitTimeSeconds=5, MessageAttributeNames=["All"]
    )["Messages"][0]
    b.client.delete_message(QueueUrl=url, ReceiptHandle=got["ReceiptHandle"])
    template = json.loads(base64.b64decode(got["Body"]))
    attributes = got.get("MessageAttributes")

    def fresh() -> str:
        tid = str(uuid.uuid4())
        m = json.loads(json.dumps(template))
        m["headers"].update(id=tid, root_id=tid)
        m["properties"]["correlation_id"] = tid
        return base64.b64encode(json.dumps(m).encode()).decode()

    for i in range(0, tasks, 10):
        entries: list[dict[str, Any]] = [
            {"Id": str(j), "MessageBody": fresh()} for j in range(min(10, tasks - i))
        ]
        if attributes:
            for e in entries:
                e["MessageAttributes"] = attributes
        b.client.send_message_batch(QueueUrl=url, Entries=entries)


# -- workers --------------------------------------------------------------------------------
def worker_cmd(system: str, pool: str, concurrency: int, queue: str) -> list[str]:
    py = sys.executable
    if system == "ackwise":
        return [
            *(py, "-m", "ackwise", "--loglevel", "WARNING", "worker", "sqs_tasks:ackwise_app"),
            *("--pool", pool, "-c", str(concurrency), "--lease", "30"),
        ]
    return [
        *(py, "-m", "celery", "-A", "sqs_tasks:celery_app", "worker", "-l", "WARNING"),
        *("-P", pool, "-c", str(concurrency), "-Q", queue),
        *("--without-gossip", "--without-mingle", "--without-heartbeat"),
    ]


def drain(
    b: Broker,
    system: str,
    pool: str,
    concurrency: int,
    tasks: int,
    cell: Path,
    late: bool = True,
    prefetch: int = 4,
) -> tuple[Drain, float, float]:
    """(drain figures, moto CPU µs per task, API calls per task) of one drain cell."""
    queue = _cell_queue("drain")
    url = b.url if system == "ackwise" else b.celery_url
    try:
        (prefill_ackwise if system == "ackwise" else prefill_celery)(b, queue, tasks)
        env = dict(WORKER_ENV)
        env.update(
            SQS_BENCH_SYSTEM=system,
            SQS_BENCH_URL=url,
            SQS_BENCH_QUEUE=queue,
            SQS_BENCH_CELERY_LATE="1" if late else "",
            SQS_BENCH_CELERY_PREFETCH=str(prefetch),
        )
        before = b.requests()
        w = _common.start_worker(worker_cmd(system, pool, concurrency, queue), env, cell)
        result, moto_us = _common.follow_drain(w, tasks, f"{system} {pool} x{concurrency}", b.pid)
        calls = (b.requests() - before) / max(1, result.started)
        result.left = b.left(queue)
        return result, moto_us, calls
    finally:
        b.delete(queue)


# -- the plan -------------------------------------------------------------------------------
@dataclass
class SQSCell(Cell):
    calls: list[float] = field(default_factory=list)  # SQS API calls per task


def plan() -> list[SQSCell]:
    cells = [
        SQSCell("enq-ackwise", "enqueue", "ackwise", "`delay()`, one call per task",
                lambda b, cell, n: enq_ackwise(b, n, batch=False)),
        SQSCell("enq-ackwise-batch", "enqueue", "ackwise",
                f"`send_many`, chunks of {PREFILL_BATCH} (`SendMessageBatch`, 10 per call)",
                lambda b, cell, n: enq_ackwise(b, n, batch=True)),
        SQSCell("enq-celery", "enqueue", "celery", "`delay()`, one call per task",
                lambda b, cell, n: enq_celery(b, n)),
    ]  # fmt: skip
    drains: list[tuple[str, str, int, bool, int, str]] = [
        ("ackwise", "threads", 8, True, 0, f"threads x8, {ACKWISE}"),
        ("celery", "threads", 8, False, 4, "threads x8, defaults: early ack, prefetch x4"),
        ("celery", "threads", 8, True, 1, "threads x8, acks_late, prefetch x1"),
        ("ackwise", "prefork", 1, True, 0, f"prefork x1, {ACKWISE}"),
        ("celery", "prefork", 1, False, 4, "prefork x1, defaults: early ack, prefetch x4"),
        ("celery", "prefork", 1, True, 1, "prefork x1, acks_late, prefetch x1"),
    ]
    for system, pool, c, late, prefetch, text in drains:
        key = f"drain-{system}-{pool}-{c}" + (
            "" if system == "ackwise" else f"-{'late' if late else 'early'}"
        )
        cells.append(
            SQSCell(
                key,
                "drain",
                system,
                text,
                lambda b, cell, n, system=system, pool=pool, c=c, late=late, prefetch=prefetch: (
                    drain(b, system, pool, c, n, cell, late=late, prefetch=prefetch)
                ),
            )
        )
    return cells


# -- report ---------------------------------------------------------------------------------
def _ratio(cells: dict[str, SQSCell], mine: str, peers: list[str]) -> str:
    a = cells.get(mine)
    have = [cells[k] for k in peers if k in cells and cells[k].values]
    if a is None or not a.values or not have:
        return "-"
    best = max(have, key=lambda c: c.median)
    return (
        f"**{a.median / best.median:.1f}x** the best of them ({best.config}: {best.median:,.1f}/s)"
    )


def render(
    cells: list[SQSCell], args: argparse.Namespace, took: float, where: str, git: str
) -> str:
    by = {c.key: c for c in cells if c.values}
    lines = [
        "# SQS benchmark: ackwise vs Celery's SQS transport (same run, same moto server)",
        "",
        f"Run {dt.datetime.now(dt.UTC):%Y-%m-%d %H:%M} UTC, git {git}, CPython "
        f"{platform.python_version()}, {os.cpu_count()} CPUs; {where}; {args.runs} run(s), "
        f"{args.tasks:,} tasks per drain, {took / 60:.1f} min.",
        "",
        f"Versions: ackwise {_common.version('ackwise')}, boto3 {_common.version('boto3')}, "
        f"moto {_common.version('moto')}, celery {_common.version('celery')}, kombu "
        f"{_common.version('kombu')}.",
        "",
        f"Rerun: `uv run --group bench python bench/{shlex.join(sys.argv).split('bench/', 1)[-1]}`",
        "",
        "Enqueue: one producer, tasks/s (at most "
        f"{ENQUEUE_CAP:.0f} s), SQS API calls per task counted at moto.",
        "",
        "| system | how | tasks/s | API calls/task | runs |",
        "|---|---|---:|---:|---|",
    ]
    lines += _common.rows(
        cells,
        "enqueue",
        lambda c: [f"{c.median:,.0f}", f"{c.median_of(c.calls) or 0:.2f}", _common.runs(c.values)],
    )
    lines += [
        "",
        f"Drain: a queue pre-filled with {args.tasks:,} no-op tasks, one worker process; tasks "
        "started per second (first to last start, at most 10 s); worker and moto CPU per task "
        "over the same span; SQS API calls per task from the worker's start to its stop (its "
        "start-up calls included). Celery: `wait_time_seconds=1`, `polling_interval=0` (faster "
        "than its defaults).",
        "",
        "| system | configuration | tasks/s | worker CPU µs/task | moto CPU µs/task | API "
        "calls/task | runs (tasks/s) |",
        "|---|---|---:|---:|---:|---:|---|",
    ]
    lines += _common.rows(
        cells,
        "drain",
        lambda c: [
            f"{c.median:,.1f}",
            _common.fmt(c.median_of(c.cpu)),
            _common.fmt(c.median_of(c.extra)),
            f"{c.median_of(c.calls) or 0:.3f}",
            _common.runs(c.values, "{:,.1f}"),
        ],
    )
    threads = ["drain-celery-threads-8-early", "drain-celery-threads-8-late"]
    prefork = ["drain-celery-prefork-1-early", "drain-celery-prefork-1-late"]
    calls = (
        by["drain-ackwise-threads-8"].median_of(by["drain-ackwise-threads-8"].calls)
        if "drain-ackwise-threads-8" in by
        else None
    )
    lines += [
        "",
        "Against the issue's targets (drain ≥ 3x Celery's, ≤ 0.5 SQS API calls per task):",
        "",
        f"- ackwise threads x8 vs Celery threads x8: {_ratio(by, 'drain-ackwise-threads-8', threads)}",
        f"- ackwise threads x8 vs every Celery configuration: {_ratio(by, 'drain-ackwise-threads-8', threads + prefork)}",
        f"- ackwise prefork x1 vs Celery prefork x1: {_ratio(by, 'drain-ackwise-prefork-1', prefork)}",
        f"- SQS API calls per task, ackwise threads x8 draining: **{calls:.3f}**" if calls is not None else "- API calls: -",
    ]  # fmt: skip
    notes = [n for c in cells for n in c.notes]
    if notes:
        lines += ["", "Notes:", "", *[f"- {n}" for n in notes]]
    return "\n".join(lines) + "\n"


def main() -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--tasks", type=int, default=3000)
    parser.add_argument("--out", default=str(BENCH_DIR / "results-sqs.md"))
    parser.add_argument("--only", default="", help="comma-separated cell key prefixes")
    parser.add_argument(
        "--stock-moto",
        action="store_true",
        help="moto's own bookkeeping (its cost grows with queue depth); receives stay atomic",
    )
    args = parser.parse_args()
    if args.stock_moto:
        os.environ["ACKWISE_MOTO_BOOKKEEPING"] = "stock"
    where = (
        "moto's server (`ackwise_sqs._moto_server`: atomic receives"
        + (
            "; **stock moto bookkeeping**, whose cost grows with the queue's depth)"
            if args.stock_moto
            else ", bookkeeping whose cost does not grow with the queue's depth)"
        )
        + " on a free port, over HTTP"
    )
    cells = _common.select(plan(), args.only)  # type: ignore[arg-type]
    started = time.monotonic()
    with tempfile.TemporaryDirectory() as d:
        tmp = Path(d)
        b = Broker(tmp)
        try:
            for run in range(1, args.runs + 1):
                for c in cells:
                    cell_dir = tmp / f"{c.key}-{run}"
                    cell_dir.mkdir()
                    if c.kind == "enqueue":
                        rate, calls = c.run(b, cell_dir, args.tasks)
                        c.values.append(rate)
                        c.calls.append(calls)
                        shown = f"{rate:,.0f}/s, {calls:.2f} calls/task"
                    else:
                        result, moto_us, calls = c.run(b, cell_dir, args.tasks)
                        shown = _common.record_drain(c, result, moto_us, run, args.tasks)
                        c.calls.append(calls)
                        shown += f", {calls:.3f} calls/task"
                    print(f"run {run} {c.key}: {shown}", flush=True)
        finally:
            b.stop()
    git = embedded.git("rev-parse", "--short", "HEAD") + _common.tree_state()
    text = render(cells, args, time.monotonic() - started, where, git)  # type: ignore[arg-type]
    Path(args.out).write_text(text)
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
