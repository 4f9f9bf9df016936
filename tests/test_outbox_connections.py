"""``app.transaction()`` on the caller's connection as SQLAlchemy and psycopg hold it, the
refusals of connections that cannot carry it, and ``ackwise.contrib.sqlalchemy``'s
``send_on_commit`` (docs/outbox.md).  Django's connection: tests/test_django.py."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path

import pytest

from ackwise import App, chain, decode_envelope
from ackwise.contrib.sqlalchemy import send_on_commit
from ackwise.errors import ConfigurationError
from ackwise.relay._loop import Relay

psycopg = pytest.importorskip("psycopg")
sqlalchemy = pytest.importorskip("sqlalchemy")
orm = pytest.importorskip("sqlalchemy.orm")


@pytest.fixture
def app(tmp_path: Path) -> Iterator[App]:
    a = App("outbox", broker=f"sqlite:///{tmp_path / 'broker.db'}")

    @a.task(name="outbox.record")
    def record(value: str) -> str:
        return value

    yield a
    a.close()


@pytest.fixture
def engine(pg_schema_url: str) -> Iterator[object]:
    url = pg_schema_url.replace("postgresql://", "postgresql+psycopg://", 1)
    e = sqlalchemy.create_engine(url)
    yield e
    e.dispose()


def _relayed(app: App, database: str) -> int:
    with psycopg.connect(database, autocommit=True) as conn:
        return Relay(app, database).round(conn)


def _ready(app: App) -> list[str]:
    adapter = app.adapter()
    adapter.open()
    try:
        got = adapter.receive("default", max_messages=1000, wait=0.0, lease=60.0)
        return sorted(decode_envelope(d.body).args[0] for d in got)
    finally:
        adapter.close()


def test_a_sqlalchemy_session_enqueues_with_its_commit_only(
    app: App, engine: object, pg_schema_url: str
) -> None:
    with orm.Session(engine) as session:
        with app.transaction(session):
            app.send("outbox.record", ["committed"])
        session.commit()
    with orm.Session(engine) as session:
        with app.transaction(session):
            app.send("outbox.record", ["rolled back"])
        session.rollback()
    assert _relayed(app, pg_schema_url) == 1
    assert _ready(app) == ["committed"]


def test_a_sqlalchemy_connection_enqueues_with_its_commit_only(
    app: App, engine: object, pg_schema_url: str
) -> None:
    with engine.begin() as conn, app.transaction(conn):  # type: ignore[attr-defined]
        app.send("outbox.record", ["committed"])
    with pytest.raises(RuntimeError), engine.begin() as conn:  # type: ignore[attr-defined]
        with app.transaction(conn):
            app.send("outbox.record", ["rolled back"])
        raise RuntimeError("the order could not be saved")
    assert _relayed(app, pg_schema_url) == 1
    assert _ready(app) == ["committed"]


@pytest.mark.parametrize(
    ("make", "message"),
    [
        (lambda url: object(), "expected a psycopg 3 connection, a SQLAlchemy Session"),
        (
            lambda url: sqlalchemy.create_engine("sqlite://").connect(),
            "connection to sqlite\\+pysqlite; it needs PostgreSQL through psycopg 3",
        ),
        (
            lambda url: sqlalchemy.create_engine(
                url.replace("postgresql://", "postgresql+psycopg://", 1),
                isolation_level="AUTOCOMMIT",
            ).connect(),
            "isolation_level AUTOCOMMIT",
        ),
        (lambda url: psycopg.connect(url, autocommit=True), "autocommit mode with no transaction"),
        (
            lambda url: asyncio.run(psycopg.AsyncConnection.connect(url)),
            "got a psycopg AsyncConnection",
        ),
    ],
    ids=["not-a-connection", "sqlite", "sqlalchemy-autocommit", "psycopg-autocommit", "async"],
)
def test_a_connection_that_cannot_carry_the_send_is_refused(
    app: App, pg_schema_url: str, make: object, message: str
) -> None:
    conn = make(pg_schema_url)  # type: ignore[operator]
    try:
        with pytest.raises(ConfigurationError, match=message), app.transaction(conn):
            pytest.fail("the block ran")
    finally:
        close = getattr(conn, "close", None)
        if close is not None and asyncio.iscoroutine(closing := close()):
            asyncio.run(closing)


def test_psycopg_autocommit_inside_an_explicit_transaction_is_taken(
    app: App, pg_schema_url: str
) -> None:
    with psycopg.connect(pg_schema_url, autocommit=True) as conn:
        with conn.transaction(), app.transaction(conn):
            app.send("outbox.record", ["x"])
    assert _relayed(app, pg_schema_url) == 1


# -- send_on_commit (the smaller guarantee) ------------------------------------------------
def test_send_on_commit_sends_after_the_commit_and_never_on_rollback(
    app: App, engine: object
) -> None:
    record = app.tasks["outbox.record"]
    with orm.Session(engine) as session:
        send_on_commit(session, record.s("kept"))
        session.execute(sqlalchemy.text("SELECT 1"))
        assert _ready(app) == []  # not before the commit
        session.commit()
        assert _ready(app) == ["kept"]
        send_on_commit(session, record.s("dropped"))
        session.rollback()
        session.commit()  # a later commit does not send what the rollback dropped
    assert _ready(app) == []


def test_send_on_commit_drops_the_calls_of_a_savepoint_rolled_back(
    app: App, engine: object
) -> None:
    record = app.tasks["outbox.record"]
    with orm.Session(engine) as session:
        send_on_commit(session, record.s("outer"))
        savepoint = session.begin_nested()
        send_on_commit(session, chain(record.s("in savepoint")))
        savepoint.rollback()
        kept = session.begin_nested()
        send_on_commit(session, app.signature("outbox.record", ["released"]), app=app)
        kept.commit()
        assert _ready(app) == []  # a released savepoint waits for the outermost commit
        session.commit()
    assert _ready(app) == ["outer", "released"]


def test_send_on_commit_refuses_what_it_cannot_send(app: App, engine: object) -> None:
    with orm.Session(engine) as session:
        with pytest.raises(ConfigurationError, match="a signature by name needs its app"):
            send_on_commit(session, app.signature("outbox.record", ["x"]))
        with pytest.raises(ConfigurationError, match="expected a signature"):
            send_on_commit(session, "outbox.record")
