"""The PostgreSQL leader lock of ``ackwise beat``: the lock contract, plus what is PostgreSQL's
own (tables made on first use by processes starting together, a frozen client holding no lock
of the database's, a black-holed connection bounded by the lock's timeout, real beats).

Against the shared server (``PG_URL``), each test module or test in a schema of its own.
"""

from __future__ import annotations

import datetime as dt
import itertools
import os
import random
import signal
import subprocess
import sys
import textwrap
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from ackwise import App, Claim, LeaderLock, decode_envelope, open_lock
from ackwise.errors import BrokerUnavailable, TransientAdapterError
from ackwise.spi import QueueSpec
from ackwise_conformance.helpers import eventually
from ackwise_conformance.locks import LeaderLockConformance
from ackwise_conformance.proxy import FaultProxy

psycopg = pytest.importorskip("psycopg")

LONG_TTL = 30.0


class TestPostgresLeaderLock(LeaderLockConformance):
    @pytest.fixture
    def lock_url(self, pg_module_schema: tuple[str, str]) -> str:
        return pg_module_schema[0]


@pytest.fixture
def lock(pg_schema_url: str) -> Iterator[LeaderLock]:
    lock = open_lock(pg_schema_url)
    lock.timeout = 5.0
    lock.open()
    yield lock
    lock.close()


def _name() -> str:
    return f"pglock.{uuid.uuid4().hex[:12]}"


def _with(url: str, **params: str) -> str:
    sep = "&" if "?" in url else "?"
    return url + sep + "&".join(f"{k}={v}" for k, v in params.items())


def test_postgresql_urls_open_the_postgresql_lock() -> None:
    from ackwise_postgresql._lock import PostgresLeaderLock

    for scheme in ("postgresql", "postgres"):
        assert isinstance(open_lock(f"{scheme}://postgres@127.0.0.1/test"), PostgresLeaderLock)


def test_an_unreachable_database_is_a_one_line_transient_error_without_the_password() -> None:
    lock = open_lock("postgresql://postgres:s3cret@127.0.0.1:1/test?connect_timeout=2")
    with pytest.raises(BrokerUnavailable) as info:
        lock.acquire(_name(), "t1", LONG_TTL, "a")
    message = str(info.value)
    assert message.startswith("PostgreSQL lock store postgresql://postgres:***@127.0.0.1:1/test")
    assert "cannot connect" in message and "s3cret" not in message and "\n" not in message
    assert info.value.transient


def test_claims_are_pruned_to_the_newest_keep_fires_of_each_schedule(
    lock: LeaderLock, pg_schema_url: str
) -> None:
    from ackwise_postgresql._lock import KEEP_FIRES

    name = _name()
    assert lock.acquire(name, "t1", LONG_TTL, "a") is not None
    for t in range(1, 201):
        assert lock.claim(name, "t1", "every", t) is Claim.CLAIMED
    assert lock.claim(name, "t1", "nightly", 1) is Claim.CLAIMED
    with psycopg.connect(pg_schema_url) as conn:
        rows = conn.execute(
            "SELECT schedule, count(*), min(fire_time), max(fire_time) FROM ackwise_fires "
            "WHERE lock = %s GROUP BY schedule ORDER BY schedule",
            (name,),
        ).fetchall()
    assert rows == [("every", KEEP_FIRES, 200 - KEEP_FIRES + 1, 200), ("nightly", 1, 1, 1)]


def test_any_lock_name_is_a_value_never_sql(lock: LeaderLock) -> None:
    name = 'it\'s {a} "lock"; DROP TABLE ackwise_locks; -- é'
    assert lock.acquire(name, "t1", LONG_TTL, "o'wner") == 1
    assert lock.claim(name, "t1", "s'chedule", 5) is Claim.CLAIMED
    assert lock.last_fires(name) == {"s'chedule": 5}
    info = lock.info(name)
    assert info is not None and (info.name, info.owner, info.fence) == (name, "o'wner", 1)
    lock.delete(name)
    assert lock.info(name) is None and lock.last_fires(name) == {}


# -- processes ----------------------------------------------------------------------------------
_RACER = """
import os, sys, threading, time
from ackwise import open_lock

url, name, start = sys.argv[1], sys.argv[2], float(sys.argv[3])
locks = [open_lock(url) for _ in range(4)]  # four connections: four sessions racing
answers = []

def race(lock, i):
    lock.timeout = 10.0
    lock.open()  # the first use: creates the tables
    answers.append(lock.acquire(name, f"token-{os.getpid()}-{i}", 30.0, f"racer:{os.getpid()}"))

threads = [threading.Thread(target=race, args=(lock, i)) for i, lock in enumerate(locks)]
while time.time() < start:  # line up with the other racers
    time.sleep(0.001)
for t in threads:
    t.start()
for t in threads:
    t.join()
print(*answers, flush=True)
"""


def test_processes_starting_together_on_a_new_schema_create_the_tables_and_elect_one(
    pg_schema_url: str, tmp_path: Path
) -> None:
    # The schema is empty: every racer's open() is the first use, creating the tables at the
    # same moment as the others; none may fail, and exactly one takes the lock, fence 1.
    name, racers = _name(), 3
    script = tmp_path / "racer.py"
    script.write_text(_RACER)
    start = time.time() + 3.0
    procs = [
        subprocess.Popen(
            [sys.executable, str(script), pg_schema_url, name, repr(start)],
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        for _ in range(racers)
    ]
    outputs = [p.communicate(timeout=60)[0] for p in procs]
    assert [p.returncode for p in procs] == [0] * racers, outputs
    answers = sorted(a for out in outputs for a in out.strip().splitlines()[-1].split())
    assert answers == ["1"] + ["None"] * (racers * 4 - 1), outputs
    lock = open_lock(pg_schema_url)
    info = lock.info(name)
    assert info is not None and info.fence == 1 and info.owner.startswith("racer:")
    lock.close()


_BUSY = """
import sys
from ackwise import open_lock

url, name = sys.argv[1], sys.argv[2]
lock = open_lock(url)
lock.timeout = 10.0
assert lock.acquire(name, "busy", 30.0, "busy") is not None
print("ready", flush=True)
t = 0
while True:  # every operation, as fast as it can, until the test kills it
    t += 1
    assert lock.renew(name, "busy", 30.0)
    assert lock.claim(name, "busy", "s", t) is not None
    lock.acquire(name, "other", 30.0, "other")
    lock.info(name)
    lock.last_fires(name)
    lock.release(name, "stale")
"""


def _stopped(pid: int) -> bool:
    with open(f"/proc/{pid}/stat") as f:
        return f.read().rpartition(")")[2].split()[0] == "T"


def test_a_client_frozen_at_any_moment_holds_no_lock_of_the_database(
    pg_schema_url: str, tmp_path: Path
) -> None:
    # The trap of a broker-side lock: one held across two round trips stays held while the
    # client is frozen (SIGSTOP, a GC pause, a stalled VM).  Freeze a process that runs every
    # operation in a loop, at random moments: each time, its server session must be idle with
    # no lock (row, table or advisory) within a moment, and the lock row free to update.
    app_name = f"frozen-{uuid.uuid4().hex[:8]}"
    name = _name()
    script = tmp_path / "busy.py"
    script.write_text(_BUSY)
    proc = subprocess.Popen(
        [sys.executable, str(script), _with(pg_schema_url, application_name=app_name), name],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        assert proc.stdout is not None and proc.stdout.readline().strip() == "ready"
        with psycopg.connect(pg_schema_url, autocommit=True) as conn:

            def session() -> tuple[str, int]:
                row = conn.execute(
                    "SELECT a.state, (SELECT count(*) FROM pg_locks l WHERE l.pid = a.pid) "
                    "FROM pg_stat_activity a WHERE a.application_name = %s",
                    (app_name,),
                ).fetchone()
                assert row is not None, "the busy process has no session"
                return row[0], row[1]

            for _ in range(40):
                # A random moment of the loop: between, inside or around its statements.
                time.sleep(random.uniform(0.0, 0.01))
                proc.send_signal(signal.SIGSTOP)
                eventually(lambda: _stopped(proc.pid), 5.0, description="the process to stop")
                eventually(
                    lambda: session() == ("idle", 0),
                    2.0,
                    description="the frozen client's session to be idle, holding no lock",
                )
                with conn.transaction():
                    conn.execute("SET LOCAL lock_timeout = '100ms'")
                    conn.execute("SELECT 1 FROM ackwise_locks WHERE name = %s FOR UPDATE", (name,))
                proc.send_signal(signal.SIGCONT)
        assert proc.poll() is None, proc.stdout.read()
    finally:
        proc.send_signal(signal.SIGCONT)
        proc.kill()
        proc.wait(10)


def test_a_black_holed_connection_fails_within_the_lock_timeout_and_recovers(
    pg_schema_url: str,
) -> None:
    # The beat sets timeout = ttl / 3: a leader cut off from the database must learn it that
    # fast (its deadline is judged by its own clock), and must not read a late reply as the
    # answer to its next statement.
    with FaultProxy("127.0.0.1", 5432).start() as proxy:
        url = pg_schema_url.replace("127.0.0.1:5432", f"127.0.0.1:{proxy.port}")
        assert url != pg_schema_url
        lock = open_lock(url)
        lock.timeout = 0.3
        lock.open()
        name = _name()
        assert lock.acquire(name, "t1", LONG_TTL, "a") is not None
        proxy.blackhole(30.0)
        began = time.monotonic()
        with pytest.raises(TransientAdapterError, match=r"no answer within 0\.3s"):
            lock.renew(name, "t1", LONG_TTL)
        assert time.monotonic() - began < 2.0
        proxy.heal()
        assert lock.renew(name, "t1", LONG_TTL) is True
        info = lock.info(name)
        assert info is not None and info.owner == "a"
        # Closed and used again: the next statement is watched as well.
        lock.close()
        assert lock.renew(name, "t1", LONG_TTL) is True
        proxy.blackhole(30.0)
        began = time.monotonic()
        with pytest.raises(TransientAdapterError, match=r"no answer within 0\.3s"):
            lock.info(name)
        assert time.monotonic() - began < 2.0
        proxy.heal()
        lock.delete(name)
        lock.close()


# -- ackwise beat --------------------------------------------------------------------------------
_BEAT_APP = """
from ackwise import App

app = App({app!r}, broker={url!r})

@app.periodic_task(every=0.2, name="ping")
def ping():
    pass
"""


@pytest.mark.slow
def test_two_beat_processes_on_postgresql_alone_fire_each_tick_once(
    pg_schema_url: str, tmp_path: Path
) -> None:
    module, app_name = f"pgbeat_{uuid.uuid4().hex[:8]}", f"pgbeat-{uuid.uuid4().hex[:8]}"
    (tmp_path / f"{module}.py").write_text(
        textwrap.dedent(_BEAT_APP.format(app=app_name, url=pg_schema_url))
    )
    logs = [tmp_path / f"beat{i}.log" for i in range(2)]
    procs = []
    for log in logs:
        with open(log, "wb") as out:
            procs.append(
                subprocess.Popen(
                    [
                        sys.executable,
                        "-m",
                        "ackwise",
                        "beat",
                        f"{module}:app",
                        "--ttl",
                        "2",
                        "--tick",
                        "0.2",
                    ],
                    cwd=tmp_path,
                    stdout=out,
                    stderr=subprocess.STDOUT,
                    env={**os.environ, "PYTHONPATH": str(tmp_path)},
                )
            )
    reader = App("reader", broker=pg_schema_url)
    lock = open_lock(pg_schema_url)
    lock_name = f"ackwise.beat.{app_name}"
    try:
        adapter = reader.adapter()
        adapter.declare(QueueSpec("default"))
        eventually(
            lambda: adapter.stats("default").ready >= 15,
            60,
            description="15 fires: " + " | ".join(log.read_text()[-1000:] for log in logs),
        )
        info = lock.info(lock_name)
        assert info is not None and info.owner.rpartition(":")[2] in {str(p.pid) for p in procs}
        for p in procs:
            p.send_signal(signal.SIGTERM)
        assert [p.wait(30) for p in procs] == [0, 0]
        assert lock.info(lock_name) is None  # released on the way out
        fires = []
        while batch := adapter.receive("default", max_messages=500, wait=0, lease=60):
            fires += [decode_envelope(d.body).headers for d in batch]
            adapter.ack(batch)
        keys = [f["idempotency_key"] for f in fires]
        assert len(keys) == len(set(keys)) >= 15, keys
        times = sorted(dt.datetime.fromisoformat(f["beat"]["fire_time"]) for f in fires)
        steps = {b - a for a, b in itertools.pairwise(times)}
        assert steps == {dt.timedelta(seconds=0.2)}, f"ticks missing or doubled: {times}"
        assert {f["beat"]["fence"] for f in fires} == {info.fence}
        elected = [log for log in logs if "leader now" in log.read_text()]
        assert len(elected) == 1, [log.read_text() for log in logs]
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait(10)
        lock.delete(lock_name)
        lock.close()
        reader.close()
