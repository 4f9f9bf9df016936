"""Task results (docs/results.md): handles, the stores' write-once rule, what a worker writes."""

from __future__ import annotations

import asyncio
import json
import pickle
import threading
import time
import uuid
from pathlib import Path

import pytest

from ackwise import App, ResultState, TaskHandle, TaskResult, open_result_store
from ackwise.errors import ConfigurationError, TaskFailed
from ackwise.testing import run_worker


@pytest.fixture(params=["sqlite", "memory"])
def broker(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path / 'q.db'}"
    return f"memory://{uuid.uuid4().hex}"


@pytest.fixture(params=["sqlite", "memory", "postgresql"])
def store_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    if request.param == "postgresql":  # a schema of the test's own (dropped after it)
        url: str = request.getfixturevalue("pg_schema_url")
        return url
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path / 'results.db'}"
    return f"memory://{uuid.uuid4().hex}"


def _record(mid: str, state: ResultState, **fields: object) -> TaskResult:
    return TaskResult(id=mid, state=state.value, at=time.time(), **fields)  # type: ignore[arg-type]


# -- the stores ------------------------------------------------------------------------------
def test_a_success_is_written_once_and_nothing_replaces_it(store_url):
    store = open_result_store(store_url)
    mid = uuid.uuid4().hex
    try:
        store.put([_record(mid, ResultState.SUCCEEDED, value="1", attempt=1)])
        store.put(
            [
                _record(mid, ResultState.SUCCEEDED, value="2", attempt=2),
                _record(mid, ResultState.FAILED, error="boom", attempt=3),
                _record(mid, ResultState.STARTED, attempt=4),
            ]
        )
        got = store.get(mid)
        assert got is not None and (got.state, got.value, got.attempt) == ("succeeded", "1", 1)
    finally:
        store.forget([mid])
        store.close()


def test_a_failure_gives_way_to_a_later_success_but_not_to_a_late_start(store_url):
    store = open_result_store(store_url)
    mid = uuid.uuid4().hex
    try:
        store.put([_record(mid, ResultState.STARTED, attempt=1)])
        store.put([_record(mid, ResultState.DEAD, reason="max_deliveries", attempt=1)])
        store.put([_record(mid, ResultState.STARTED, attempt=2)])  # a replayed dead letter
        assert store.get(mid).state == "dead"  # type: ignore[union-attr]
        store.put([_record(mid, ResultState.SUCCEEDED, value="[1]", attempt=2)])
        assert store.get(mid).state == "succeeded"  # type: ignore[union-attr]
    finally:
        store.forget([mid])
        store.close()


def test_records_expire_after_the_ttl(store_url):
    store = open_result_store(store_url, ttl=0.2)
    mid = uuid.uuid4().hex
    try:
        store.put([_record(mid, ResultState.SUCCEEDED, value="1")])
        assert store.get(mid) is not None
        time.sleep(0.3)
        assert store.get(mid) is None
        store.put([_record(mid, ResultState.SUCCEEDED, value="2")])  # expired: a new record
        assert store.get(mid).value == "2"  # type: ignore[union-attr]
    finally:
        store.forget([mid])
        store.close()


def test_wait_returns_the_final_record_as_another_thread_writes_it(store_url):
    store = open_result_store(store_url)
    writer = open_result_store(store_url)
    mid = uuid.uuid4().hex
    try:
        assert store.wait(mid, 0.05) is None
        timer = threading.Timer(
            0.2, lambda: writer.put([_record(mid, ResultState.SUCCEEDED, value='"x"')])
        )
        timer.start()
        started = time.monotonic()
        got = store.wait(mid, 10)
        assert got is not None and got.value == '"x"'
        assert time.monotonic() - started < 5
        timer.join()  # its put may still be sweeping: close the writer after it
    finally:
        store.forget([mid])
        store.close()
        writer.close()


