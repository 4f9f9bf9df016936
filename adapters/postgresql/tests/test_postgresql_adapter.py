"""What the PostgreSQL adapter does beyond the SPI suite: its URL, its errors, its tables'
guards, waking on NOTIFY instead of polling."""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Iterator
from typing import Any

import psycopg
import pytest

from ackwise import open_adapter
from ackwise.errors import BrokerUnavailable, InvalidBrokerURL, PermanentAdapterError
from ackwise.spi import Outgoing, QueueSpec
from ackwise_postgresql import PostgreSQLAdapter
from ackwise_postgresql._link import Link


@pytest.fixture
def adapter(postgresql_url: str) -> Iterator[PostgreSQLAdapter]:
    a = open_adapter(postgresql_url)
    assert isinstance(a, PostgreSQLAdapter)
    a.open()
    yield a
    a.close()


@pytest.mark.parametrize("value", ["0", "-1", "soon"])
def test_a_bad_connect_timeout_is_refused_before_any_connection(value: str) -> None:
    with pytest.raises(InvalidBrokerURL, match="connect_timeout must be seconds > 0"):
        open_adapter(f"postgresql://u@127.0.0.1:1/db?connect_timeout={value}")


def test_an_unreachable_database_is_unavailable_and_names_no_password() -> None:
    a = open_adapter("postgresql://user:s3cret-pw@127.0.0.1:1/db?connect_timeout=2")
    with pytest.raises(BrokerUnavailable) as info:
        a.open()
    assert "s3cret-pw" not in str(info.value)
    assert "cannot connect" in str(info.value) and "\n" not in str(info.value)


def test_the_tables_refuse_rows_that_could_never_be_delivered(
    adapter: PostgreSQLAdapter, postgresql_url: str
) -> None:
    adapter.declare(QueueSpec("q"))
    with psycopg.connect(postgresql_url, autocommit=True) as conn:
        for column, value in [
            ("state", "5"),
            ("id", "''"),
            ("available_at", "'NaN'"),
            ("available_at", "'Infinity'"),
            ("priority", "12"),
        ]:
            values = {"state": "0", "id": "'m'", "available_at": "0", "priority": "0"}
            values[column] = value
            with pytest.raises(psycopg.errors.CheckViolation):
                conn.execute(
                    "INSERT INTO ackwise_messages (queue, id, body, state, available_at, "
                    f"enqueued_at, priority) VALUES ('q', {values['id']}, 'x', "
                    f"{values['state']}, {values['available_at']}, 0, {values['priority']})"
                )


def test_workers_starting_together_create_the_tables_once(postgresql_url: str) -> None:
    errors: list[BaseException] = []
    adapters = [open_adapter(postgresql_url) for _ in range(6)]
    start = threading.Barrier(len(adapters))

    def open_one(a: Any) -> None:
        try:
            start.wait()
            a.open()
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=open_one, args=(a,)) for a in adapters]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for a in adapters:
        a.close()
    assert not errors


def test_a_statement_the_database_refuses_is_permanent_and_keeps_the_connection(
    adapter: PostgreSQLAdapter,
) -> None:
    with pytest.raises(PermanentAdapterError, match="the database refused the statement"):
        adapter._link.execute("probe", "SELECT no_such_column FROM ackwise_queues")
    assert adapter.queues() == []  # the same connection goes on


def test_an_idle_receiver_sleeps_until_a_publish_wakes_it(
    adapter: PostgreSQLAdapter, postgresql_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    queue = f"idle-{uuid.uuid4().hex[:8]}"
    adapter.declare(QueueSpec(queue))
    statements: list[str] = []
    real = Link.execute

    def counting(self: Link, operation: str, sql: str, params: Any = None) -> Any:
        if self is adapter._link:
            statements.append(operation)
        return real(self, operation, sql, params)

    monkeypatch.setattr(Link, "execute", counting)
    producer = open_adapter(postgresql_url)
    producer.open()
    published: list[float] = []

    def publish_later() -> None:
        time.sleep(2.0)
        producer.publish(queue, [Outgoing("m", b"x")])
        published.append(time.monotonic())

    thread = threading.Thread(target=publish_later)
    thread.start()
    got = adapter.receive(queue, max_messages=1, wait=10.0, lease=30.0)
    woke = time.monotonic()
    thread.join()
    producer.close()
    assert [d.message_id for d in got] == ["m"]
    assert woke - published[0] < 0.5, "the receiver did not wake on the notification"
    # Two seconds idle: a take, a LISTEN, a take and a look at the next due row, then the
    # take after the wake-up; a poll every 10 ms would be two hundred.
    assert len(statements) <= 6, statements
