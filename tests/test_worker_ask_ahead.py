"""The worker's receive read later (``Adapter.receive_later``): on Redis, the one adapter that
answers it later; the adapter's own checks are in the SPI suite and in
adapters/redis/tests/test_redis_adapter.py."""

from __future__ import annotations

import math
import time
import uuid
from typing import Any

import pytest

from ackwise import App, Worker, WorkerConfig
from ackwise.testing import run_worker
from ackwise.worker._holdings import Posted
from ackwise_conformance.brokers import BrokerHandle


def test_a_graceful_stop_gives_back_what_a_receive_asked_for_at_once(
    private_redis: BrokerHandle,
) -> None:
    # What a receive asked for and not read yet is leased to this worker: a graceful stop
    # reads it and returns it with the buffer, instead of leaving it to its lease (30 s).
    app, queue = _app(private_redis)

    @app.task(queue=queue)
    def noop() -> None:
        pass

    for _ in range(3):
        noop.delay()
    worker = Worker(app, WorkerConfig(queues=[queue], pool="threads", concurrency=1))
    connected = worker.connection.open

    def connect_then_ask_then_stop(*args: Any) -> bool:
        ok = connected(*args)
        # (a receive elsewhere loads the script: an unknown one would fail, leasing nothing)
        worker.adapter.receive(f"{queue}-none", max_messages=1, wait=0, lease=1.0)
        answer = worker.adapter.receive_later(queue, max_messages=3, lease=30.0)
        assert answer is not None
        worker.ledger.posted = Posted(answer, queue, 3, math.inf)
        assert worker.adapter.stats(queue).in_flight == 3  # leased as asked
        worker.request_stop()
        return ok

    worker.connection.open = connect_then_ask_then_stop  # type: ignore[method-assign]
    assert worker.run() == 0
    st = app.adapter().stats(queue)
    assert (st.ready, st.in_flight) == (3, 0)
    app.close()


@pytest.mark.parametrize("concurrency", [1, 4])
def test_a_drain_that_asks_ahead_runs_every_task_once_and_settles_all(
    private_redis: BrokerHandle, concurrency: int
) -> None:
    app, queue = _app(private_redis)
    runs: dict[int, int] = {}

    @app.task(queue=queue)
    def count(i: int) -> None:
        runs[i] = runs.get(i, 0) + 1

    n = 3000
    for start in range(0, n, 500):
        app.send_many([count.s(i) for i in range(start, start + 500)])
    with run_worker(app, queues=[queue], concurrency=concurrency) as w:
        asked = _count_calls(w.worker.adapter, "receive_later")
        report = w.join(60)
    assert len(report.succeeded) == n
    assert runs == dict.fromkeys(range(n), 1)
    assert asked[0] > 0, "the worker never asked ahead: this test checks nothing"
    st = app.adapter().stats(queue)
    assert (st.ready, st.in_flight) == (0, 0)
    app.close()


def _app(broker: BrokerHandle) -> tuple[App, str]:
    """An app on ``broker`` and a queue of this test's own."""
    return App("ahead", broker=broker.url), f"ahead-{uuid.uuid4().hex[:8]}"


def _count_calls(obj: Any, name: str) -> list[int]:
    """Count the calls of ``obj.name`` from now on (the method still runs)."""
    calls = [0]
    method = getattr(obj, name)

    def counted(*args: Any, **kwargs: Any) -> Any:
        calls[0] += 1
        return method(*args, **kwargs)

    setattr(obj, name, counted)
    return calls


def test_a_queue_that_runs_dry_is_not_asked_ahead_once_per_task(
    private_redis: BrokerHandle,
) -> None:
    # Asking ahead pays off while a queue holds more than a receive takes; for a trickle it
    # would add a receive script call per task.
    app, queue = _app(private_redis)

    @app.task(queue=queue)
    def nap() -> None:
        time.sleep(0.005)

    with run_worker(app, queues=[queue], concurrency=2) as w:
        asked = _count_calls(w.worker.adapter, "receive_later")
        for _ in range(20):
            nap.delay()
            time.sleep(0.02)
        report = w.join(30)
    assert len(report.succeeded) == 20
    assert asked[0] == 0
    app.close()