# -- handles and workers ---------------------------------------------------------------------
def test_a_stored_return_value_comes_back_through_the_handle(broker):
    app = App("r", broker=broker)

    @app.task(name="r.add", store_results=True)
    def add(a: int, b: int) -> dict[str, int]:
        return {"sum": a + b}

    handle = add.delay(2, 3)
    assert isinstance(handle, TaskHandle) and isinstance(handle, str) and len(handle) == 32
    assert handle.state is ResultState.PENDING and handle.result is None and not handle.ready()
    with run_worker(app):
        assert handle.get(timeout=20) == {"sum": 5}
    assert handle.state is ResultState.SUCCEEDED and handle.ready()
    assert handle.result == {"sum": 5} and handle.error is None
    assert json.dumps({"id": handle}) == json.dumps({"id": str(handle)})
    assert pickle.loads(pickle.dumps(handle)) == handle
    app.close()


def test_a_failure_raises_task_failed_with_its_error_and_traceback(broker):
    app = App("r", broker=broker, store_results=True)

    @app.task(name="r.boom")
    def boom() -> None:
        raise ValueError("no such order")

    handle = boom.delay()
    with run_worker(app):
        with pytest.raises(TaskFailed) as info:
            handle.get(timeout=20)
    failed = info.value
    assert failed.state == "failed" and "ValueError: no such order" in (failed.error or "")
    assert "raise ValueError" in (failed.traceback or "")
    assert str(failed).startswith(f"task r.boom ({handle}) failed: ")
    assert handle.state is ResultState.FAILED
    assert handle.get(timeout=1, propagate=False) is None
    app.close()


def test_a_return_value_that_is_not_json_fails_the_task_with_a_clear_error(broker):
    app = App("r", broker=broker)

    @app.task(name="r.odd", store_results=True)
    def odd() -> object:
        return {"when": {1, 2}}

    handle = odd.delay()
    with run_worker(app):
        with pytest.raises(TaskFailed) as info:
            handle.get(timeout=20)
    assert "returned value['when'] of type set, which is not JSON" in (info.value.error or "")
    app.close()


def test_results_are_opt_in_and_a_handle_of_a_task_without_them_says_so(broker):
    app = App("r", broker=broker)

    @app.task(name="r.quiet")
    def quiet() -> int:
        return 1

    handle = quiet.delay()
    with run_worker(app) as w:
        w.join(timeout=20)
    with pytest.raises(ConfigurationError, match="does not store results"):
        handle.get(timeout=1)
    assert app.results().get(handle.id) is None  # nothing was written
    app.close()


def test_track_started_shows_a_running_task_as_started(broker):
    app = App("r", broker=broker)
    release = threading.Event()

    @app.task(name="r.slow", store_results=True, track_started=True)
    def slow() -> str:
        release.wait(20)
        return "done"

    handle = slow.delay()
    with run_worker(app):
        deadline = time.monotonic() + 20
        while handle.state is not ResultState.STARTED and time.monotonic() < deadline:
            time.sleep(0.01)
        assert handle.state is ResultState.STARTED and not handle.ready()
        with pytest.raises(TimeoutError, match="state started"):
            handle.get(timeout=0.05)
        release.set()
        assert handle.get(timeout=20) == "done"
    app.close()


def test_aget_waits_without_blocking_the_event_loop(broker):
    app = App("r", broker=broker)

    @app.task(name="r.echo", store_results=True)
    def echo(x: str) -> str:
        return x

    async def main() -> tuple[str, int]:
        handle = echo.delay("hi")
        ticks = 0

        async def tick() -> None:
            nonlocal ticks
            while True:
                ticks += 1
                await asyncio.sleep(0.01)

        ticker = asyncio.create_task(tick())
        value = await handle.aget(timeout=20)
        ticker.cancel()
        return value, ticks

    with run_worker(app):
        value, ticks = asyncio.run(main())
    assert value == "hi" and ticks >= 1
    app.close()


def test_send_by_name_returns_a_handle_whose_result_the_worker_stores(tmp_path):
    broker = f"sqlite:///{tmp_path / 'q.db'}"
    producer, consumer = App("front", broker=broker), App("billing", broker=broker)

    @consumer.task(name="billing.charge", store_results=True)
    def charge(cents: int) -> str:
        return f"charged {cents}"

    handle = producer.send("billing.charge", args=[250])
    with run_worker(consumer):
        assert handle.get(timeout=20) == "charged 250"
    producer.close()
    consumer.close()


