"""Diagnostic consumer for ``bench/redis_peers.py``: the Redis adapter alone, without the worker.

Loops ``receive(max_messages=4, wait=1.0)`` and ``ack`` on ``$REDIS_BENCH_QUEUE``; each body is
the producer's ``time.time()`` taken just before its publish call, so the recorded value is
the enqueue -> received latency of the adapter and Redis alone (no executor hand-off).
"""

from __future__ import annotations

import os
import time

import startlog

import ackwise
from ackwise.spi import QueueSpec


def main() -> None:
    adapter = ackwise.open_adapter(os.environ["REDIS_BENCH_URL"])
    adapter.open()
    queue = os.environ["REDIS_BENCH_QUEUE"]
    adapter.declare(QueueSpec(queue))
    append = startlog.starts.append
    while True:
        got = adapter.receive(queue, max_messages=4, wait=1.0, lease=30.0)
        now = time.time()
        for d in got:
            sent = float(d.body)
            append(now - sent if sent > 0 else -1.0)
        if got:
            adapter.ack(got)


if __name__ == "__main__":
    main()
