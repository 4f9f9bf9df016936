"""Malformed records in the embedded brokers' storage never cost a valid message nor a worker.

Rows and entries are written straight into the ``sqlite://`` table and the ``memory://``
broker's queues, among valid messages, the way a foreign writer, a hand edit or a damaged
file would leave them; a real worker drains (``ackwise_conformance.corruption``).
"""

from __future__ import annotations

import dataclasses
import sqlite3
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import ackwise
from ackwise import Ack, App, open_adapter
from ackwise.backends.memory._adapter import MemoryAdapter, _broker_for, _Message
from ackwise.spi import QueueSpec
from ackwise.testing import run_worker
from ackwise_conformance.corruption import drain_among_corrupt

# -- sqlite ------------------------------------------------------------------------------------
# A corrupt row: one malformed column, and a body that is no envelope (so that even a row whose
# bookkeeping SQLite heals on its own, e.g. a TEXT delivery count that `+ 1` turns into 1,
# ends in the dead-letter store: decode_error).
_text = st.text(max_size=40)
_int64 = st.integers(-(2**63), 2**63 - 1)  # what SQLite stores as INTEGER
_blob = st.binary(max_size=64)
_bodies = st.one_of(
    _blob,
    st.just(b""),
    st.just(b'{"v": 1, "task": '),  # truncated JSON
    st.just(b'{"v": 99, "id": "x", "task": "t", "args": [], "kwargs": {}}'),
    st.binary(min_size=200_000, max_size=200_001),  # huge
)
_columns = st.one_of(
    st.fixed_dictionaries({"body": st.one_of(_int64, st.floats(allow_nan=False), _text)}),
    st.fixed_dictionaries({"id": _blob}),
    st.fixed_dictionaries(
        {"deliveries": st.one_of(st.floats(0.5, 1e6), st.just(2**63 - 1), _text)}
    ),
    st.fixed_dictionaries(
        {"available_at": st.one_of(_text, _blob, st.just(float("inf")), st.just(1e300))}
    ),
    st.fixed_dictionaries({"state": st.one_of(st.integers(3, 2**40), _text, st.just(2.5))}),
    st.fixed_dictionaries({"state_in_flight_expired": st.just(True)}),
    st.just({}),  # well framed, but the body is no envelope
)
sqlite_records = st.tuples(_bodies, _columns)


def _as_stored(value: Any) -> bytes:
    if isinstance(value, bytes):
        return value
    if isinstance(value, str):
        return value.encode()
    return repr(value).encode()


def _write_row(path: Path, queue: str, record: tuple[bytes, dict[str, Any]]) -> bytes:
    body, columns = record
    row: dict[str, Any] = {
        "queue": queue,
        "id": uuid.uuid4().hex,
        "body": body,
        "state": 0,
        "available_at": 0.0,
        "deliveries": 0,
        "enqueued_at": 0.0,
    }
    if columns.pop("state_in_flight_expired", False):
        row.update(state=1, token=12345, available_at=1.0)  # a lease that expired long ago
    row.update(columns)
    names = ", ".join(row)
    marks = ", ".join("?" * len(row))
    with sqlite3.connect(path, isolation_level=None) as db:
        db.execute(f"INSERT INTO ackwise_messages ({names}) VALUES ({marks})", list(row.values()))
    return _as_stored(row["body"])


@pytest.fixture(scope="module")
def sqlite_db(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("corrupt") / "broker.db"


@given(records=st.lists(sqlite_records, min_size=1, max_size=4))
@settings(max_examples=20, deadline=None, suppress_health_check=[HealthCheck.too_slow])
def test_corrupt_rows_never_cost_a_valid_message_nor_the_worker(
    sqlite_db: Path, records: list[tuple[bytes, dict[str, Any]]]
) -> None:
    drain_among_corrupt(
        f"sqlite:///{sqlite_db}", records, lambda q, r: _write_row(sqlite_db, q, dict_copy(r))
    )


def dict_copy(record: tuple[bytes, dict[str, Any]]) -> tuple[bytes, dict[str, Any]]:
    return record[0], dict(record[1])


def test_a_row_with_an_integer_body_is_dead_lettered_and_the_worker_goes_on(tmp_path: Path) -> None:
    # Defect: the worker's accept path caught only envelope errors; an INTEGER body raised
    # TypeError and every worker died once the lease expired (a crash loop).
    db = tmp_path / "broker.db"
    outcome = drain_among_corrupt(f"sqlite:///{db}", [(7, {})], lambda q, r: _int_body(db, q))
    [dead] = outcome.dead
    assert dead.reason == "corrupt_record" and dead.body == b"7"


def _int_body(path: Path, queue: str) -> bytes:
    return _write_row(path, queue, (b"", {"body": 7}))


def test_a_corrupt_rows_dead_letter_can_be_replayed_and_purged_by_its_stand_in_id(
    tmp_path: Path,
) -> None:
    db = tmp_path / "broker.db"
    url = f"sqlite:///{db}"
    app = App("standin", broker=url, default_queue="q")
    adapter = open_adapter(url)
    adapter.open()
    try:
        adapter.declare(QueueSpec("q"))
        _write_row(db, "q", (b"\x00raw", {"id": b"\xffnot text"}))
        with run_worker(app, queues=["q"]) as worker:
            worker.join()
            [dead] = adapter.dead_letters("q")
            assert dead.message_id.startswith("corrupt-") and dead.reason == "corrupt_record"
            assert dead.body == b"\x00raw"
            assert adapter.requeue_dead("q", [dead.message_id]) == 1
            worker.join()
        [again] = adapter.dead_letters("q")  # now framed: its body is no envelope
        assert (again.message_id, again.reason, again.body) == (
            dead.message_id,
            "decode_error",
            b"\x00raw",
        )
        assert adapter.delete_dead("q", [dead.message_id]) == 1
    finally:
        adapter.close()
        app.close()


def test_stats_and_dead_letter_listing_survive_rows_ackwise_did_not_write(tmp_path: Path) -> None:
    db = tmp_path / "broker.db"
    url = f"sqlite:///{db}"
    app = App("stats", broker=url)
    adapter = open_adapter(url)
    adapter.open()
    try:
        adapter.declare(QueueSpec("q"))
        _write_row(db, "q", (b"x", {"enqueued_at": "yesterday"}))
        with sqlite3.connect(db, isolation_level=None) as conn:
            conn.execute(
                "INSERT INTO ackwise_messages (queue, id, body, state, available_at, "
                "deliveries, enqueued_at, reason, dead_at) VALUES "
                "('q', x'00', 42, 2, 0, 'many', 0, NULL, 'noon')"
            )
        st_ = adapter.stats("q")
        assert st_.dead == 1 and st_.oldest_age >= 0.0
        [dead] = adapter.dead_letters("q")
        assert dead.message_id.startswith("corrupt-")
        assert (dead.body, dead.reason, dead.dead_at, dead.attempt) == (b"42", "unknown", 0.0, 0)
    finally:
        adapter.close()
        app.close()


# -- what the driver leaves behind -------------------------------------------------------------
def test_the_driver_deletes_the_queue_it_made_on_sqlite(tmp_path: Path) -> None:
    db = tmp_path / "broker.db"
    outcome = drain_among_corrupt(f"sqlite:///{db}", [(b"no envelope", {})], _writer(db))
    with sqlite3.connect(db) as conn:
        dump = "\n".join(conn.iterdump())
        registered = [name for (name,) in conn.execute("SELECT name FROM ackwise_queues")]
    assert outcome.queue not in dump, f"left in {db}: {_lines_with(dump, outcome.queue)}"
    assert registered == []


def _writer(db: Path) -> Callable[[str, tuple[bytes, dict[str, Any]]], bytes]:
    return lambda q, r: _write_row(db, q, dict_copy(r))


def _lines_with(text: str, needle: str) -> list[str]:
    return [line for line in text.splitlines() if needle in line]


def test_the_driver_deletes_the_queue_it_made_on_postgresql(pg_schema_url: str) -> None:
    """On a network broker too: no message row and no registry row of its queue are left."""
    psycopg = pytest.importorskip("psycopg")

    def write(queue: str, record: tuple[bytes]) -> bytes:
        with psycopg.connect(pg_schema_url, autocommit=True) as conn:
            conn.execute(
                "INSERT INTO ackwise_messages (queue, id, body, state, available_at, enqueued_at)"
                " VALUES (%s, %s, %s, 0, 0, 0)",
                (queue, uuid.uuid4().hex, record[0]),
            )
        return record[0]

    outcome = drain_among_corrupt(pg_schema_url, [(b"no envelope",), (b"\x00",)], write)
    assert {d.reason for d in outcome.dead} == {"decode_error"}
    with psycopg.connect(pg_schema_url) as conn:
        # Every row of every table of the test's schema, as text: none may name the queue.
        tables = [
            name
            for (name,) in conn.execute(
                "SELECT table_name FROM information_schema.tables "
                "WHERE table_schema = current_schema()"
            )
        ]
        left = [
            f"{table}: {row}"
            for table in tables
            for (row,) in conn.execute(f"SELECT CAST(t AS text) FROM {table} AS t")
            if outcome.queue in row
        ]
    assert "ackwise_queues" in tables
    assert left == [], f"drain_among_corrupt left rows of its queue {outcome.queue}"


# -- memory ------------------------------------------------------------------------------------
memory_entries = st.one_of(
    st.none(),
    st.integers(),
    _text,
    _blob,
    st.dictionaries(_text, st.integers(), max_size=3),
    st.builds(lambda body: _Message("m", body, 0.0), st.one_of(st.integers(), _text)),
    st.builds(lambda mid: _Message(mid, b"body", 0.0), st.one_of(st.integers(), _blob)),
    st.builds(lambda n: _Message("m", b"body", 0.0, deliveries=n), _text),
)


def _append(name: str, queue: str, entry: object) -> bytes:
    _broker_for(name).queues[queue].ready.append(entry)  # type: ignore[arg-type]
    if isinstance(entry, _Message):
        return entry.body if type(entry.body) is bytes else repr(entry.body).encode()
    return repr(entry).encode()


@given(entries=st.lists(memory_entries, min_size=1, max_size=4))
@settings(max_examples=25, deadline=None)
def test_foreign_entries_in_a_memory_queue_never_cost_a_valid_message(entries: list[Any]) -> None:
    name = f"corrupt-{uuid.uuid4().hex[:8]}"
    drain_among_corrupt(
        f"memory://{name}",
        [(e,) for e in entries],
        lambda q, record: _append(name, q, _fresh(record[0])),
    )


def _fresh(entry: object) -> object:
    # hypothesis may hand the same object to two examples: the adapter repairs messages
    if isinstance(entry, _Message):
        return _Message(entry.id, entry.body, entry.enqueued_at, deliveries=entry.deliveries)
    return entry


def test_every_mode_runs_each_valid_message_once_beside_corrupt_records() -> None:
    name = f"corrupt-{uuid.uuid4().hex[:8]}"
    outcome = drain_among_corrupt(
        f"memory://{name}", [1, 2, 3], lambda q, r: _append(name, q, r), valid_between=4
    )
    assert set(outcome.valid.values()) == set(Ack)
    assert all(outcome.runs[mid] == 1 for mid in outcome.valid)


# -- whatever an adapter hands over ------------------------------------------------------------
class _OddMemoryAdapter(MemoryAdapter):
    """The memory adapter, but the second message it delivers has a string delivery count:
    what a buggy third-party adapter could hand over.  The worker must not stop on it."""

    handed = 0

    def receive(self, queue: str, *, max_messages: int, wait: float, lease: float) -> Any:
        out = []
        for d in super().receive(queue, max_messages=max_messages, wait=wait, lease=lease):
            type(self).handed += 1
            out.append(dataclasses.replace(d, attempt="2") if type(self).handed == 2 else d)
        return out


def test_an_error_turning_a_delivery_into_a_task_dead_letters_it_and_the_worker_goes_on(
    plugins_serving: Callable[[str, str], ackwise.Plugins],
) -> None:
    plugins = plugins_serving("oddmemory", f"{__name__}:_OddMemoryAdapter")
    _OddMemoryAdapter.handed = 0
    app = App("odd", broker=f"oddmemory://{uuid.uuid4().hex[:8]}", plugins=plugins)
    ran = []

    @app.task(name="t")
    def t(n: int) -> None:
        ran.append(n)

    ids = [t.delay(n) for n in range(3)]
    with run_worker(app, prefetch=1) as worker:
        report = worker.join()
    assert sorted(ran) == [0, 2]
    [dead] = report.dead_lettered
    assert (dead.message_id, dead.info["reason"]) == (ids[1], "decode_error")
    assert "TypeError" in dead.info["error"]