def test_an_app_without_a_result_store_says_how_to_get_one():
    app = App("r", broker="amqp://guest:guest@127.0.0.1:1/")
    assert app.result_store_url is None
    with pytest.raises(ConfigurationError, match=r"set App\(result_store=URL\)"):
        app.results()


def test_result_ttl_must_be_positive():
    with pytest.raises(ConfigurationError, match="result_ttl"):
        App("r", broker="memory://x", result_ttl=0)


def test_forget_deletes_records_now(store_url):
    store = open_result_store(store_url)
    try:
        a, b = uuid.uuid4().hex, uuid.uuid4().hex
        store.put([_record(a, ResultState.SUCCEEDED, value="1"), _record(b, ResultState.DEAD)])
        store.forget([a, b])
        assert store.get(a) is None and store.get(b) is None
    finally:
        store.close()


def test_a_worker_writes_to_a_postgresql_result_store_and_get_wakes_on_the_notify(
    tmp_path, pg_schema_url
):
    app = App("r", broker=f"sqlite:///{tmp_path / 'q.db'}", result_store=pg_schema_url)

    @app.task(name="r.pg", store_results=True)
    def pg(x: int) -> list[int]:
        return [x, x]

    @app.task(name="r.pgfail", store_results=True)
    def pgfail() -> None:
        raise RuntimeError("nope")

    ok, bad = pg.delay(4), pgfail.delay()
    with run_worker(app):
        assert ok.get(timeout=20) == [4, 4]
        with pytest.raises(TaskFailed, match="RuntimeError: nope"):
            bad.get(timeout=20)
    app.results().forget([ok.id, bad.id])
    app.close()


def test_a_postgresql_wait_is_woken_by_the_notify_not_by_polling(pg_schema_url):
    store, writer = open_result_store(pg_schema_url), open_result_store(pg_schema_url)
    mid = uuid.uuid4().hex
    written: list[float] = []

    def write() -> None:
        written.append(time.monotonic())  # before: the waiter may wake before put returns
        writer.put([_record(mid, ResultState.SUCCEEDED, value="1")])

    timer = threading.Timer(0.3, write)
    try:
        timer.start()
        got = store.wait(mid, 10)
        woke = time.monotonic()
        assert got is not None and got.value == "1"
        assert woke - written[0] < 0.5, "woken by the NOTIFY, not at the next 1 s check"
    finally:
        timer.join()
        store.forget([mid])
        store.close()
        writer.close()


def test_join_counts_each_chord_member_once(store_url):
    store = open_result_store(store_url)
    try:
        chord_id = uuid.uuid4().hex
        assert [store.join(chord_id, m) for m in (0, 1, 1, 0, 2)] == [1, 2, 2, 2, 3]
        store.forget([chord_id])
        assert store.join(chord_id, 0) == 1
        store.forget([chord_id])
    finally:
        store.close()


def test_a_handle_on_an_unknown_task_ends_dead_when_the_worker_gives_it_up(broker):
    # Defect: a message for a task no worker knows was dead-lettered with no result record,
    # so a handle on it waited until its timeout.
    app = App("unknown", broker=broker, store_results=True)

    @app.task(name="known")
    def known() -> None: ...

    handle = app.send("no.such.task")
    with run_worker(app) as w:  # offered 3 times at once (unknown_task_delay=0), then dead
        w.join()
    with pytest.raises(TaskFailed, match=r"no task named 'no\.such\.task'"):
        handle.get(timeout=5)
    assert handle.state is ResultState.DEAD
    app.close()


def test_an_app_that_stores_no_results_writes_no_record_for_an_unknown_task(broker):
    # Defect: a worker wrote the dead record of an unknown task whenever it had a result store
    # (every broker with a store of its own gives one by default), so an app that stores no
    # results left a record a day long (``ackwise conformance`` C16 on Redis:
    # ``{ackwise:result:unknown-…}``).
    app = App("unknown", broker=broker)

    @app.task(name="known")
    def known() -> None: ...

    mid = app.send("no.such.task").id
    with run_worker(app) as w:
        w.join()
    adapter = app.adapter()
    adapter.open()
    try:
        [dead] = adapter.dead_letters("default")
        assert (dead.message_id, dead.reason) == (mid, "unknown_task")
    finally:
        adapter.close()
    assert app.results().get(mid) is None
    app.close()
