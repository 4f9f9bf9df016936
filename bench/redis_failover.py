"""What a Redis failover loses: publishes confirmed by a primary that is SIGKILLed mid-stream.

    uv run --group bench python bench/redis_failover.py [--trials 5] [--out bench/results-redis-failover.md]

For each trial and each setting of ``wait_replicas`` (0: Redis' default asynchronous
replication; 1: each publish waits until the replica holds it), a private sentinel set (a
master, one replica, three sentinels, ``redis-server`` on free ports) is started, producer
threads publish single messages as fast as they can, and the master is SIGKILLed while they
do.  Once the sentinels promoted the replica, the new master's queue is read out: a message
whose publish returned, and that is not there, was lost.  Not a throughput benchmark: the
figure is the count of lost confirmed messages.
"""

from __future__ import annotations

import argparse
import datetime as dt
import os
import platform
import statistics
import sys
import tempfile
import time
import uuid
from pathlib import Path

BENCH_DIR = Path(__file__).resolve().parent
sys.path.insert(0, str(BENCH_DIR.parent / "adapters" / "redis" / "tests"))

from embedded import cpu_model, git  # noqa: E402
from redis_topologies import LocalSentinels, publish_through_failover  # noqa: E402

PRODUCERS = 4
PUBLISH_FOR = 1.0  # seconds of publishing before the kill


def trial(wait_replicas: int) -> tuple[int, int, int, float]:
    """(confirmed, lost, unconfirmed found anyway, failover seconds) of one trial."""
    with tempfile.TemporaryDirectory() as tmp:
        deployment = LocalSentinels(Path(tmp)).start()
        try:
            query = f"prefix=f-{uuid.uuid4().hex[:8]}&wait_replicas={wait_replicas}"
            o = publish_through_failover(
                deployment, query, producers=PRODUCERS, publish_for=PUBLISH_FOR
            )
            kept = (o.present & o.attempted) - o.confirmed
            return len(o.confirmed), len(o.lost), len(kept), o.failover
        finally:
            deployment.stop()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trials", type=int, default=5)
    parser.add_argument("--out", default=str(BENCH_DIR / "results-redis-failover.md"))
    args = parser.parse_args()
    started = time.monotonic()
    load = os.getloadavg()[0]
    rows = []
    results: dict[int, list[tuple[int, int, int, float]]] = {0: [], 1: []}
    for n in range(args.trials):
        for wait in (0, 1):  # interleaved
            r = trial(wait)
            results[wait].append(r)
            print(
                f"trial {n + 1} wait_replicas={wait}: confirmed {r[0]}, lost {r[1]}, "
                f"unconfirmed but kept {r[2]}, failover {r[3]:.1f} s",
                file=sys.stderr,
            )
    for wait, runs in results.items():
        rows.append(
            f"| {wait} | {statistics.median(r[0] for r in runs):,.0f} | "
            f"{sum(r[1] for r in runs)} ({', '.join(str(r[1]) for r in runs)}) | "
            f"{sum(r[2] for r in runs)} | {statistics.median(r[3] for r in runs):.1f} |"
        )
    now = dt.datetime.now(dt.UTC).strftime("%Y-%m-%d %H:%M UTC")
    text = "\n".join(
        [
            "# Redis failover: confirmed publishes lost when the master dies",
            "",
            f"Run {now}, git {git('rev-parse', '--short', 'HEAD')}; "
            f"{platform.python_implementation()} {platform.python_version()}, "
            f"{os.cpu_count()} CPUs ({cpu_model()}); load average {load:.2f} at the start, "
            f"{os.getloadavg()[0]:.2f} at the end; {args.trials} trials per setting, "
            f"interleaved; {(time.monotonic() - started) / 60:.1f} min.",
            "",
            f"Rerun: `uv run --group bench python bench/redis_failover.py --trials {args.trials}`",
            "",
            f"Each trial: a master, one replica and three sentinels (down-after 1 s) from "
            f"`redis-server` on free ports; {PRODUCERS} producer threads publish one message "
            f"per call for {PUBLISH_FOR:g} s, then the master is SIGKILLed; after the "
            "promotion the new master's queue is read out.",
            "",
            "| wait_replicas | confirmed publishes per trial (median) | confirmed but lost "
            "(all trials; each) | unconfirmed but kept | failover s (median) |",
            "|---:|---:|---|---:|---:|",
            *rows,
            "",
        ]
    )
    Path(args.out).write_text(text)
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
