"""Chains and groups (docs/workflows.md) on a real in-process worker."""

from __future__ import annotations

import uuid
from pathlib import Path

import pytest

from ackwise import App, GroupHandle, TaskHandle, chain, chord, group
from ackwise.app._followups import CHAIN, CHAIN_END, next_step
from ackwise.contract._envelope import decode
from ackwise.errors import ConfigurationError, TaskFailed
from ackwise.spi import Outgoing, QueueSpec
from ackwise.testing import run_worker


@pytest.fixture(params=["sqlite", "memory"])
def app(request: pytest.FixtureRequest, tmp_path: Path):
    url = (
        f"sqlite:///{tmp_path / 'q.db'}"
        if request.param == "sqlite"
        else f"memory://{uuid.uuid4().hex}"
    )
    a = App("wf", broker=url, store_results=True)
    yield a
    a.close()


def _tasks(app: App) -> dict[str, list]:
    runs: dict[str, list] = {"add": [], "double": [], "label": [], "boom": []}

    @app.task(name="wf.add")
    def add(a: int, b: int) -> int:
        runs["add"].append((a, b))
        return a + b

    @app.task(name="wf.double")
    def double(x: int) -> int:
        runs["double"].append(x)
        return 2 * x

    @app.task(name="wf.label")
    def label(x: int, prefix: str, *, suffix: str = "") -> str:
        runs["label"].append(x)
        return f"{prefix}{x}{suffix}"

    @app.task(name="wf.boom")
    def boom(x: int) -> int:
        runs["boom"].append(x)
        raise ValueError(f"cannot take {x}")

    return runs


def test_a_chain_passes_each_value_first_and_its_handle_is_the_last_steps(app):
    runs = _tasks(app)
    t = app.tasks
    handle = chain(
        t["wf.add"].s(1, 2), t["wf.double"].s(), t["wf.label"].s("n=", suffix="!")
    ).delay()
    assert isinstance(handle, TaskHandle) and handle.task == "wf.label"
    with run_worker(app):
        assert handle.get(timeout=20) == "n=6!"
    assert runs["add"] == [(1, 2)] and runs["double"] == [3] and runs["label"] == [6]


def test_a_chain_of_names_needs_its_app_and_then_runs(app):
    _tasks(app)
    with pytest.raises(ConfigurationError, match="app=app"):
        chain(app.signature("wf.add", [1, 1]), app.signature("wf.double"))
    handle = chain(app.signature("wf.add", [1, 1]), app.signature("wf.double"), app=app).delay()
    with run_worker(app):
        assert handle.get(timeout=20) == 4


def test_a_failed_step_ends_the_chain_and_the_last_handle_says_which(app):
    runs = _tasks(app)
    t = app.tasks
    handle = chain(t["wf.add"].s(1, 2), t["wf.boom"].s(), t["wf.double"].s()).delay()
    with run_worker(app):
        with pytest.raises(TaskFailed) as info:
            handle.get(timeout=20)
    assert "chain step wf.boom" in (info.value.error or "")
    assert "ValueError: cannot take 3" in (info.value.error or "")
    assert runs["double"] == []  # never ran


def test_a_step_runs_on_its_own_queue(app):
    runs = _tasks(app)
    t = app.tasks
    handle = chain(t["wf.add"].s(2, 2), t["wf.double"].s().set(queue="slow")).delay()
    with run_worker(app, queues=["default", "slow"]):
        assert handle.get(timeout=20) == 8
    assert runs["double"] == [4]


def test_the_next_step_is_the_same_message_each_time_it_is_published():
    env = decode(
        b'{"v":1,"id":"a","task":"t.a","queue":"q","created_at":1,"headers":'
        b'{"ackwise.chain":[{"task":"t.b","id":"b1","queue":"q2","args":[5],"kwargs":{}},'
        b'{"task":"t.c","id":"c1","queue":"q","args":[],"kwargs":{}}],"ackwise.chain_end":"c1"}}'
    )
    first, again = next_step(env, "7"), next_step(env, "7")
    assert first is not None and again is not None
    (q1, o1), (q2, o2) = first, again
    assert q1 == q2 == "q2" and o1.id == o2.id == "b1"
    nxt = decode(o1.body)
    assert nxt.args == [7, 5] and nxt.headers["idempotency_key"] == "chain:b1"
    assert nxt.headers[CHAIN][0]["id"] == "c1" and nxt.headers[CHAIN_END] == "c1"


