"""What observability costs: the Redis drain with Prometheus metrics on vs off (and with the
task log at INFO), side by side in one run on one private redis-server.

    uv run --group bench python bench/observability.py [--runs 3] [--tasks 20000]
                                                       [--out bench/results-observability.md]

Cells, interleaved run by run (each a fresh queue pre-filled with ``--tasks`` no-op tasks, one
``ackwise worker`` process, late ack, automatic prefetch; the method of ``bench/README.md``):

- ``off``: ``--loglevel WARNING`` (as every other benchmark here), no metrics;
- ``metrics``: the same plus ``--metrics-port``, scraped once a second during the drain (a
  scrape reads the queue's ``stats()`` too, at most every ``--metrics-stats-interval``: 1 s);
- ``info-log``: ``--loglevel INFO`` (two task-log lines per task, to a file), no metrics.

The target (issue 15): ``metrics`` at most 10 % slower than ``off`` at concurrency 1 and 8.
"""

from __future__ import annotations

import argparse
import datetime as dt
import os
import platform
import socket
import statistics
import sys
import tempfile
import threading
import time
import urllib.request
import uuid
from pathlib import Path

import _common
import embedded
from _common import Cell, Drain
from redis_peers import WORKER_ENV, Server, prefill_ackwise
from redisbench import redis_tasks

CONFIGS = {
    "off": ("--loglevel", "WARNING"),
    "metrics": ("--loglevel", "WARNING"),
    "info-log": ("--loglevel", "INFO"),
}


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _worker_cmd(config: str, concurrency: int, port: int | None) -> list[str]:
    cmd = [
        *(sys.executable, "-m", "ackwise", *CONFIGS[config], "worker"),
        *("redis_tasks:ackwise_app", "--pool", "threads", "-c", str(concurrency)),
    ]
    if port is not None:
        cmd += ["--metrics-port", str(port), "--metrics-host", "127.0.0.1"]
        cmd += ["--metrics-stats-interval", "1"]
    return cmd


class _Scraper(threading.Thread):
    """Scrapes ``/metrics`` once a second, as a (busy) Prometheus would."""

    def __init__(self, port: int) -> None:
        super().__init__(daemon=True)
        self.url = f"http://127.0.0.1:{port}/metrics"
        self.stop = threading.Event()
        self.scrapes = 0

    def run(self) -> None:
        while not self.stop.wait(1.0):
            try:
                urllib.request.urlopen(self.url, timeout=5).read()
                self.scrapes += 1
            except OSError:
                pass  # not listening yet


def drain(
    server: Server, config: str, concurrency: int, tasks: int, cell: Path
) -> tuple[Drain, None]:
    server.flush()
    queue = f"drain-{uuid.uuid4().hex[:8]}"
    prefill_ackwise(server.url, queue, tasks)
    port = _free_port() if config == "metrics" else None
    env = dict(WORKER_ENV)
    env.update(REDIS_BENCH_URL=server.url, REDIS_BENCH_QUEUE=queue, REDIS_BENCH_SYSTEM="ackwise")
    w = _common.start_worker(_worker_cmd(config, concurrency, port), env, cell)
    scraper = _Scraper(port) if port is not None else None
    if scraper is not None:
        scraper.start()
    try:
        result, _ = _common.follow_drain(w, tasks, f"ackwise {config} x{concurrency}")
    finally:
        if scraper is not None:
            scraper.stop.set()
            scraper.join()
    if scraper is not None and scraper.scrapes == 0:
        raise RuntimeError(f"metrics x{concurrency}: /metrics never answered:\n{w.log_tail()}")
    adapter = redis_tasks.make_ackwise_app(server.url, queue).adapter()
    adapter.open()
    st = adapter.stats(queue)
    adapter.close()
    result.left = st.ready + st.delayed + st.in_flight
    return result, None


def plan() -> list[Cell]:
    cells = []
    for c in (1, 8):
        for config in CONFIGS:
            cells.append(
                Cell(
                    f"drain-{config}-{c}",
                    "drain",
                    "ackwise",
                    f"threads x{c}, {config}",
                    lambda s, cell, n, config=config, c=c: drain(s, config, c, n, cell),
                )
            )
    return cells


