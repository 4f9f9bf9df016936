"""The Redis result store (docs/results.md): write-once, expiry, a wait woken by the write."""

from __future__ import annotations

import threading
import time
import uuid

import pytest

from ackwise import App, ResultState, TaskResult, open_result_store
from ackwise.errors import TaskFailed
from ackwise.testing import run_worker


def _record(mid: str, state: ResultState, **fields: str) -> TaskResult:
    return TaskResult(id=mid, state=state.value, at=time.time(), **fields)


def test_a_success_is_written_once(redis_url: str) -> None:
    store = open_result_store(redis_url)
    try:
        mid = uuid.uuid4().hex
        store.put([_record(mid, ResultState.STARTED)])
        store.put([_record(mid, ResultState.SUCCEEDED, value="1")])
        store.put([_record(mid, ResultState.SUCCEEDED, value="2")])
        store.put([_record(mid, ResultState.FAILED, error="late")])
        got = store.get(mid)
        assert got is not None and (got.state, got.value) == ("succeeded", "1")
        other = uuid.uuid4().hex
        store.put([_record(other, ResultState.DEAD, reason="max_deliveries")])
        store.put([_record(other, ResultState.STARTED)])
        assert store.get(other).state == "dead"  # type: ignore[union-attr]
    finally:
        store.close()


def test_records_expire_with_the_ttl(redis_url: str) -> None:
    store = open_result_store(redis_url, ttl=0.2)
    try:
        mid = uuid.uuid4().hex
        store.put([_record(mid, ResultState.SUCCEEDED, value="1")])
        assert store.get(mid) is not None
        time.sleep(0.35)
        assert store.get(mid) is None
    finally:
        store.close()


def test_a_wait_is_woken_by_the_write_not_by_polling(redis_url: str) -> None:
    store, writer = open_result_store(redis_url), open_result_store(redis_url)
    try:
        mid = uuid.uuid4().hex
        assert store.wait(mid, 0.05) is None
        written: list[float] = []

        def write() -> None:
            written.append(time.monotonic())  # before: the waiter may wake before put returns
            writer.put([_record(mid, ResultState.SUCCEEDED, value='"x"')])

        threading.Timer(0.3, write).start()
        got = store.wait(mid, 10)
        woke = time.monotonic()
        assert got is not None and got.value == '"x"'
        assert woke - written[0] < 0.5, "woken by the publish, not at the next 1 s check"
    finally:
        store.close()
        writer.close()


def test_a_worker_on_redis_stores_results_in_the_same_redis(redis_url: str) -> None:
    app = App("r", broker=redis_url, store_results=True)

    @app.task(name="r.double")
    def double(x: int) -> int:
        return 2 * x

    @app.task(name="r.boom")
    def boom() -> None:
        raise KeyError("gone")

    ok, bad = double.delay(21), boom.delay()
    with run_worker(app):
        assert ok.get(timeout=20) == 42
        with pytest.raises(TaskFailed, match="KeyError"):
            bad.get(timeout=20)
    assert app.result_store_url == redis_url
    app.close()


def test_forget_deletes_the_keys(redis_url: str) -> None:
    store = open_result_store(redis_url)
    try:
        mid = uuid.uuid4().hex
        store.put([_record(mid, ResultState.SUCCEEDED, value="1")])
        store.forget([mid])
        assert store.get(mid) is None
    finally:
        store.close()
