"""A/B of two ackwise trees: this one against a baseline checkout, the drains of Redis,
RabbitMQ and SQLite at concurrency 1 and 8, same run, cells interleaved.

    uv run --group bench python bench/ab.py --baseline OTHER/.venv/bin/python [--runs 5]
                                            [--tasks 20000] [--out bench/results-ab.md]

The baseline is another checkout's interpreter: for "no slower than the commit before the
change", ``git worktree add BEFORE COMMIT && (cd BEFORE && source scripts/_bootstrap.sh)``
(which makes its ``.venv``), then ``--baseline BEFORE/.venv/bin/python``.
Only the worker process runs the baseline's code; the driver pre-fills the queues with this
tree's producer (the envelope is the same) and measures both the same way (the method of
``bench/README.md``: a queue pre-filled with no-op tasks, one ``ackwise worker`` process,
``--pool threads``, late ack, tasks started per second).

Each run measures every pair, the baseline and this tree one after the other, in an order that
alternates from run to run, so a drift of the machine falls on both. The verdict of a pair is
the median of its per-run ratios (this / baseline); the target (issue 38) is ≥ 0.97 for each.
"""

from __future__ import annotations

import argparse
import os
import shlex
import statistics
import sys
import tempfile
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import _common
import embedded
import rabbitmq
import redis_peers
from _common import Cell, Drain

TARGET = 0.97
CONCURRENCY = (1, 8)


def _sqlite(python: str | None, c: int) -> Callable[[Any, Path, int], tuple[Drain, None]]:
    def run(_: Any, cell: Path, tasks: int) -> tuple[Drain, None]:
        return embedded.ackwise_sqlite_drain(cell, tasks, "threads", c, python), None

    return run


def _redis(
    server: redis_peers.Server, python: str | None, c: int
) -> Callable[[Any, Path, int], tuple[Drain, None]]:
    def run(_: Any, cell: Path, tasks: int) -> tuple[Drain, None]:
        return redis_peers.drain(server, "ackwise", "threads", c, tasks, cell, python)

    return run


def _rabbitmq(
    broker: rabbitmq.Broker, python: str | None, c: int
) -> Callable[[Any, Path, int], tuple[Drain, float]]:
    def run(_: Any, cell: Path, tasks: int) -> tuple[Drain, float]:
        return rabbitmq.drain(broker, "ackwise", "threads", c, tasks, cell, False, python)

    return run


def plan(
    baseline: str, redis_server: redis_peers.Server, rabbit: rabbitmq.Broker
) -> list[tuple[Cell, Cell]]:
    """The pairs (this tree, baseline), one per broker and concurrency."""
    pairs = []
    for broker in ("redis", "rabbitmq", "sqlite"):
        for c in CONCURRENCY:
            cells = []
            for python, who in ((None, "this tree"), (baseline, "baseline")):
                if broker == "redis":
                    run = _redis(redis_server, python, c)
                elif broker == "rabbitmq":
                    run = _rabbitmq(rabbit, python, c)
                else:
                    run = _sqlite(python, c)
                key = f"drain-{broker}-{c}" + ("-baseline" if python else "")
                cells.append(Cell(key, "drain", who, f"{broker} threads x{c}", run))
            pairs.append((cells[0], cells[1]))
    return pairs


def run_pairs(pairs: list[tuple[Cell, Cell]], tmp: Path, runs: int, tasks: int) -> None:
    for r in range(1, runs + 1):
        for this, base in pairs:
            order = (this, base) if r % 2 else (base, this)
            for c in order:
                cell_dir = tmp / f"{c.key}-{r}"
                cell_dir.mkdir()
                t = time.monotonic()
                shown = _common.record(c, c.run(None, cell_dir, tasks), r, tasks)
                print(
                    f"run {r} {c.key:<26} {shown}  ({time.monotonic() - t:.1f}s)",
                    file=sys.stderr,
                    flush=True,
                )


