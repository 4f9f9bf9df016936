"""Eager mode (``ackwise.testing.eager``): sends run at once in the sending thread, checked and
encoded as a real publish, with no broker and no worker (docs/testing.md)."""

from __future__ import annotations

import asyncio
import datetime as dt
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

import ackwise
from ackwise import App, ResultState, TaskContext, chain, chord, group
from ackwise.errors import (
    ConfigurationError,
    InvalidPriority,
    InvalidSchedule,
    NotSerializable,
    PublishError,
    TaskFailed,
)
from ackwise.spi import QueueSpec
from ackwise.testing import EagerMode, eager, run_worker

#: A broker no test reaches: nothing listens on port 1 (eager mode never connects).
UNREACHABLE_AMQP = "amqp://guest@127.0.0.1:1/"


@pytest.fixture(params=["memory", "sqlite"])
def app(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[App]:
    """An app on the memory broker or the embedded SQLite broker (both keep results)."""
    if request.param == "memory":
        broker = f"memory://eager-{uuid.uuid4().hex}"
    else:
        broker = f"sqlite:///{tmp_path / 'q.db'}"
    a = App("eager", broker=broker)
    yield a
    a.close()


def _ready(app: App, queue: str = "default") -> int:
    adapter = app.adapter()
    adapter.open()
    try:
        adapter.declare(QueueSpec(queue))
        return adapter.stats(queue).ready + adapter.stats(queue).delayed
    finally:
        adapter.close()


def _refusal(send: Callable[[], Any], error: type[Exception]) -> Exception:
    with pytest.raises(error) as info:
        send()
    return info.value


# -- the same checks as a real publish ---------------------------------------------------------
@pytest.mark.parametrize(
    ("args", "kwargs"),
    [
        ((1, {1, 2}), {}),
        ((1, {"a": [1, object()]}), {}),
        ((), {"when": dt.datetime(2024, 1, 1)}),
        ((b"raw",), {}),
        ((float("nan"),), {}),
        (({1: "int key"},), {}),
        ((2**70,), {}),
    ],
)
def test_a_non_serializable_argument_is_refused_as_a_real_publish_refuses_it(
    app: App, args: tuple[Any, ...], kwargs: dict[str, Any]
) -> None:
    calls: list[Any] = []

    @app.task(name="t")
    def t(*a: Any, **k: Any) -> None:
        calls.append((a, k))

    real = _refusal(lambda: t.apply_async(args, kwargs), NotSerializable)
    with eager(app) as mode:
        refused = _refusal(lambda: t.apply_async(args, kwargs), NotSerializable)
    assert type(refused) is type(real)
    assert str(refused) == str(real)
    assert (refused.path, refused.type_name) == (real.path, real.type_name)  # type: ignore[attr-defined]
    assert calls == [] and mode.sent == []
    assert _ready(app) == 0


def test_every_publish_check_gives_the_same_error_in_eager_mode(app: App) -> None:
    @app.task(name="t")
    def t(x: Any = None) -> None:
        raise AssertionError("a refused call never runs")

    future = dt.datetime(2030, 1, 1)  # naive: refused
    sends: list[tuple[Callable[[], Any], type[Exception]]] = [
        (lambda: t.apply_async([1], headers={"h": {1, 2}}), NotSerializable),
        (lambda: t.apply_async([1], countdown=-1), InvalidSchedule),
        (lambda: t.apply_async([1], eta=future), InvalidSchedule),
        (lambda: t.apply_async([1], countdown=1, eta=future), InvalidSchedule),
        (lambda: t.apply_async([1], priority=12), InvalidPriority),
        (lambda: t.apply_async([1], queue="bad queue!"), PublishError),
        (lambda: app.send(" spaced name"), PublishError),
        (lambda: app.send("t", args=[object()]), NotSerializable),
        (lambda: app.send_many([t.s(1), t.s(object())]), NotSerializable),
        (lambda: group([t.s(1), t.s({1})]).delay(), NotSerializable),
        (lambda: chain(t.s(1), t.s(object())).delay(), NotSerializable),
    ]
    for send, error in sends:
        real = _refusal(send, error)
        with eager(app) as mode:
            refused = _refusal(send, error)
        assert (type(refused), str(refused)) == (type(real), str(real))
        assert mode.sent == []
    assert _ready(app) == 0


def test_a_call_runs_from_the_bytes_a_publish_would_send(app: App) -> None:
    got: list[Any] = []

    @app.task(name="t")
    def t(*a: Any, **k: Any) -> None:
        got.append((a, k))

    with eager(app) as mode:
        handle = t.delay((1, 2), {"k": (3,)}, x=1.5)
    # JSON: a tuple arrives as a list, as from a real worker
    assert got == [(([1, 2], {"k": [3]}), {"x": 1.5})]
    [env] = mode.sent
    assert (env.id, env.task, env.queue) == (handle, "t", "default")
    assert mode.tasks_sent == ["t"]
    assert _ready(app) == 0  # nothing reached the broker


def test_eager_mode_never_connects_to_the_broker() -> None:
    app = App("nobroker", broker=UNREACHABLE_AMQP)
    got: list[int] = []

    @app.task(name="t")
    def t(x: int) -> None:
        got.append(x)

    with eager(app):
        t.delay(1)
        app.send_many([t.s(2), t.s(3)])
    assert got == [1, 2, 3]


def test_sends_publish_for_real_again_after_the_block(app: App) -> None:
    @app.task(name="t")
    def t() -> None:
        pass

    with eager(app):
        t.delay()
    assert _ready(app) == 0
    t.delay()
    assert _ready(app) == 1


# -- results -----------------------------------------------------------------------------------
def test_the_handle_gives_the_value_where_the_task_stores_results(app: App) -> None:
    @app.task(name="pair", store_results=True)
    def pair(a: int) -> tuple[int, int]:
        return (a, a + 1)

    with eager(app):
        handle = pair.delay(1)
        assert handle.state is ResultState.SUCCEEDED and handle.ready()
        assert handle.get() == [1, 2]  # the JSON value a worker stores
        assert handle.result == [1, 2]


def test_a_handle_of_a_task_that_stores_no_results_refuses_as_a_real_one(app: App) -> None:
    @app.task(name="t")
    def t() -> int:
        return 1

    real = _refusal(lambda: t.delay().get(timeout=0), ConfigurationError)
    with eager(app):
        refused = _refusal(lambda: t.delay().get(timeout=0), ConfigurationError)
    assert str(refused) == str(real)


def test_an_app_without_a_result_store_refuses_get_as_a_real_one() -> None:
    app = App("noresults", broker=UNREACHABLE_AMQP)

    @app.task(name="t")
    def t() -> int:
        return 1

    # A handle of a call sent by name may be read (the app cannot know whether it stores
    # results); an app with no result store refuses the read.
    handle = ackwise.TaskHandle("an-id", app, "other.t", None)
    with eager(app):
        t.delay()  # runs
        refused = _refusal(lambda: handle.get(timeout=0), ConfigurationError)
    real = _refusal(lambda: handle.get(timeout=0), ConfigurationError)
    assert str(refused) == str(real)
    assert "reading a result needs a result store" in str(refused)


def test_a_value_that_is_not_json_fails_the_task_as_on_a_worker(app: App) -> None:
    @app.task(name="t", store_results=True)
    def t() -> object:
        return {1, 2}

    with eager(app, propagate=False) as mode:
        handle = t.delay()
        with pytest.raises(TaskFailed, match="not JSON: its result cannot be stored"):
            handle.get()
    assert isinstance(mode.failures[0].error, TypeError)


# -- exceptions --------------------------------------------------------------------------------
def test_a_failure_propagates_from_the_send_by_default(app: App) -> None:
    @app.task(name="boom", store_results=True)
    def boom(x: int) -> None:
        raise ValueError(f"bad {x}")

    with eager(app) as mode, pytest.raises(ValueError, match="bad 7") as info:
        boom.delay(7)
    assert [f.error for f in mode.failures] == [info.value]
    assert mode.failures[0].envelope.args == [7]
    [env] = mode.sent
    record = mode.results.get(env.id)
    assert (
        record is not None and record.state == "failed" and "ValueError: bad 7" in str(record.error)
    )


def test_with_propagate_false_a_failure_is_recorded_on_the_handle(app: App) -> None:
    @app.task(name="boom", store_results=True)
    def boom() -> None:
        raise ValueError("bad")

    with eager(app, propagate=False) as mode:
        handle = boom.delay()
        with pytest.raises(TaskFailed) as info:
            handle.get()
        assert info.value.state == "failed" and info.value.error == "ValueError: bad"
        assert "raise ValueError" in (info.value.traceback or "")
        assert handle.get(propagate=False) is None
    assert len(mode.failures) == 1


def test_base_exceptions_other_than_exception_are_not_caught() -> None:
    app = App("kbd", broker=f"memory://{uuid.uuid4().hex}")
    ran: list[str] = []

    @app.task(name="stop")
    def stop() -> None:
        app.send("after")  # queued behind this call: dropped with it
        raise KeyboardInterrupt

    @app.task(name="after")
    def after() -> None:
        ran.append("after")

    with eager(app) as mode:
        with pytest.raises(KeyboardInterrupt):
            stop.delay()
        assert mode.failures == [] and ran == []
        after.delay()  # nothing of the interrupted send is left to run
    assert ran == ["after"]


# -- retries -----------------------------------------------------------------------------------
def test_retries_run_at_once_without_their_backoff(app: App) -> None:
    seen: list[int] = []

    @app.task(
        name="flaky",
        bind=True,
        autoretry_for=(ConnectionError,),
        max_retries=3,
        retry_backoff=3600,
        retry_backoff_max=3600,
        store_results=True,
    )
    def flaky(ctx: TaskContext, x: int) -> int:
        seen.append(ctx.retries)
        if ctx.retries < 2:
            raise ConnectionError("down")
        return x

    with eager(app) as mode:
        started = time.monotonic()
        handle = flaky.delay(5)
        assert handle.get() == 5
    assert time.monotonic() - started < 5
    assert seen == [0, 1, 2]
    assert [str(r.error) for r in mode.retried] == ["down", "down"]
    assert mode.failures == []
    assert len(mode.sent) == 1  # a retry is a run, not a send


def test_retries_run_out_then_the_last_error_propagates(app: App) -> None:
    runs: list[int] = []

    @app.task(name="down", autoretry_for=(ConnectionError,), max_retries=2, retry_backoff=60)
    def down() -> None:
        runs.append(1)
        raise ConnectionError(f"down {len(runs)}")

    with eager(app) as mode, pytest.raises(ConnectionError, match="down 3"):
        down.delay()
    assert len(runs) == 3 and len(mode.retried) == 2 and len(mode.failures) == 1
    history = mode.failures[0].envelope.history
    assert [h.outcome for h in history] == ["retry", "retry"]


def test_retry_asked_by_the_task_does_not_sleep(app: App) -> None:
    @app.task(name="again", bind=True, max_retries=1)
    def again(ctx: TaskContext) -> None:
        if ctx.retries == 0:
            raise ctx.retry(delay=3600)

    with eager(app) as mode:
        started = time.monotonic()
        again.delay()
    assert time.monotonic() - started < 5
    assert len(mode.retried) == 1 and mode.failures == []


def test_an_error_not_retried_fails_at_once(app: App) -> None:
    runs: list[int] = []

    @app.task(name="bug", max_retries=5)  # ValueError is not in TRANSIENT_ERRORS
    def bug() -> None:
        runs.append(1)
        raise ValueError("bug")

    with eager(app) as mode, pytest.raises(ValueError):
        bug.delay()
    assert runs == [1] and mode.retried == []


# -- countdown, eta, priority --------------------------------------------------------------------
def test_countdown_and_eta_run_at_once(app: App) -> None:
    ran: list[str] = []

    @app.task(name="later")
    def later(tag: str) -> None:
        ran.append(tag)

    with eager(app) as mode:
        later.apply_async(["countdown"], countdown=3600)
        later.apply_async(["eta"], eta=dt.datetime.now(dt.UTC) + dt.timedelta(days=1))
    assert ran == ["countdown", "eta"]
    assert all(env.eta is not None for env in mode.sent)  # as a publish would have sent them


def test_bound_tasks_see_the_call_as_a_worker_gives_it(app: App) -> None:
    seen: list[TaskContext] = []

    @app.task(name="ctx", bind=True)
    def ctx_task(ctx: TaskContext) -> None:
        seen.append(ctx)

    with eager(app):
        handle = ctx_task.apply_async(queue="slow", headers={"tenant": "a"}, id="my-id")
    [ctx] = seen
    assert (ctx.id, ctx.attempt, ctx.retries, ctx.queue) == ("my-id", 1, 0, "slow")
    assert ctx.headers == {"tenant": "a"} and handle == "my-id"


# -- calls sent from inside a task -----------------------------------------------------------------
def test_calls_sent_from_a_task_run_after_it_returns_in_the_order_sent(app: App) -> None:
    log: list[str] = []

    @app.task(name="parent", store_results=True)
    def parent() -> str:
        log.append("parent starts")
        handle = child.delay("a")
        with pytest.raises(TimeoutError, match="runs it after that call returns"):
            handle.get()
        child.delay("b")
        log.append("parent returns")
        return str(handle)

    @app.task(name="child", store_results=True)
    def child(tag: str) -> str:
        log.append(f"child {tag}")
        if tag == "a":
            grandchild.delay()
        return tag

    @app.task(name="grandchild")
    def grandchild() -> None:
        log.append("grandchild")

    with eager(app) as mode:
        handle = parent.delay()
        # every call it caused has run when the send returns
        child_id = handle.get()
        assert ackwise.TaskHandle(child_id, app, "child", True).get() == "a"
    assert log == ["parent starts", "parent returns", "child a", "child b", "grandchild"]
    assert mode.tasks_sent == ["parent", "child", "child", "grandchild"]


def test_a_nested_failure_propagates_after_the_other_calls_ran(app: App) -> None:
    ran: list[str] = []

    @app.task(name="parent")
    def parent() -> None:
        bad.delay()
        good.delay()
        ran.append("parent")

    @app.task(name="bad")
    def bad() -> None:
        raise ValueError("nested")

    @app.task(name="good")
    def good() -> None:
        ran.append("good")

    with eager(app), pytest.raises(ValueError, match="nested"):
        parent.delay()
    assert ran == ["parent", "good"]


def test_calls_sent_from_another_thread_run_in_that_thread(app: App) -> None:
    threads: list[str] = []

    @app.task(name="where")
    def where() -> None:
        threads.append(threading.current_thread().name)

    with eager(app):
        worker = threading.Thread(target=where.delay, name="sender")
        worker.start()
        worker.join()
        where.delay()
    assert threads == ["sender", threading.current_thread().name]


# -- tasks this app does not know -------------------------------------------------------------------
def test_a_task_sent_by_name_that_the_app_does_not_know_is_accepted_and_not_run(app: App) -> None:
    real = app.send("billing.charge", args=[7])  # a worker elsewhere may know it
    assert _ready(app) == 1
    with eager(app) as mode:
        handle = app.send("billing.charge", args=[8])
        assert isinstance(handle, str) and len(handle) == 32
        with pytest.raises(TimeoutError, match=r"no task named 'billing\.charge'"):
            handle.get(timeout=5)
    assert [e.args for e in mode.not_run] == [[8]]
    assert _ready(app) == 1 and real


def test_an_invalid_task_name_is_refused_as_a_real_send_refuses_it(app: App) -> None:
    for bad in ["", " x", "x" * 300, "tab\there"]:
        real = _refusal(lambda bad=bad: app.send(bad), PublishError)  # type: ignore[misc]
        with eager(app):
            refused = _refusal(lambda bad=bad: app.send(bad), PublishError)  # type: ignore[misc]
        assert str(refused) == str(real)


# -- workflows -------------------------------------------------------------------------------------
def test_a_chain_runs_its_steps_in_order(app: App) -> None:
    steps: list[Any] = []

    @app.task(name="add")
    def add(a: int, b: int) -> int:
        steps.append((a, b))
        return a + b

    @app.task(name="last", store_results=True)
    def last(total: int, label: str) -> str:
        return f"{label}={total}"

    with eager(app) as mode:
        handle = chain(add.s(1, 2), add.s(10), last.s("sum")).delay()
        assert handle.get() == "sum=13"
    assert steps == [(1, 2), (3, 10)]
    assert mode.tasks_sent == ["add", "add", "last"]


def test_a_failed_chain_step_ends_the_chain_and_its_last_handle_says_so(app: App) -> None:
    @app.task(name="fail")
    def fail(x: int) -> int:
        raise ValueError("step broke")

    @app.task(name="never", store_results=True)
    def never(x: int) -> int:
        raise AssertionError("not reached")

    with eager(app, propagate=False) as mode:
        handle = chain(fail.s(1), never.s()).delay()
        with pytest.raises(TaskFailed, match=r"chain step fail .* failed: ValueError: step broke"):
            handle.get()
    assert mode.tasks_sent == ["fail"]
    with eager(app), pytest.raises(ValueError, match="step broke"):
        chain(fail.s(1), never.s()).delay()


def test_a_group_runs_its_members_in_order(app: App) -> None:
    order: list[int] = []

    @app.task(name="sq", store_results=True)
    def sq(x: int) -> int:
        order.append(x)
        return x * x

    with eager(app):
        assert group([sq.s(3), sq.s(1), sq.s(2)]).delay().get() == [9, 1, 4]
    assert order == [3, 1, 2]


def test_a_chord_runs_its_members_then_the_callback(app: App) -> None:
    @app.task(name="sq")
    def sq(x: int) -> int:
        return x * x

    @app.task(name="total", store_results=True)
    def total(values: list[int]) -> int:
        return sum(values)

    with eager(app) as mode:
        assert chord([sq.s(1), sq.s(2), sq.s(3)], total.s()).delay().get() == 14
    assert mode.tasks_sent == ["sq", "sq", "sq", "total"]


def test_a_chord_whose_member_fails_never_calls_back(app: App) -> None:
    @app.task(name="sq")
    def sq(x: int) -> int:
        if x == 2:
            raise ValueError("two")
        return x * x

    @app.task(name="total", store_results=True)
    def total(values: list[int]) -> int:
        raise AssertionError("not reached")

    with eager(app, propagate=False) as mode:
        handle = chord([sq.s(1), sq.s(2)], total.s()).delay()
        with pytest.raises(TaskFailed, match=r"chord member sq .* failed: ValueError: two"):
            handle.get()
    assert "total" not in mode.tasks_sent


def test_a_chord_without_a_result_store_is_refused_as_a_real_one() -> None:
    app = App("nostore", broker=UNREACHABLE_AMQP)

    @app.task(name="sq")
    def sq(x: int) -> int:
        return x

    real = _refusal(lambda: chord([sq.s(1)], sq.s()).delay(), ConfigurationError)
    with eager(app) as mode:
        refused = _refusal(lambda: chord([sq.s(1)], sq.s()).delay(), ConfigurationError)
    assert str(refused) == str(real) and mode.sent == []


# -- async tasks, idempotency keys, transactions -------------------------------------------------
def test_async_tasks_run_also_from_inside_a_running_event_loop(app: App) -> None:
    @app.task(name="double", store_results=True)
    async def double(x: int) -> int:
        await asyncio.sleep(0)
        return 2 * x

    async def from_async_code() -> int:
        return double.delay(4).get()  # this thread's loop is busy

    with eager(app):
        assert double.delay(3).get() == 6
        assert asyncio.run(from_async_code()) == 8


def test_an_idempotency_key_done_skips_later_calls(app: App) -> None:
    charged: list[int] = []

    @app.task(name="charge", idempotency_key=lambda order: f"order:{order}")
    def charge(order: int) -> None:
        charged.append(order)
        if len(charged) == 1:
            raise ValueError("declined")  # a failure leaves the key free

    with eager(app, propagate=False) as mode:
        charge.delay(1)
        charge.delay(1)
        charge.delay(1)
        charge.delay(2)
    assert charged == [1, 1, 2]
    assert [e.args for e in mode.skipped] == [[1]]


def test_a_transaction_block_does_not_touch_the_connection(app: App) -> None:
    ran: list[int] = []

    @app.task(name="t")
    def t(x: int) -> None:
        ran.append(x)

    with eager(app), app.transaction(object()):  # not a connection: never used
        t.delay(1)
        assert ran == [1]  # at once, not at commit


# -- switching it on -------------------------------------------------------------------------------
def test_eager_mode_cannot_be_nested_or_combined_with_a_worker(app: App) -> None:
    with eager(app) as mode:
        assert isinstance(mode, EagerMode)
        with pytest.raises(ConfigurationError, match="eager mode already"):
            with eager(app):
                pass
        with pytest.raises(ConfigurationError, match="in eager mode"), run_worker(app):
            pass
    with eager(app):  # off again after the block: on again
        pass
