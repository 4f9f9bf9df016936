"""``app.transaction(conn)`` on a PostgreSQL broker: in the broker's own database the messages
are the broker's rows, written in the caller's transaction; in another database they go to
that database's outbox."""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Iterator

import psycopg
import pytest

from ackwise import App, open_adapter
from ackwise.spi import QueueSpec
from ackwise_conformance.brokers import BrokerHandle


@pytest.fixture
def app(postgresql_url: str) -> Iterator[App]:
    a = App("tx", broker=postgresql_url)

    @a.task(name="tx.record")
    def record(value: str) -> None: ...

    yield a
    a.close()


def _ready(url: str, queue: str = "default") -> int:
    adapter = open_adapter(url)
    adapter.open()
    try:
        adapter.declare(QueueSpec(queue))
        return adapter.stats(queue).ready
    finally:
        adapter.close()


def test_in_the_brokers_database_a_send_is_a_row_of_the_callers_transaction(
    app: App, postgresql_url: str
) -> None:
    with psycopg.connect(postgresql_url) as conn:
        with conn.transaction(), app.transaction(conn):
            app.send("tx.record", ["kept"])
            assert _ready(postgresql_url) == 0  # not before the commit
        assert _ready(postgresql_url) == 1
        try:
            with conn.transaction(), app.transaction(conn):
                app.send("tx.record", ["rolled back"])
                raise RuntimeError("the order could not be saved")
        except RuntimeError:
            pass
        assert conn.execute("SELECT to_regclass('ackwise_outbox')").fetchone()[0] is None
    assert _ready(postgresql_url) == 1


def test_an_idle_worker_wakes_when_the_caller_commits(app: App, postgresql_url: str) -> None:
    queue = f"wake-{uuid.uuid4().hex[:8]}"
    consumer = open_adapter(postgresql_url)
    consumer.open()
    consumer.declare(QueueSpec(queue))
    got: list[float] = []

    def wait() -> None:
        if consumer.receive(queue, max_messages=1, wait=10.0, lease=30.0):
            got.append(time.monotonic())

    waiter = threading.Thread(target=wait)
    waiter.start()
    time.sleep(0.5)  # it is idle, listening
    with psycopg.connect(postgresql_url) as conn:
        with conn.transaction(), app.transaction(conn):
            app.send("tx.record", ["x"], queue=queue)
            time.sleep(0.5)
        committed = time.monotonic()
    waiter.join()
    consumer.close()
    assert got and got[0] - committed < 0.5


def test_in_another_database_a_send_goes_to_that_databases_outbox(
    app: App, postgresql_broker: BrokerHandle, postgresql_url: str
) -> None:
    other = f"o_{uuid.uuid4().hex[:12]}"
    with psycopg.connect(postgresql_broker.url, autocommit=True) as admin:
        admin.execute(f"CREATE SCHEMA {other}")
    sep = "&" if "?" in postgresql_broker.url else "?"
    elsewhere = f"{postgresql_broker.url}{sep}options=-csearch_path%3D{other}"
    try:
        with psycopg.connect(elsewhere) as conn, conn.transaction(), app.transaction(conn):
            handle = app.send("tx.record", ["x"])
        with psycopg.connect(elsewhere) as conn:
            [(message_id,)] = conn.execute("SELECT message_id FROM ackwise_outbox").fetchall()
        assert message_id == str(handle)
        assert _ready(postgresql_url) == 0
    finally:
        with psycopg.connect(postgresql_broker.url, autocommit=True) as admin:
            admin.execute(f"DROP SCHEMA {other} CASCADE")