def render(
    pairs: list[tuple[Cell, Cell]],
    args: argparse.Namespace,
    command: str,
    elapsed: float,
    load: tuple[float, float],
    head: str,
    tree: str,
    where: str,
) -> str:
    lines = [
        "# A/B: this tree against a baseline checkout (Redis, RabbitMQ, SQLite drains)",
        "",
        *_common.run_header(args.runs, args.tasks, elapsed, load, head, tree),
        "",
        f"Baseline: {args.baseline_note}.",
        "",
        f"Brokers: {where}.",
        "",
        f"## Drain, {args.tasks:,} no-op tasks, one worker process, threads (tasks started/s)",
        "",
        f"Target: each pair's median of per-run ratios ≥ {TARGET}.",
        "",
        "| pair | this tree (median) | baseline (median) | per-run ratios | median ratio | "
        "worker CPU µs/task (this / baseline) | verdict |",
        "|---|---:|---:|---|---:|---|---|",
    ]
    verdicts = []
    for this, base in pairs:
        ratios = [a / b for a, b in zip(this.values, base.values, strict=True) if b]
        ratio = statistics.median(ratios) if ratios else float("nan")
        ok = ratio >= TARGET
        verdicts.append(ok)
        lines.append(
            f"| {this.config} | {_common.fmt(this.median)} | {_common.fmt(base.median)} | "
            f"{', '.join(f'{x:.2f}' for x in ratios)} | **{ratio:.2f}x** | "
            f"{_common.fmt(this.median_of(this.cpu))} / {_common.fmt(base.median_of(base.cpu))} | "
            f"{'met' if ok else 'NOT MET'} |"
        )
    lines += [
        "",
        f"All pairs ≥ {TARGET}: **{'yes' if all(verdicts) else 'no'}**.",
        "",
        "Runs of each cell (tasks/s): "
        + "; ".join(f"{c.key} {_common.runs(c.values)}" for pair in pairs for c in pair if c.values)
        + ".",
    ]
    notes = [n for pair in pairs for c in pair for n in c.notes]
    if notes:
        lines += ["", "## Warnings", "", *(f"- {n}" for n in notes)]
    lines += ["", f"Rerun: `{command}`", ""]
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--baseline", required=True, metavar="PYTHON")
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--tasks", type=int, default=20_000)
    parser.add_argument("--out", default=str(_common.BENCH_DIR / "results-ab.md"))
    args = parser.parse_args()
    # The report names no path of this machine: the baseline by its commit, the interpreter
    # in the rerun line as the docstring's BEFORE.
    note = _common.describe_baseline(args.baseline)
    args.baseline_note = "another checkout of this repository, " + note.rpartition(", ")[2]
    argv = ["BEFORE/.venv/bin/python" if a == args.baseline else a for a in sys.argv[1:]]
    command = f"uv run --group bench python bench/ab.py {shlex.join(argv)}"
    started = time.monotonic()
    load_start = os.getloadavg()[0]
    tree = _common.tree_state()
    head = embedded.git("rev-parse", "HEAD")
    with tempfile.TemporaryDirectory(prefix=f"ackwise-bench-ab-{uuid.uuid4().hex[:6]}-") as tmp:
        server = redis_peers.Server(Path(tmp) / "redis")
        rabbit = rabbitmq.Broker(Path(tmp) / "rabbitmq")
        where = (
            f"a private redis-server {server.client.info('server')['redis_version']}; "
            f"RabbitMQ {rabbit.version}: {rabbit.where}; SQLite: a fresh file per cell"
        )
        try:
            pairs = plan(args.baseline, server, rabbit)
            run_pairs(pairs, Path(tmp), args.runs, args.tasks)
        finally:
            server.stop()
            rabbit.stop()
    load = (load_start, os.getloadavg()[0])
    text = render(pairs, args, command, time.monotonic() - started, load, head, tree, where)
    Path(args.out).write_text(text)
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
