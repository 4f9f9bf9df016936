"""A rate limit shared by workers: ``rate_limit="50/s"`` with two worker processes on one
private redis-server (issue 16: within 10 % of 50/s).

    uv run --group bench python bench/rate_limit.py [--runs 3] [--tasks 600] [--limit 50/s]
                                                    [--workers 2] [--out bench/results-rate-limit.md]

Each run: a fresh queue and task name, ``--tasks`` no-op tasks pre-filled, then ``--workers``
``ackwise worker`` processes (threads, concurrency 4, automatic prefetch) started together;
every task start is timestamped inside the worker (``startlog``).  Figures per run:

- **rate**: starts per second from the first start to the last, ``(n - 1) / span``;
- **busiest second**: the most starts in any window of one second (sliding, start-anchored);
- **split**: the share of the starts each worker process ran (both must take part).

The verdict is on the median rate: within 10 % of the limit, and no second above the limit
(+1 for the window's edge).
"""

from __future__ import annotations

import argparse
import bisect
import datetime as dt
import os
import statistics
import sys
import tempfile
import time
import uuid
from pathlib import Path

import _common
import embedded
import startlog
from redis_peers import Server

from ackwise import App
from ackwise.stores._ratelimit import parse_rate


def busiest_second(starts: list[float]) -> int:
    return max((bisect.bisect_left(starts, t + 1.0) - i for i, t in enumerate(starts)), default=0)


def one_run(server: Server, tmp: Path, run: int, args: argparse.Namespace) -> dict[str, object]:
    queue = f"rate-{uuid.uuid4().hex[:8]}"
    name = f"ratebench.limited.{uuid.uuid4().hex[:8]}"
    env = {
        **_common.worker_env("ratebench"),
        "RATE_BENCH_URL": server.url,
        "RATE_BENCH_QUEUE": queue,
        "RATE_BENCH_LIMIT": args.limit,
        "RATE_BENCH_TASK": name,
    }
    producer = App("ratebench", broker=server.url)
    producer.send_many([producer.signature(name, queue=queue) for _ in range(args.tasks)])
    producer.close()
    cmd = [
        *(sys.executable, "-m", "ackwise", "--loglevel", "WARNING", "worker"),
        *("rate_tasks:ackwise_app", "--pool", "threads", "-c", "4"),
    ]
    workers = [_common.start_worker(cmd, env, tmp / f"run{run}-w{i}") for i in range(args.workers)]
    deadline = time.monotonic() + args.tasks * parse_rate(args.limit) * 2 + 60  # type: ignore[operator]
    try:
        while sum(w.count() for w in workers) < args.tasks:
            if time.monotonic() > deadline or not all(w.alive() for w in workers):
                for w in workers:
                    sys.stderr.write(w.log_tail())
                raise SystemExit(f"run {run}: the drain did not finish")
            time.sleep(0.1)
        time.sleep(3 * startlog.FLUSH_EVERY)
    finally:
        for w in workers:
            _common.stop_worker(w)
    per_worker = [startlog.read_dir(str(w.starts)) for w in workers]
    starts = sorted(t for ts in per_worker for t in ts)
    span = starts[-1] - starts[0]
    return {
        "rate": (len(starts) - 1) / span,
        "busiest": busiest_second(starts),
        "split": [len(ts) for ts in per_worker],
        "span": span,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--tasks", type=int, default=600)
    parser.add_argument("--limit", default="50/s")
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--out", default="bench/results-rate-limit.md")
    args = parser.parse_args()
    interval = parse_rate(args.limit)
    assert interval is not None
    target = 1.0 / interval
    began, load0 = time.time(), os.getloadavg()[0]
    runs: list[dict[str, object]] = []
    with tempfile.TemporaryDirectory(prefix="ratebench-") as tmp_dir:
        tmp = Path(tmp_dir)
        server = Server(tmp)
        try:
            for run in range(1, args.runs + 1):
                r = one_run(server, tmp, run, args)
                print(
                    f"run {run}: {r['rate']:.2f}/s over {r['span']:.1f} s, busiest second "
                    f"{r['busiest']}, split {r['split']}",
                    file=sys.stderr,
                )
                runs.append(r)
                server.flush()
        finally:
            server.stop()
    median = statistics.median(float(r["rate"]) for r in runs)  # type: ignore[arg-type]
    off = (median - target) / target * 100
    busiest = max(int(r["busiest"]) for r in runs)  # type: ignore[call-overload]
    shared = all(min(r["split"]) > 0 for r in runs)  # type: ignore[type-var]
    ok = abs(off) <= 10 and busiest <= target + 1 and shared
    when = dt.datetime.fromtimestamp(began, dt.UTC).strftime("%Y-%m-%d %H:%M UTC")
    lines = [
        f"# Rate limit shared by {args.workers} workers (Redis)",
        "",
        f"Run {when}, git {embedded.git('rev-parse', '--short', 'HEAD')}"
        f"{_common.tree_state()}, CPython {sys.version.split()[0]}, {os.cpu_count()} CPUs, "
        f"private redis-server on a free port; load average {load0:.2f} at the start, "
        f"{os.getloadavg()[0]:.2f} at the end; {args.runs} run(s), {args.tasks} tasks each, "
        f'`rate_limit="{args.limit}"`, {args.workers} `ackwise worker` processes '
        "(threads, -c 4).",
        "",
        "| run | rate (starts/s) | busiest second | starts per worker | span |",
        "|---|---|---|---|---|",
        *(
            f"| {i} | {float(r['rate']):.2f} | {r['busiest']} | "  # type: ignore[arg-type]
            f"{' / '.join(str(n) for n in r['split'])} | {float(r['span']):.1f} s |"  # type: ignore[attr-defined,arg-type]
            for i, r in enumerate(runs, 1)
        ),
        "",
        f"Median rate **{median:.2f}/s** against a limit of {target:g}/s: {off:+.1f} % "
        f"(target: within 10 %); busiest second {busiest} (limit {target:g}, +1 for the "
        f"window's edge); every run shared by all workers: {'yes' if shared else 'no'}. "
        f"Verdict: **{'holds' if ok else 'does not hold'}**.",
        "",
        "Rerun: `uv run --group bench python bench/rate_limit.py` (about a minute).",
    ]
    text = "\n".join(lines) + "\n"
    Path(args.out).write_text(text)
    print(text)
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
