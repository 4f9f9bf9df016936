"""The Redis rate limiter (docs/rate-limits.md): slots shared by every connection, on the
server's clock, gone once passed."""

from __future__ import annotations

import itertools
import time
import uuid

import pytest

from ackwise import App, open_rate_limiter
from ackwise.testing import run_worker


def test_connections_share_the_slots_of_a_task(redis_url: str) -> None:
    a, b = open_rate_limiter(redis_url), open_rate_limiter(redis_url)
    key = f"t-{uuid.uuid4().hex}"
    try:
        waits = [a.reserve(key, 1.0), b.reserve(key, 1.0), a.reserve(key, 1.0)]
        assert waits[0] == 0.0
        assert 0.9 < waits[1] <= 1.0 and 1.9 < waits[2] <= 2.0
        a.forget(key)
        assert b.reserve(key, 0.05) == 0.0
        time.sleep(1.2)  # the slot has passed and the key expired with it
        assert b.reserve(key, 0.05) == 0.0
    finally:
        a.forget(key)
        a.close()
        b.close()


def test_a_start_is_recorded_only_an_interval_after_the_last_one(redis_url: str) -> None:
    a, b = open_rate_limiter(redis_url), open_rate_limiter(redis_url)
    key = f"t-{uuid.uuid4().hex}"
    try:
        assert a.start(key, 1.0) == 0.0
        assert 0.9 < b.start(key, 1.0) <= 1.0
        assert 0.8 < b.start(key, 1.0) <= 1.0  # a refused start records nothing
        assert 0.9 < a.reserve(key, 1.0) <= 1.0  # slots count from the recorded start
        a.forget(key)
        assert b.reserve(key, 1.0) == 0.0 and 0.9 < b.reserve(key, 1.0) <= 1.0
        assert b.start(key, 1.0) == 0.0  # the first start; slots reserved ahead stay
        assert 1.9 < a.reserve(key, 1.0) <= 2.0
        a.forget(key)
        assert a.start(key, 1.0, margin=0.5) == 0.0  # recorded as begun half a second on
        assert 1.4 < b.start(key, 1.0) <= 1.5 and 1.4 < b.reserve(key, 1.0) <= 1.5
        a.forget(key)
        assert a.start(key, 0.05) == 0.0
        time.sleep(1.2)  # the start has passed and its key expired with it
        assert b.start(key, 0.05) == 0.0
    finally:
        a.forget(key)
        a.close()
        b.close()


@pytest.mark.parametrize(
    ("operation", "args", "refused"),
    [
        ("reserve", (0.0,), "bad interval"),
        ("start", (0.0,), "bad interval"),
        ("start", (1.0, -1.0), "bad margin"),
    ],
)
def test_a_bad_interval_or_margin_is_refused_by_the_script(
    redis_url: str, operation: str, args: tuple[float, ...], refused: str
) -> None:
    limiter = open_rate_limiter(redis_url)
    try:
        with pytest.raises(Exception, match=refused):
            getattr(limiter, operation)(f"t-{uuid.uuid4().hex}", *args)
    finally:
        limiter.close()


def test_a_worker_keeps_a_rate_limited_task_to_its_rate(redis_url: str) -> None:
    app = App("rl", broker=redis_url)
    name = f"rl.limited.{uuid.uuid4().hex[:8]}"
    starts: list[float] = []

    @app.task(name=name, queue=f"q-{uuid.uuid4().hex[:8]}", rate_limit="25/s")
    def limited(i: int) -> None:
        starts.append(time.monotonic())

    for i in range(20):
        limited.delay(i)
    try:
        with run_worker(app, concurrency=4) as w:
            w.join(timeout=30)
        times = sorted(starts)
        gaps = [b - a for a, b in itertools.pairwise(times)]
        # 25/s: starts 40 ms apart.  Each is recorded in Redis right before the function (a
        # thread that began late makes the next one wait: CI once saw two starts 20 ms apart
        # when the worker only spaced their slots); the body reads its clock a few
        # instructions later, and half an interval is room for that.
        assert len(times) == 20 and times[-1] - times[0] >= 19 * 0.04 * 0.95, gaps
        assert min(gaps) >= 0.02, gaps
    finally:
        limiter = open_rate_limiter(redis_url)
        limiter.forget(name)
        limiter.close()
        adapter = app.adapter()
        adapter.open()
        adapter.delete_queue(limited.queue)
        adapter.close()
        app.close()