def render(
    cells: list[Cell], args: argparse.Namespace, command: str, elapsed: float, where: str
) -> str:
    by = {c.key: c for c in cells if c.values}
    runs, tasks = args.runs, args.tasks
    lines = [
        "# Observability overhead: Redis drain, metrics on vs off (same run, same Redis)",
        "",
        f"Run {dt.datetime.now(dt.UTC).strftime('%Y-%m-%d %H:%M UTC')}, git "
        f"{embedded.git('rev-parse', '--short', 'HEAD')}{_common.tree_state()}, "
        f"{platform.python_implementation()} {platform.python_version()}, {os.cpu_count()} CPUs "
        f"({embedded.cpu_model()}), {where}; {runs} run(s) per cell, {tasks:,} tasks, "
        f"{elapsed / 60:.1f} min.",
        "",
        f"Versions: ackwise {_common.version('ackwise')}, redis {_common.version('redis')}, "
        f"prometheus-client {_common.version('prometheus-client')}",
        "",
        f"Rerun: `{command}`",
        "",
        "## Drain (tasks started/s, median)",
        "",
        "| config | tasks/s | worker CPU µs/task | runs | vs off |",
        "|---|---:|---:|---|---:|",
    ]
    for c in cells:
        if not c.values:
            continue
        base = by.get(f"drain-off-{c.key.rsplit('-', 1)[1]}")
        ratio = f"{c.median / base.median:.2f}x" if base else "-"
        cpu = c.median_of(c.cpu)
        lines.append(
            f"| {c.config} | {_common.fmt(c.median)} | {'?' if cpu is None else _common.fmt(cpu)} "
            f"| {_common.runs(c.values)} | {ratio} |"
        )
    lines += [
        "",
        "## Target (issue 15): metrics at most 10 % slower",
        "",
        "Cells run back to back within each run, so each run's metrics / off ratio compares two "
        "drains under the same load on the host; the median of those ratios is the figure "
        "(the ratio of the two medians beside it).",
        "",
        "| cell | median of per-run ratios | per-run ratios | ratio of medians | met (>= 0.90x) |",
        "|---|---:|---|---:|---|",
    ]
    for c in (1, 8):
        on, off = by.get(f"drain-metrics-{c}"), by.get(f"drain-off-{c}")
        if on and off:
            ratios = [a / b for a, b in zip(on.values, off.values, strict=True)]
            paired = statistics.median(ratios)
            lines.append(
                f"| concurrency {c} | **{paired:.2f}x** | {', '.join(f'{r:.2f}' for r in ratios)} "
                f"| {on.median / off.median:.2f}x | {'yes' if paired >= 0.9 else 'NO'} |"
            )
    notes = [n for c in cells for n in c.notes]
    if notes:
        lines += ["", "## Warnings", ""] + [f"- {n}" for n in notes]
    lines.append("")
    return "\n".join(lines)


def main() -> int:
    args, command = _common.parse_args(
        __doc__.splitlines()[0], "observability.py", "results-observability.md"
    )
    cells = _common.select(plan(), args.only)
    started = time.monotonic()
    load_start = os.getloadavg()[0]
    with tempfile.TemporaryDirectory(prefix="ackwise-bench-obs-") as tmp:
        server = Server(Path(tmp) / "redis")
        info = server.client.info("server")
        where = f"private redis-server {info['redis_version']} on a free port (no persistence)"
        try:
            for run in range(1, args.runs + 1):
                # Odd runs in plan order, even runs reversed: no config always goes first.
                order = cells if run % 2 else cells[::-1]
                _common.run_cells(order, server, Path(tmp), 1, args.tasks, width=18, first=run)
        finally:
            server.stop()
    where += f"; load average {load_start:.2f} at the start, {os.getloadavg()[0]:.2f} at the end"
    text = render(cells, args, command, time.monotonic() - started, where)
    Path(args.out).write_text(text)
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
