"""The task of ``bench/rate_limit.py``: one no-op task with a rate limit, on one Redis.

Every worker imports this module (``bench/ratebench`` and ``bench/`` on ``PYTHONPATH``); the
Redis URL, the queue and the limit come from ``$RATE_BENCH_URL``, ``$RATE_BENCH_QUEUE`` and
``$RATE_BENCH_LIMIT``.  The task body is ``startlog.mark()`` (its start time).
"""

from __future__ import annotations

import os

from startlog import mark

import ackwise

URL = os.environ.get("RATE_BENCH_URL", "redis://127.0.0.1:6379/15")
QUEUE = os.environ.get("RATE_BENCH_QUEUE", "ratebench")
LIMIT = os.environ.get("RATE_BENCH_LIMIT", "50/s")
NAME = os.environ.get("RATE_BENCH_TASK", "ratebench.limited")

ackwise_app = ackwise.App("ratebench", broker=URL)


@ackwise_app.task(name=NAME, queue=QUEUE, rate_limit=LIMIT)
def limited() -> None:
    mark()
