"""``app.transaction(conn)`` with a broker that is not the caller's database: the outbox in
the caller's PostgreSQL database, and ``ackwise relay`` (docs/outbox.md).

The caller's database is the shared PostgreSQL server's ``test`` database, seen through a
schema of each test's own; the broker is SQLite.  Relays and workers are real processes.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from ackwise import App, decode_envelope
from ackwise.errors import ConfigurationError
from ackwise.relay._loop import Relay
from ackwise_conformance.helpers import eventually

psycopg = pytest.importorskip("psycopg")

TESTS = Path(__file__).parent


@pytest.fixture
def database(pg_schema_url: str) -> str:
    """The caller's database: a schema of this test's own."""
    return pg_schema_url


@pytest.fixture
def app(tmp_path: Path) -> Iterator[App]:
    a = App("outbox", broker=f"sqlite:///{tmp_path / 'broker.db'}")

    @a.task(name="outbox.record")
    def record(value: str) -> None: ...

    yield a
    a.close()


def _outbox_rows(database: str) -> int:
    with psycopg.connect(database) as conn:
        exists = conn.execute("SELECT to_regclass('ackwise_outbox')").fetchone()[0]
        return (
            0
            if exists is None
            else conn.execute("SELECT count(*) FROM ackwise_outbox").fetchone()[0]
        )


def _ready(app: App) -> list[str]:
    adapter = app.adapter()
    adapter.open()
    try:
        got = adapter.receive("default", max_messages=1000, wait=0.0, lease=60.0)
        return [decode_envelope(d.body).args[0] for d in got]
    finally:
        adapter.close()


def test_a_rolled_back_transaction_enqueues_nothing(app: App, database: str) -> None:
    with psycopg.connect(database) as conn:
        with conn.transaction(), app.transaction(conn):
            app.send("outbox.record", ["kept"])
        try:
            with conn.transaction(), app.transaction(conn):
                app.send("outbox.record", ["rolled back"])
                raise RuntimeError("the order could not be saved")
        except RuntimeError:
            pass
    assert _outbox_rows(database) == 1
    relay = Relay(app, database)
    with psycopg.connect(database, autocommit=True) as conn:
        assert relay.round(conn) == 1
    assert _outbox_rows(database) == 0
    assert _ready(app) == ["kept"]


def test_an_outbox_message_carries_its_idempotency_key_and_its_options(
    app: App, database: str
) -> None:
    with psycopg.connect(database) as conn, conn.transaction(), app.transaction(conn):
        handle = app.send("outbox.record", ["x"], priority=3, countdown=0.2)
    relay = Relay(app, database)
    with psycopg.connect(database, autocommit=True) as conn:
        relay.round(conn)
    assert _ready(app) == []  # the countdown holds it at the broker
    time.sleep(0.3)
    adapter = app.adapter()
    adapter.open()
    [d] = adapter.receive("default", max_messages=10, wait=1.0, lease=60.0)
    adapter.close()
    env = decode_envelope(d.body)
    assert (env.id, env.priority) == (str(handle), 3)
    assert env.headers["idempotency_key"] == f"outbox:{handle}"


def test_sends_outside_the_block_go_to_the_broker_at_once(app: App, database: str) -> None:
    with psycopg.connect(database) as conn, conn.transaction():
        with app.transaction(conn):
            app.send("outbox.record", ["in"])
        app.send("outbox.record", ["out"])
        assert _ready(app) == ["out"]  # before the caller's commit
    assert _outbox_rows(database) == 1


def test_a_connection_that_is_not_psycopg_is_refused(app: App) -> None:
    with pytest.raises(ConfigurationError, match="expected a psycopg 3 connection"):
        with app.transaction(object()):
            pass


# -- real processes ------------------------------------------------------------------------
def _env(tmp_path: Path, broker: str) -> dict[str, str]:
    return {
        **os.environ,
        "PYTHONPATH": str(TESTS / "outbox_support") + os.pathsep + os.environ.get("PYTHONPATH", ""),
        "OUTBOX_TEST_BROKER": broker,
        "OUTBOX_TEST_JOURNAL": str(tmp_path / "journal"),
        "ACKWISE_PLUGINS": "outbox_faults",
    }


def _relay(
    tmp_path: Path, database: str, broker: str, *options: str, log: Path | None = None
) -> subprocess.Popen[bytes]:
    """``ackwise relay`` in a process of its own; its log to the file ``log``, if given."""
    with open(log or os.devnull, "wb") as err:
        return subprocess.Popen(
            [
                *(sys.executable, "-m", "ackwise", "relay", "outbox_app:app"),
                *("--database", database, *options),
            ],
            env=_env(tmp_path, broker),
            stdout=subprocess.DEVNULL,
            stderr=err,
        )


def _enqueue(database: str, app: App, values: list[str]) -> None:
    with psycopg.connect(database) as conn, conn.transaction(), app.transaction(conn):
        for v in values:
            app.send("outbox.record", [v])


def _run_worker_until(tmp_path: Path, broker: str, expected: int) -> list[str]:
    journal = tmp_path / "journal"
    worker = subprocess.Popen(
        [sys.executable, "-m", "ackwise", "worker", "outbox_app:app", "--pool", "threads"],
        env=_env(tmp_path, broker),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        eventually(
            lambda: journal.exists() and len(journal.read_text().split()) >= expected,
            30.0,
            description=f"{expected} runs",
        )
        time.sleep(1.0)  # a duplicate would run now
    finally:
        worker.send_signal(signal.SIGTERM)
        worker.wait(30)
    return journal.read_text().split()


@pytest.mark.slow
def test_a_relay_killed_between_publish_and_delete_costs_one_effect(
    tmp_path: Path, database: str
) -> None:
    broker = f"sqlite:///{tmp_path / 'broker.db'}"
    app = App("outbox", broker=broker)
    app.task(name="outbox.record")(lambda value: None)
    values = [f"v{i}" for i in range(20)]
    _enqueue(database, app, values)
    stalled = _relay(tmp_path, database, "stall-after-publish-" + broker)
    marker = tmp_path / "journal.published"
    try:
        eventually(marker.exists, 30.0, description="the stalling relay to publish")
    finally:
        stalled.kill()  # published, not deleted: the rows come back to the next relay
        stalled.wait(10)
    assert _outbox_rows(database) == 20
    second = _relay(tmp_path, database, broker)
    try:
        eventually(lambda: _outbox_rows(database) == 0, 30.0, description="the relay")
    finally:
        second.send_signal(signal.SIGTERM)
        assert second.wait(30) == 0
    stats = app.adapter()
    stats.open()
    assert stats.stats("default").ready == 40  # every message published twice
    stats.close()
    ran = _run_worker_until(tmp_path, broker, 20)
    assert sorted(ran) == sorted(values)  # one effect each: the key caught the second copies
    app.close()


@pytest.mark.slow
def test_a_commit_wakes_an_idle_relay_and_a_row_without_its_wake_up_waits_one_interval(
    tmp_path: Path, database: str
) -> None:
    broker = f"sqlite:///{tmp_path / 'broker.db'}"
    app = App("outbox", broker=broker)
    app.task(name="outbox.record")(lambda value: None)
    _enqueue(database, app, ["first"])  # creates the table; the relay takes it on start
    relay = _relay(tmp_path, database, broker, "--interval", "30")
    try:
        eventually(lambda: _outbox_rows(database) == 0, 30.0, description="the relay to start")
        time.sleep(0.5)  # idle now, waiting for a wake-up or its 30 s interval
        _enqueue(database, app, ["woken"])
        # Far inside the 30 s interval: the commit's NOTIFY woke it.
        eventually(lambda: _outbox_rows(database) == 0, 10.0, description="the wake-up")
    finally:
        relay.send_signal(signal.SIGTERM)
        assert relay.wait(30) == 0
    # A row whose NOTIFY was lost (put back by hand here, without one) goes out on the
    # relay's next look, within --interval.
    _enqueue(database, app, ["unannounced"])
    with psycopg.connect(database) as conn:
        row = conn.execute(
            "DELETE FROM ackwise_outbox RETURNING queue, message_id, body"
        ).fetchone()
    relay = _relay(tmp_path, database, broker, "--interval", "1")
    try:
        _enqueue(database, app, ["ping"])
        eventually(lambda: _outbox_rows(database) == 0, 30.0, description="the relay to start")
        with psycopg.connect(database) as conn:
            conn.execute(
                "INSERT INTO ackwise_outbox (queue, message_id, body) VALUES (%s, %s, %s)", row
            )
        eventually(lambda: _outbox_rows(database) == 0, 10.0, description="the next look")
    finally:
        relay.send_signal(signal.SIGTERM)
        assert relay.wait(30) == 0
    stats = app.adapter()
    stats.open()
    assert stats.stats("default").ready == 4
    stats.close()
    app.close()


@pytest.mark.slow
def test_two_relays_publish_each_row_once(tmp_path: Path, database: str) -> None:
    broker = f"sqlite:///{tmp_path / 'broker.db'}"
    app = App("outbox", broker=broker)
    app.task(name="outbox.record")(lambda value: None)
    logs = [tmp_path / f"relay-{n}.log" for n in range(2)]
    relays = [_relay(tmp_path, database, broker, log=log) for log in logs]
    values = [f"v{i}" for i in range(300)]
    try:
        # Both relays serve before the first row: else one alone could move every row, and
        # the other still be starting when it is told to stop (a stop it ends with status 0:
        # tests/test_stop_while_starting.py).
        eventually(
            lambda: all("relay: outbox" in log.read_text() for log in logs),
            30.0,
            description="both relays to serve",
        )
        for i in range(0, 300, 10):  # committed one after another while both relays run
            _enqueue(database, app, values[i : i + 10])
        eventually(lambda: _outbox_rows(database) == 0, 30.0, description="the relays")
    finally:
        for r in relays:
            r.send_signal(signal.SIGTERM)
        for r in relays:
            assert r.wait(30) == 0
    stats = app.adapter()
    stats.open()
    assert stats.stats("default").ready == 300  # SKIP LOCKED: no row went out twice
    stats.close()
    app.close()


@pytest.mark.slow
def test_a_postgresql_restart_during_relay_loses_nothing(tmp_path: Path) -> None:
    """The outbox's database is killed (SIGKILL) and started again while a relay works
    through 1,000 rows: every row is published (a batch published before the kill, its delete
    not committed, goes out again) and each task runs once."""
    from ackwise_conformance.brokers import (
        provide_or_skip,
    )

    pg = provide_or_skip("postgresql", tmp_dir=tmp_path / "pg", durable=True)
    try:
        database = pg.url
        broker = f"sqlite:///{tmp_path / 'broker.db'}"
        app = App("outbox", broker=broker)
        app.task(name="outbox.record")(lambda value: None)
        values = [f"v{i}" for i in range(1000)]
        _enqueue(database, app, values)
        relay = _relay(tmp_path, database, "slow-publish-" + broker)  # 10 batches, 0.3 s each
        published = tmp_path / "journal.published"
        try:
            eventually(
                lambda: published.exists() and len(published.read_text().split()) >= 2,
                30.0,
                description="the relay's first batches",
            )
            pg.restart(hard=True)
            eventually(lambda: _outbox_rows(database) == 0, 60.0, description="the relay")
        finally:
            relay.send_signal(signal.SIGTERM)
            assert relay.wait(30) == 0
        batches = [int(n) for n in published.read_text().split()]
        assert sum(batches) >= 1000
        ran = _run_worker_until(tmp_path, broker, 1000)
        assert sorted(ran) == sorted(values)  # nothing lost, each once
        app.close()
    finally:
        pg.stop()