def test_a_next_step_published_twice_has_one_effect_where_the_app_has_an_idempotency_store(
    tmp_path,
):
    # What a crash between publishing the next step and acking this one leaves: the step
    # runs again and publishes the next step again, same id, same idempotency key.
    app = App("wf", broker=f"sqlite:///{tmp_path / 'q.db'}", store_results=True)
    runs = _tasks(app)
    env = decode(
        b'{"v":1,"id":"a","task":"wf.add","queue":"default","created_at":1,"headers":'
        b'{"ackwise.chain":[{"task":"wf.double","id":"' + uuid.uuid4().hex.encode() + b'",'
        b'"queue":"default","args":[],"kwargs":{}}]}}'
    )
    step = next_step(env, "21")
    assert step is not None
    queue, out = step
    adapter = app.adapter()
    adapter.open()
    try:
        adapter.declare(QueueSpec(queue))
        adapter.publish(queue, [out])
        adapter.publish(queue, [out])
    finally:
        adapter.close()
    with run_worker(app) as w:
        w.join(timeout=20)
    assert runs["double"] == [21]
    assert app.results().get(out.id).value == "42"  # type: ignore[union-attr]
    app.close()


def test_a_group_sends_its_members_together_and_waits_for_them_all(app):
    _tasks(app)
    t = app.tasks
    handles = group([t["wf.add"].s(i, i) for i in range(5)]).delay()
    assert isinstance(handles, GroupHandle) and len(handles) == 5
    with run_worker(app, concurrency=2):
        assert handles.get(timeout=20) == [0, 2, 4, 6, 8]
    assert handles.ready()


def test_a_group_with_a_failing_member_raises_unless_told_not_to(app):
    _tasks(app)
    t = app.tasks
    handles = group([t["wf.add"].s(1, 1), t["wf.boom"].s(1)]).delay()
    with run_worker(app):
        with pytest.raises(TaskFailed, match="cannot take 1"):
            handles.get(timeout=20)
        assert handles.get(timeout=20, propagate=False) == [2, None]


def test_workflows_refuse_what_they_cannot_send(app):
    _tasks(app)
    with pytest.raises(ConfigurationError, match="at least one"):
        chain()
    with pytest.raises(ConfigurationError, match="signatures"):
        group([app.tasks["wf.add"]])  # type: ignore[list-item]
    bad = app.tasks["wf.add"].s(1, 2).set(eta=1)
    with pytest.raises(
        ConfigurationError, match="a step takes the options queue, countdown, id, priority, not"
    ):
        chain(bad)


def test_steps_pass_values_on_even_when_only_the_last_stores_results(tmp_path):
    app = App("wf", broker=f"sqlite:///{tmp_path / 'q.db'}")

    @app.task(name="wf.first")
    def first() -> list[int]:
        return [1, 2]

    @app.task(name="wf.last", store_results=True)
    def last(values: list[int]) -> int:
        return sum(values)

    handle = chain(first.s(), last.s()).delay()
    with run_worker(app):
        assert handle.get(timeout=20) == 3
    assert app.results().get(handle.id) is not None
    app.close()


def _chord_tasks(app: App) -> dict[str, list]:
    runs: dict[str, list] = {"square": [], "total": [], "fail": []}

    @app.task(name="wf.square")
    def square(x: int) -> int:
        runs["square"].append(x)
        return x * x

    @app.task(name="wf.total")
    def total(values: list[int], label: str) -> str:
        runs["total"].append(values)
        return f"{label}={sum(values)}"

    @app.task(name="wf.fail")
    def fail(x: int) -> int:
        runs["fail"].append(x)
        raise ValueError(f"member {x} broke")

    return runs


