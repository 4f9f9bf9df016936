"""Message priorities: declared per task or given per call, refused where the broker has none
(docs/priorities.md).  The brokers' own ordering is checked by the SPI conformance suite."""

from __future__ import annotations

import sqlite3
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from ackwise import App, Retry, decode_envelope
from ackwise.backends.sqlite._adapter import SCHEMA_VERSION
from ackwise.errors import ConfigurationError, InvalidPriority
from ackwise.testing import run_worker


@pytest.fixture(params=["sqlite", "memory"])
def app(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[App]:
    url = (
        f"sqlite:///{tmp_path / 'q.db'}"
        if request.param == "sqlite"
        else f"memory://{uuid.uuid4().hex}"
    )
    a = App("prio", broker=url)
    yield a
    a.close()


def _queued(app: App, queue: str = "default") -> list[tuple[str, int]]:
    """(task, priority) of every ready message, in the order the broker hands them out."""
    adapter = app.adapter()
    adapter.open()
    try:
        got = adapter.receive(queue, max_messages=100, wait=0.0, lease=30.0)
        envs = [decode_envelope(d.body) for d in got]
        return [(e.task, e.priority) for e in envs]
    finally:
        adapter.close()


def test_a_tasks_priority_travels_with_its_calls_and_a_call_can_change_it(app: App) -> None:
    @app.task(name="t.low")
    def low() -> None: ...

    @app.task(name="t.high", priority=6)
    def high() -> None: ...

    low.delay()
    high.delay()
    high.apply_async(priority=0)
    low.apply_async(priority=9)
    app.send("t.high")  # by name: the registered task's priority
    app.send("t.unknown", priority=2)
    assert _queued(app) == [
        ("t.low", 9),
        ("t.high", 6),
        ("t.high", 6),
        ("t.unknown", 2),
        ("t.low", 0),
        ("t.high", 0),
    ]


def test_the_worker_runs_the_higher_priorities_first(app: App) -> None:
    ran: list[str] = []

    @app.task(name="t.job")
    def job(label: str) -> None:
        ran.append(label)

    job.map([("low-1",), ("low-2",)])
    job.apply_async(("urgent",), priority=8)
    job.apply_async(("soon",), priority=3)
    with run_worker(app, prefetch=1) as worker:
        worker.join()
    assert ran == ["urgent", "soon", "low-1", "low-2"]


def test_a_retry_keeps_its_priority(app: App) -> None:
    ran: list[str] = []

    @app.task(name="t.flaky", priority=5, bind=True)
    def flaky(ctx: object) -> None:
        ran.append("flaky")
        if len(ran) == 1:
            raise Retry(0)

    @app.task(name="t.low")
    def low() -> None:
        ran.append("low")

    flaky.delay()
    low.map([(), ()])
    with run_worker(app, prefetch=1) as worker:
        worker.join()
    assert ran == ["flaky", "flaky", "low", "low"]


def test_workflow_steps_take_a_priority(app: App) -> None:
    from ackwise import chain

    @app.task(name="t.step")
    def step(x: int = 0) -> int:
        return x + 1

    chain(step.s().set(priority=4), step.s().set(priority=7)).delay()
    assert _queued(app) == [("t.step", 4)]


@pytest.mark.parametrize("bad", [10, -1, "high", 2.5, True, None])
def test_a_bad_priority_is_refused_where_it_is_given(app: App, bad: object) -> None:
    with pytest.raises(ConfigurationError, match=r"task 't\.bad': priority must be"):
        app.task(name="t.bad", priority=bad)(lambda: None)  # type: ignore[arg-type]

    @app.task(name="t.ok")
    def ok() -> None: ...

    if bad is None:
        return  # None in a call means "the task's"
    with pytest.raises(InvalidPriority, match=r"t\.ok: priority must be"):
        ok.apply_async(priority=bad)  # type: ignore[arg-type]
    with pytest.raises(InvalidPriority):
        app.send("t.ok", priority=bad)  # type: ignore[arg-type]


def test_a_broker_without_priorities_refuses_them_before_anything_is_sent() -> None:
    app = App("prio", broker="sqs://?region=us-east-1&endpoint_url=http://127.0.0.1:1")
    with pytest.raises(ConfigurationError, match=r"task 't\.p': priority 3 on a broker \(sqs\)"):
        app.task(name="t.p", priority=3)(lambda: None)

    @app.task(name="t.plain", priority=0)
    def plain() -> None: ...

    with pytest.raises(InvalidPriority, match="has no message priorities"):
        plain.apply_async(priority=1)  # refused before any connection is tried


def test_an_unknown_task_option_is_refused(app: App) -> None:
    with pytest.raises(TypeError, match="prioity"):
        app.task(name="t.typo", prioity=5)(lambda: None)  # type: ignore[call-overload]


def test_a_sqlite_file_of_the_previous_schema_is_upgraded_with_its_messages(
    tmp_path: Path,
) -> None:
    path = tmp_path / "old.db"
    db = sqlite3.connect(path)
    db.executescript(
        """
        CREATE TABLE ackwise_messages (
            seq INTEGER PRIMARY KEY, queue TEXT NOT NULL, id TEXT NOT NULL, body BLOB NOT NULL,
            state INTEGER NOT NULL, available_at REAL NOT NULL,
            deliveries INTEGER NOT NULL DEFAULT 0, token INTEGER, enqueued_at REAL NOT NULL,
            reason TEXT, dead_at REAL);
        CREATE INDEX ackwise_messages_receivable ON ackwise_messages (queue, available_at)
            WHERE state < 2;
        CREATE INDEX ackwise_messages_dead ON ackwise_messages (queue, dead_at) WHERE state = 2;
        CREATE TABLE ackwise_queues (name TEXT PRIMARY KEY, declared_at REAL NOT NULL)
            WITHOUT ROWID;
        PRAGMA user_version = 1;
        """
    )
    app = App("prio", broker=f"sqlite:///{path}")

    @app.task(name="t.x")
    def x() -> None: ...

    old_body = b'{"v":1,"id":"old","task":"t.x","queue":"default","created_at":1.0}'
    db.execute(
        "INSERT INTO ackwise_messages (queue, id, body, state, available_at, enqueued_at) "
        "VALUES ('default', 'old', ?, 0, 0, 0)",
        (old_body,),
    )
    db.commit()
    db.close()
    x.apply_async(priority=1)
    assert _queued(app) == [("t.x", 1), ("t.x", 0)]
    app.close()
    with sqlite3.connect(path) as db:
        assert db.execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION
