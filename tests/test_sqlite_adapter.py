"""SQLite-specific checks of the ``sqlite://`` adapter (the SPI itself: test_spi_sqlite.py)."""

from __future__ import annotations

import json
import os
import sqlite3
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

import ackwise.backends.sqlite._adapter as sqlite_mod
from ackwise import BrokerURL, open_adapter
from ackwise.backends.sqlite._adapter import SQLiteAdapter
from ackwise.backends.sqlite._file import map_sqlite_errors
from ackwise.errors import (
    BrokerUnavailable,
    InvalidBrokerURL,
    MessageTooLarge,
    PermanentAdapterError,
    StaleReceipt,
    TransientAdapterError,
)
from ackwise.spi import Outgoing, QueueSpec


def make(url: str) -> SQLiteAdapter:
    return SQLiteAdapter(BrokerURL.parse(url))


@pytest.fixture
def db_url(tmp_path: Path) -> str:
    return f"sqlite:///{tmp_path / 'broker.db'}"


@pytest.fixture
def adapter(db_url: str) -> SQLiteAdapter:
    a = make(db_url)
    a.open()
    a.declare(QueueSpec("q"))
    yield a
    a.close()


# -- URLs ------------------------------------------------------------------------------------
def test_three_slashes_is_a_path_relative_to_the_working_directory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    assert make("sqlite:///data/ackwise.db").path == str(tmp_path / "data" / "ackwise.db")


def test_four_slashes_is_an_absolute_path() -> None:
    assert make("sqlite:////var/lib/app/ackwise.db").path == "/var/lib/app/ackwise.db"


def test_the_registry_serves_sqlite_urls(db_url: str) -> None:
    adapter = open_adapter(db_url)
    assert isinstance(adapter, SQLiteAdapter)
    caps = adapter.capabilities
    assert caps.native_delay and caps.max_delay is None and caps.multi_process
    assert caps.max_message_size == 64 * 1024 * 1024


def test_options_are_applied(tmp_path: Path) -> None:
    adapter = make(f"sqlite:///{tmp_path / 'b.db'}?synchronous=FULL&busy_timeout=2.5")
    adapter.open()
    try:
        db = adapter._conn()
        assert db.execute("PRAGMA synchronous").fetchone()[0] == 2  # FULL
        assert db.execute("PRAGMA busy_timeout").fetchone()[0] == 2500
    finally:
        adapter.close()


def test_default_options_are_synchronous_normal_and_ten_seconds(adapter: SQLiteAdapter) -> None:
    db = adapter._conn()
    assert db.execute("PRAGMA synchronous").fetchone()[0] == 1  # NORMAL
    assert db.execute("PRAGMA busy_timeout").fetchone()[0] == 10_000


def test_unknown_option_is_refused_naming_it_and_the_accepted_ones() -> None:
    with pytest.raises(InvalidBrokerURL) as info:
        make("sqlite:///x.db?journal=delete")
    message = str(info.value)
    assert "'journal'" in message and "busy_timeout" in message and "synchronous" in message


@pytest.mark.parametrize(
    "url, words",
    [
        ("sqlite:///x.db?synchronous=off", ["synchronous", "normal", "full"]),
        ("sqlite:///x.db?busy_timeout=soon", ["busy_timeout", "seconds"]),
        ("sqlite:///x.db?busy_timeout=-1", ["busy_timeout"]),
        ("sqlite://host/x.db", ["not a host", "sqlite:////absolute"]),
        ("sqlite://", ["no database file"]),
        ("sqlite:///", ["no database file"]),
        ("sqlite:///:memory:", ["memory://"]),
    ],
)
def test_bad_urls_are_refused_with_a_clear_message(url: str, words: list[str]) -> None:
    with pytest.raises(InvalidBrokerURL) as info:
        make(url)
    for word in words:
        assert word in str(info.value)


def test_a_missing_directory_is_a_clear_error_naming_it(tmp_path: Path) -> None:
    missing = tmp_path / "nope"
    adapter = make(f"sqlite:///{missing / 'broker.db'}")
    with pytest.raises(BrokerUnavailable) as info:
        adapter.open()
    assert str(missing) in str(info.value) and "does not exist" in str(info.value)
    assert not missing.exists()


# -- the database ----------------------------------------------------------------------------
def test_the_database_is_in_wal_mode(adapter: SQLiteAdapter) -> None:
    raw = sqlite3.connect(adapter.path)
    try:
        assert raw.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
    finally:
        raw.close()


def test_opening_a_new_file_another_process_is_still_writing_waits_for_it(
    tmp_path: Path,
) -> None:
    """A worker and a producer started together on a new file: while one writes it in
    rollback mode, the other's switch to WAL gets "database is locked" at once from SQLite
    (not after busy_timeout); the open waits for the writer instead of failing."""
    import threading
    import time

    path = tmp_path / "new.db"
    writer = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
    writer.execute("CREATE TABLE setup_in_progress (x)")
    writer.execute("BEGIN IMMEDIATE")
    writer.execute("INSERT INTO setup_in_progress VALUES (1)")
    done = threading.Timer(0.5, lambda: writer.execute("COMMIT"))
    done.start()
    adapter = open_adapter(f"sqlite:///{path}?busy_timeout=10")
    started = time.monotonic()
    try:
        adapter.open()
        assert time.monotonic() - started >= 0.4  # it waited for the writer
        adapter.declare(QueueSpec("q"))
        adapter.publish("q", [Outgoing("m", b"x")])
    finally:
        done.join()
        adapter.close()
        writer.close()


def test_receive_is_an_index_range_scan(adapter: SQLiteAdapter) -> None:
    plan = (
        adapter._conn()
        .execute("EXPLAIN QUERY PLAN " + sqlite_mod._SQL_RECEIVE, (0.0, 1, "q", 0.0, 10))
        .fetchall()
    )
    details = " | ".join(row[-1] for row in plan)
    assert "USING INDEX ackwise_messages_receivable" in details, details
    assert "SCAN ackwise_messages" not in details, details


def test_ack_and_extend_look_rows_up_by_primary_key(adapter: SQLiteAdapter) -> None:
    db = adapter._conn()
    for sql, prefix in ((sqlite_mod._SQL_ACK[4], []), (sqlite_mod._SQL_EXTEND[4], [1.0])):
        plan = db.execute("EXPLAIN QUERY PLAN " + sql, [*prefix, *[0] * 8]).fetchall()
        details = " | ".join(row[-1] for row in plan)
        assert "INTEGER PRIMARY KEY" in details and "SCAN ackwise_messages" not in details


def test_a_locked_database_is_a_transient_error(tmp_path: Path, adapter: SQLiteAdapter) -> None:
    impatient = make(f"sqlite:///{adapter.path}?busy_timeout=0.05")
    impatient.open()
    holder = sqlite3.connect(adapter.path, isolation_level=None)
    try:
        holder.execute("BEGIN IMMEDIATE")  # another process holds the write lock
        with pytest.raises(TransientAdapterError) as info:
            impatient.publish("q", [Outgoing("m", b"x")])
        assert type(info.value) is TransientAdapterError
        assert isinstance(info.value.__cause__, sqlite3.OperationalError)
        assert info.value.transient
        with pytest.raises(TransientAdapterError):
            impatient.receive("q", max_messages=1, wait=0, lease=1)
        holder.execute("ROLLBACK")
        impatient.publish("q", [Outgoing("m", b"x")])  # the lock is gone: works again
        assert impatient.stats("q").ready == 1
    finally:
        holder.close()
        impatient.close()


def test_a_file_that_is_not_a_database_is_a_permanent_error(tmp_path: Path) -> None:
    path = tmp_path / "garbage.db"
    path.write_bytes(b"this is not a SQLite database, just some bytes" * 100)
    with pytest.raises(PermanentAdapterError) as info:
        make(f"sqlite:///{path}").open()
    assert isinstance(info.value.__cause__, sqlite3.DatabaseError)
    assert str(path) in str(info.value)


def test_error_mapping_keeps_the_driver_error_as_cause() -> None:
    with pytest.raises(BrokerUnavailable) as info:
        with map_sqlite_errors("/nowhere/x.db"):
            sqlite3.connect("/nowhere/x.db").execute("SELECT 1")
    assert isinstance(info.value.__cause__, sqlite3.OperationalError)
    assert "/nowhere" in str(info.value)


def test_a_newer_schema_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "new.db"
    raw = sqlite3.connect(path)
    raw.execute("PRAGMA user_version = 99")
    raw.close()
    with pytest.raises(PermanentAdapterError, match="schema version 99"):
        make(f"sqlite:///{path}").open()


def test_an_oversize_message_is_refused_before_any_write(
    adapter: SQLiteAdapter, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(sqlite_mod, "MAX_MESSAGE_SIZE", 10)
    with pytest.raises(MessageTooLarge):
        adapter.publish("q", [Outgoing("ok", b"small"), Outgoing("big", b"x" * 11)])
    assert adapter.stats("q").ready == 0


def test_batches_larger_than_one_statement_settle_in_one_call(adapter: SQLiteAdapter) -> None:
    n = 2 * sqlite_mod._CHUNK + 3
    adapter.publish("q", [Outgoing(f"m{i}", b"x") for i in range(n)])
    got = adapter.receive("q", max_messages=n, wait=0, lease=60)
    assert len(got) == n
    adapter.extend(got, lease=60)
    adapter.ack(got[:-1])
    with pytest.raises(StaleReceipt) as info:
        adapter.ack(got)
    assert info.value.deliveries == tuple(got[:-1])  # and the valid last one was acked
    assert adapter.stats("q").in_flight == 0


def test_declared_queues_are_listed_even_when_empty(adapter: SQLiteAdapter) -> None:
    adapter.declare(QueueSpec("empty"))
    adapter.publish("undeclared", [Outgoing("m", b"x")])
    assert list(adapter.queues()) == ["empty", "q", "undeclared"]


# -- processes -------------------------------------------------------------------------------
_CONSUMER = textwrap.dedent(
    """
    import json, os, sys, time
    from ackwise import open_adapter

    url, queue, go = sys.argv[1:4]
    adapter = open_adapter(url)
    adapter.open()
    print("ready", flush=True)
    while not os.path.exists(go):
        time.sleep(0.001)
    held = []
    while True:  # hold every lease until the queue is drained: nothing may come back
        got = adapter.receive(queue, max_messages=7, wait=0.5, lease=120)
        if not got:
            break
        held.extend(got)
        time.sleep(0.001)  # "run" the tasks: lets the other consumer at the write lock
    adapter.ack(held)
    adapter.close()
    print(json.dumps([d.message_id for d in held]), flush=True)
    """
)


def test_two_processes_never_receive_the_same_message_while_leased(
    tmp_path: Path, adapter: SQLiteAdapter, db_url: str
) -> None:
    ids = [f"m{i}" for i in range(2000)]
    for start in range(0, len(ids), 500):
        adapter.publish("q", [Outgoing(i, i.encode()) for i in ids[start : start + 500]])
    go = tmp_path / "go"
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", _CONSUMER, db_url, "q", str(go)],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for _ in range(2)
    ]
    try:
        for p in procs:
            assert p.stdout is not None
            assert p.stdout.readline().strip() == "ready", p.stderr and p.stderr.read()
        go.touch()
        outputs = [p.communicate(timeout=120) for p in procs]
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
    for p, (_, err) in zip(procs, outputs, strict=True):
        assert p.returncode == 0, err
    received = [json.loads(out.strip().splitlines()[-1]) for out, _ in outputs]
    everything = [i for part in received for i in part]
    assert sorted(everything) == sorted(ids), "every message exactly once"
    assert all(received), f"both consumers took part: {[len(r) for r in received]}"
    stats = adapter.stats("q")
    assert (stats.ready, stats.in_flight, stats.dead) == (0, 0, 0)


_CRASHER = textwrap.dedent(
    """
    import os, sys
    from ackwise import open_adapter

    adapter = open_adapter(sys.argv[1])
    got = adapter.receive("q", max_messages=5, wait=5, lease=float(sys.argv[2]))
    assert len(got) == 5, got
    os._exit(0)  # dies holding the leases: no ack, no close
    """
)


def test_messages_of_a_dead_process_come_back_after_the_lease(
    adapter: SQLiteAdapter, db_url: str
) -> None:
    adapter.publish("q", [Outgoing(f"m{i}", b"x") for i in range(5)])
    lease = 0.5
    subprocess.run([sys.executable, "-c", _CRASHER, db_url, str(lease)], check=True, timeout=60)
    assert adapter.stats("q").in_flight in (0, 5)
    got: list = []
    while len(got) < 5:
        batch = adapter.receive("q", max_messages=5, wait=5, lease=30)
        assert batch, "the dead process's messages did not come back"
        got.extend(batch)
    assert sorted(d.message_id for d in got) == [f"m{i}" for i in range(5)]
    assert {d.attempt for d in got} == {2}
    adapter.ack(got)


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs os.fork")
def test_an_adapter_used_after_fork_opens_its_own_connection(adapter: SQLiteAdapter) -> None:
    adapter.publish("q", [Outgoing("parent", b"x")])
    parent_connection = adapter._conn()
    pid = os.fork()
    if pid == 0:  # the child: never return into pytest
        code = 1
        try:
            adapter.publish("q", [Outgoing("child", b"x")])
            code = 0 if adapter._conn() is not parent_connection else 3
        finally:
            os._exit(code)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    assert adapter._conn() is parent_connection
    assert adapter.stats("q").ready == 2