def test_a_chord_calls_back_once_with_every_members_value_in_order(app):
    runs = _chord_tasks(app)
    t = app.tasks
    handle = chord([t["wf.square"].s(i) for i in range(4)], t["wf.total"].s("sum")).delay()
    assert handle.task == "wf.total"
    with run_worker(app, concurrency=2) as w:
        assert handle.get(timeout=20) == "sum=14"
        w.join(timeout=20)
    assert runs["total"] == [[0, 1, 4, 9]]


def test_a_chord_with_a_failed_member_fails_naming_it_and_never_calls_back(app):
    runs = _chord_tasks(app)
    t = app.tasks
    handle = chord([t["wf.square"].s(1), t["wf.fail"].s(2)], t["wf.total"].s("x")).delay()
    with run_worker(app) as w:
        with pytest.raises(TaskFailed) as info:
            handle.get(timeout=20)
        w.join(timeout=20)
    assert "chord member wf.fail" in (info.value.error or "") and "#1" in (info.value.error or "")
    assert "member 2 broke" in (info.value.error or "")
    assert runs["total"] == []


def test_a_redelivered_member_is_counted_once_and_the_callback_runs_once(tmp_path):
    # What a crash after a member's success and before its ack leaves: the member runs again.
    app = App("wf", broker=f"sqlite:///{tmp_path / 'q.db'}", store_results=True)
    runs = _chord_tasks(app)
    t = app.tasks
    handle = chord([t["wf.square"].s(2), t["wf.square"].s(3)], t["wf.total"].s("n")).delay()
    adapter = app.adapter()
    adapter.open()
    try:
        [first] = adapter.receive("default", max_messages=1, wait=0, lease=30)
        adapter.publish("default", [Outgoing(first.message_id, first.body)])
        adapter.nack(first)
    finally:
        adapter.close()
    with run_worker(app) as w:
        assert handle.get(timeout=20) == "n=13"
        w.join(timeout=20)
    assert sorted(runs["square"]) in ([2, 2, 3], [2, 3, 3])  # one member ran twice
    assert runs["total"] == [[4, 9]]
    app.close()


def test_a_chord_without_a_result_store_is_refused_when_sent() -> None:
    app = App("wf", broker="amqp://guest:guest@127.0.0.1:1/")

    @app.task(name="wf.one")
    def one() -> int:
        return 1

    with pytest.raises(ConfigurationError, match=r"set App\(result_store=URL\)"):
        chord([one.s()], one.s()).delay()


def test_a_chord_keeps_the_ids_given_to_its_members_and_callback(app):
    _chord_tasks(app)
    t = app.tasks
    members = [t["wf.square"].s(i).set(id=f"member-{i}") for i in (1, 2)]
    handle = chord(members, t["wf.total"].s("s").set(id="the-callback")).delay()
    assert handle == "the-callback"
    with run_worker(app) as w:
        assert handle.get(timeout=20) == "s=5"
        w.join(timeout=20)
    assert app.results().get("member-2").value == "4"


def test_a_chord_refuses_members_that_share_an_id(app):
    _chord_tasks(app)
    t = app.tasks
    twins = [t["wf.square"].s(i).set(id="twin") for i in (1, 2)]
    with pytest.raises(ConfigurationError, match="distinct ids"):
        chord(twins, t["wf.total"].s("s")).delay()


def test_a_chain_keeps_the_ids_given_to_its_steps(app):
    _tasks(app)
    t = app.tasks
    handle = chain(
        t["wf.add"].s(1, 2).set(id="step-a"), t["wf.double"].s().set(id="step-b")
    ).delay()
    assert handle == "step-b"
    with run_worker(app) as w:
        assert handle.get(timeout=20) == 6
        w.join(timeout=20)
    assert app.results().get("step-a").value == "3"
