"""Periodic tasks: schedules, missed-fire policies, the leader lock and fenced fires, ``ackwise beat``.

Includes regression tests for the known failure modes of other schedulers' locks: a renewal
without an owner check, a crash loop on lost ownership, a loop interval as long as the TTL.
"""

from __future__ import annotations

import datetime as dt
import logging
import os
import signal
import sqlite3
import subprocess
import sys
import textwrap
import uuid
from collections.abc import Callable
from pathlib import Path

import pytest

from ackwise import (
    App,
    Beat,
    BeatConfig,
    BrokerURL,
    Claim,
    Cron,
    Interval,
    LeaderLock,
    Leadership,
    LockInfo,
    Periodic,
    Plugins,
    decode_envelope,
    hookimpl,
    open_lock,
)
from ackwise.cli import main as ackwise_main
from ackwise.errors import (
    ConfigurationError,
    NotSerializable,
    PermanentAdapterError,
    TransientAdapterError,
)
from ackwise.spi import QueueSpec
from ackwise_conformance.helpers import eventually
from ackwise_conformance.locks import LeaderLockConformance

UTC = dt.UTC
PARIS = "Europe/Paris"


def utc(*args: int) -> dt.datetime:
    return dt.datetime(*args, tzinfo=UTC)


# -- the lock contract on the built-in backends ------------------------------------------------
class TestMemoryLeaderLock(LeaderLockConformance):
    @pytest.fixture
    def lock_url(self) -> str:
        return f"memory://{uuid.uuid4().hex}"


class TestSQLiteLeaderLock(LeaderLockConformance):
    @pytest.fixture
    def lock_url(self, tmp_path: Path) -> str:
        return f"sqlite:///{tmp_path / 'locks.db'}"


def test_sqlite_lock_shares_the_broker_file_without_touching_its_schema(tmp_path):
    url = f"sqlite:///{tmp_path / 'b.db'}"
    lock = open_lock(url)
    lock.open()
    assert lock.acquire("n", "t", 30, "a") == 1
    app = App("shared", broker=url)

    @app.task(name="t")
    def t():
        pass

    t.delay()  # the broker creates its own schema in the same file afterwards
    assert app.adapter().stats("default").ready == 1
    assert lock.info("n") is not None
    lock.close()
    app.close()


def test_a_sqlite_lock_file_written_before_claimed_by_says_who_claimed_its_fires(tmp_path):
    # ackwise_fires has kept each claim's fencing number since its first version, so a file
    # written before LeaderLock.claimed_by existed needs no migration.  Made here with that
    # version's DDL and the rows its claim wrote; opened by two processes' locks at once.
    path = tmp_path / "old.db"
    with sqlite3.connect(path) as db:
        db.execute(
            """CREATE TABLE ackwise_locks (
                name       TEXT PRIMARY KEY,
                token      TEXT,
                fence      INTEGER NOT NULL,
                expires_at REAL    NOT NULL,
                owner      TEXT
            ) WITHOUT ROWID"""
        )
        db.execute(
            """CREATE TABLE ackwise_fires (
                lock       TEXT    NOT NULL,
                schedule   TEXT    NOT NULL,
                fire_time  INTEGER NOT NULL,
                fence      INTEGER NOT NULL,
                claimed_at REAL    NOT NULL,
                PRIMARY KEY (lock, schedule, fire_time)
            ) WITHOUT ROWID"""
        )
        db.execute("INSERT INTO ackwise_locks VALUES ('n', NULL, 3, 0, NULL)")  # released
        db.execute("INSERT INTO ackwise_fires VALUES ('n', 'tick', 1000000, 3, 1.0)")
    db.close()
    url = f"sqlite:///{path}"
    lock, other = open_lock(url), open_lock(url)
    lock.open()
    other.open()
    try:
        assert lock.claimed_by("n", "tick", 1_000_000) == 3
        assert other.acquire("n", "t4", 30, "b") == 4
        assert other.claim("n", "t4", "tick", 1_000_000) is Claim.TAKEN
        assert other.claim("n", "t4", "tick", 2_000_000) is Claim.CLAIMED
        assert lock.claimed_by("n", "tick", 1_000_000) == 3
        assert lock.claimed_by("n", "tick", 2_000_000) == 4
    finally:
        lock.close()
        other.close()


def test_builtin_lock_backends_register_through_the_hook():
    plugins = Plugins(autoload=False)
    assert plugins.lock_backends.schemes() == ["memory", "sqlite"]
    entry = plugins.lock_backends.get("sqlite")
    assert entry.plugin == "ackwise"
    assert entry.import_path == "ackwise.backends.sqlite._lock:SQLiteLeaderLock"


def test_a_third_party_lock_backend_is_usable_by_url_and_duplicates_name_both_plugins():
    class Third:
        @hookimpl
        def ackwise_register_lock_backends(self, registry):
            registry.add(
                "mem2", "ackwise.backends.memory._lock:MemoryLeaderLock", distribution="third"
            )

    plugins = Plugins(autoload=False)
    plugins.register(Third(), name="third")
    assert type(open_lock("mem2://x", plugins)).__name__ == "MemoryLeaderLock"

    class Dup:
        @hookimpl
        def ackwise_register_lock_backends(self, registry):
            registry.add("sqlite", "elsewhere:Other")

    plugins.register(Dup(), name="dup-plugin")
    with pytest.raises(ConfigurationError, match="registered twice") as info:
        plugins.lock_backends  # noqa: B018
    assert "by ackwise" in str(info.value) and "by dup-plugin" in str(info.value)


def test_a_lock_backend_that_is_not_a_leader_lock_is_refused():
    class Bad:
        @hookimpl
        def ackwise_register_lock_backends(self, registry):
            registry.add("bad", "ackwise.backends.memory._adapter:MemoryAdapter")

    plugins = Plugins(autoload=False)
    plugins.register(Bad(), name="bad")
    with pytest.raises(ConfigurationError, match=r"not an ackwise\.LeaderLock subclass"):
        open_lock("bad://x", plugins)


def test_unknown_lock_scheme_names_the_installed_ones():
    with pytest.raises(ConfigurationError, match=r"installed schemes: .*sqlite"):
        open_lock("nosuchlock://x")


# -- schedules -----------------------------------------------------------------------------------
def test_interval_fires_at_multiples_of_every_since_the_epoch():
    s = Interval(300)
    assert s.next_after(utc(2025, 1, 1, 10, 2, 7)) == utc(2025, 1, 1, 10, 5)
    assert s.next_after(utc(2025, 1, 1, 10, 5)) == utc(2025, 1, 1, 10, 10)  # strictly after
    fast = Interval(0.1)
    t = utc(2025, 1, 1) + dt.timedelta(microseconds=250_000)
    assert fast.next_after(t) == utc(2025, 1, 1) + dt.timedelta(microseconds=300_000)


def test_interval_due_gives_the_newest_ticks_and_says_when_it_cut():
    s = Interval(60)
    after, until = utc(2025, 1, 1, 0, 0), utc(2025, 1, 1, 0, 10, 30)
    ticks, cut = s.due(after, until, limit=100)
    assert ticks == [utc(2025, 1, 1, 0, m) for m in range(1, 11)] and not cut
    ticks, cut = s.due(after, until, limit=3)
    assert ticks == [utc(2025, 1, 1, 0, m) for m in (8, 9, 10)] and cut
    assert s.due(until, until, limit=5) == ([], False)


def test_cron_reads_its_expression_in_its_time_zone():
    s = Cron("0 9 * * *", tz=PARIS)
    assert s.next_after(utc(2025, 1, 15, 12)) == utc(2025, 1, 16, 8)  # 09:00 CET
    assert s.next_after(utc(2025, 7, 15, 12)) == utc(2025, 7, 16, 7)  # 09:00 CEST
    assert Cron("0 9 * * *").next_after(utc(2025, 1, 15, 12)) == utc(2025, 1, 16, 9)
    assert Cron("@daily", tz="UTC").next_after(utc(2025, 1, 15, 12)) == utc(2025, 1, 16)


def test_cron_fixed_time_in_the_spring_forward_gap_fires_once_after_the_gap():
    # 2025-03-30, Europe/Paris: 02:00 CET jumps to 03:00 CEST; 02:30 does not exist that day.
    s = Cron("30 2 * * *", tz=PARIS)
    fires = s.upcoming(utc(2025, 3, 29, 12), 3)
    assert fires == [
        utc(2025, 3, 30, 1, 0),  # 03:00 CEST, the first minute after the gap
        utc(2025, 3, 31, 0, 30),  # 02:30 CEST
        utc(2025, 4, 1, 0, 30),
    ]


def test_cron_fixed_time_in_the_fall_back_hour_fires_once():
    # 2025-10-26, Europe/Paris: 03:00 CEST goes back to 02:00 CET; 02:30 happens twice.
    s = Cron("30 2 * * *", tz=PARIS)
    fires = s.upcoming(utc(2025, 10, 25, 12), 2)
    assert fires == [utc(2025, 10, 26, 0, 30), utc(2025, 10, 27, 1, 30)]  # the first 02:30
    # Starting inside the repeated hour, after the first 02:30, never goes back in time.
    assert s.next_after(utc(2025, 10, 26, 1, 10)) == utc(2025, 10, 27, 1, 30)


def test_cron_with_a_wildcard_hour_follows_real_time_across_dst():
    s = Cron("0 * * * *", tz=PARIS)
    fall = s.upcoming(utc(2025, 10, 25, 23, 30), 4)
    # 01:00 CEST, 02:00 CEST, 02:00 CET, 03:00 CET: one fire per real hour, two named 02:00.
    assert fall == [utc(2025, 10, 26, h) for h in (0, 1, 2, 3)]
    spring = s.upcoming(utc(2025, 3, 29, 23, 30), 3)
    assert spring == [utc(2025, 3, 30, h) for h in (0, 1, 2)]  # 01:00 CET, 03:00, 04:00 CEST


@pytest.mark.parametrize("expr", ["*/30 * * * *", "30 2 * * *", "0 * * * *", "15 1-3 * * 0"])
@pytest.mark.parametrize("start", [utc(2025, 3, 29, 12), utc(2025, 10, 25, 12)])
def test_cron_due_agrees_with_walking_forward_across_dst(expr, start):
    s = Cron(expr, tz=PARIS)
    until = start + dt.timedelta(days=2)
    forward = [t for t in s.upcoming(start, 500) if t <= until]
    ticks, cut = s.due(start, until, limit=1000)
    assert ticks == forward and not cut
    newest, cut = s.due(start, until, limit=2)
    assert newest == forward[-2:] and cut == (len(forward) > 2)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({}, "exactly one of every"),
        ({"every": 5, "cron": "* * * * *"}, "exactly one of every"),
        ({"every": 0}, "every must be a number of seconds"),
        ({"every": float("nan")}, "every must be a number of seconds"),
        ({"every": True}, "every must be a number of seconds"),
        ({"every": 5, "tz": PARIS}, "tz applies to cron schedules only"),
        ({"cron": "61 * * * *"}, "not a valid expression"),
        ({"cron": "* * * *"}, "expected five fields"),
        ({"cron": "* * * * * *"}, "expected five fields"),
        ({"cron": "0 3 * * *", "tz": "Mars/Olympus"}, "not a known time zone"),
        ({"every": 5, "missed": "skip"}, "missed must be one of"),
        ({"every": 5, "catch_up_limit": 3}, "catch_up_limit applies to missed='catch_up' only"),
        ({"every": 5, "missed": "catch_up", "catch_up_limit": 0}, "catch_up_limit must be"),
        ({"every": 5, "name": ""}, "schedule name must be"),
        ({"every": 5, "queue": "bad queue!"}, "invalid queue name"),
    ],
)
def test_unclear_schedules_are_refused_with_a_clear_error(kwargs, message):
    app = App("v", broker="memory://v")

    @app.task(name="t")
    def t():
        pass

    with pytest.raises(Exception, match=message) as info:
        app.periodic(t, **kwargs)
    assert isinstance(info.value, ConfigurationError)
    assert app.schedules == {}


def test_schedule_declarations_are_checked_against_the_app():
    app = App("v", broker="memory://v")
    other = App("o", broker="memory://o")

    @app.task(name="t")
    def t(x=None):
        pass

    @other.task(name="elsewhere")
    def elsewhere():
        pass

    app.periodic(t, every=5)
    with pytest.raises(ConfigurationError, match="declared twice"):
        app.periodic(t, every=10)
    with pytest.raises(ConfigurationError, match="not registered on app 'v'"):
        app.periodic(elsewhere, every=5)
    with pytest.raises(ConfigurationError, match="no task named 'nope'"):
        app.periodic("nope", every=5)
    with pytest.raises(NotSerializable, match="args"):
        app.periodic(t, every=5, name="bad", args=(object(),))
    with pytest.raises(ConfigurationError, match="not both"):
        app.periodic(t.s(1), every=5, name="both", args=(2,))
    p = app.periodic(t.s(x=3), cron="*/5 * * * *", tz=PARIS, name="five")
    assert p == app.schedules["five"]
    assert (p.task, p.kwargs, p.schedule) == ("t", {"x": 3}, Cron("*/5 * * * *", PARIS))
    assert app.periodic("t", every=1, name="by-name").task == "t"


def test_periodic_task_registers_the_task_and_its_schedule():
    app = App("d", broker="memory://d")

    @app.periodic_task(cron="0 3 * * *", tz=PARIS, name="nightly", queue="slow")
    def nightly():
        return "ran"

    assert nightly() == "ran"
    assert app.tasks["nightly"].queue == "slow"
    assert app.schedules["nightly"].task == "nightly"
    with pytest.raises(ConfigurationError, match="not a valid expression"):

        @app.periodic_task(cron="0 25 * * *", name="broken")
        def broken():
            pass

    assert "broken" not in app.tasks  # refused before the task was registered


def test_fire_key_is_schedule_and_utc_fire_time():
    p = Periodic("nightly", "t", Cron("30 2 * * *", PARIS))
    assert p.key(utc(2025, 3, 30, 1)) == "nightly:2025-03-30T01:00:00+00:00"


# -- configuration refusals (regressions) --------------------------------------------------------
@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"ttl": 10, "tick": 10}, "tick 10s must be shorter than the lock TTL 10s"),
        ({"ttl": 10, "tick": 30}, "tick 30s must be shorter than the lock TTL"),
        ({"ttl": 9, "renew": 4.5}, "renew interval 4.5s must be shorter than half"),
        ({"ttl": 9, "renew": 6}, "renew interval 6s must be shorter than half"),
        ({"ttl": 0}, "ttl must be a number of seconds > 0"),
        ({"tick": -1}, "tick must be a number of seconds > 0"),
    ],
)
def test_lock_configurations_that_cannot_hold_are_refused(kwargs, message):
    with pytest.raises(ConfigurationError, match=message):
        BeatConfig(**kwargs)


def test_leadership_refuses_renewal_at_half_the_ttl():
    lock = open_lock(f"memory://{uuid.uuid4().hex}")
    with pytest.raises(ConfigurationError, match="shorter than half"):
        Leadership(lock, "n", ttl=3, renew=1.5)
    assert Leadership(lock, "n", ttl=3).renew_every == 1.0


def test_beat_cli_refuses_a_loop_interval_not_below_the_ttl(tmp_path, capsys, monkeypatch):
    module = _beat_module(tmp_path, f"sqlite:///{tmp_path / 'b.db'}")
    monkeypatch.syspath_prepend(str(tmp_path))
    assert ackwise_main(["beat", f"{module}:app", "--ttl", "2", "--tick", "2"]) == 2
    assert "tick 2s must be shorter than the lock TTL 2s" in capsys.readouterr().err


# -- leadership: monotonic validity, step-down ---------------------------------------------------
class FakeClock:
    """A monotonic clock and a wall clock that move together, by hand."""

    def __init__(self, wall: dt.datetime) -> None:
        self.now = 1000.0
        self.wall0 = wall

    def mono(self) -> float:
        return self.now

    def wall(self) -> dt.datetime:
        return self.wall0 + dt.timedelta(seconds=self.now - 1000.0)

    def advance(self, seconds: float) -> None:
        self.now += seconds


def _memory_lock(clock: FakeClock, store: str) -> LeaderLock:
    from ackwise.backends.memory._lock import MemoryLeaderLock

    return MemoryLeaderLock(BrokerURL.parse(f"memory://{store}"), clock=clock.mono)


def test_validity_is_judged_by_the_monotonic_clock_from_the_acquire_start():
    clock = FakeClock(utc(2025, 1, 1))
    inner = _memory_lock(clock, uuid.uuid4().hex)

    class SlowLock(LeaderLock):
        """A store whose every call takes one second."""

        def acquire(self, *args):
            clock.advance(1.0)
            return inner.acquire(*args)

        def renew(self, *args):
            clock.advance(1.0)
            return inner.renew(*args)

        def release(self, *args):
            return inner.release(*args)

        def claim(self, *args):
            return inner.claim(*args)

        def last_fires(self, *args):
            return inner.last_fires(*args)

        def info(self, *args):
            return inner.info(*args)

    lead = Leadership(SlowLock(inner.url), "n", ttl=3, clock=clock.mono)
    assert lead.try_acquire()
    assert lead.remaining() == pytest.approx(2.0)  # the call's second counts against the TTL
    clock.advance(1.99)
    assert lead.is_leader
    clock.advance(0.02)
    assert not lead.is_leader  # no store call needed to know


def test_leader_steps_down_without_a_store_call_once_its_deadline_passed():
    clock = FakeClock(utc(2025, 1, 1))
    calls = []
    lock = _memory_lock(clock, uuid.uuid4().hex)
    lead = Leadership(lock, "n", ttl=3, clock=clock.mono)
    assert lead.try_acquire()
    lock.renew = lambda *a: calls.append(a) or True  # type: ignore[method-assign]
    clock.advance(3.0)  # paused past the TTL before its renewal ran
    assert lead.maintain() is False
    assert calls == [] and lead.token is None
    assert lead.claim("s", 1) is Claim.NOT_HOLDER


def _leader() -> tuple[FakeClock, LeaderLock, Leadership]:
    """A memory lock store, and a Leadership (ttl 3 s) that has just taken it."""
    clock = FakeClock(utc(2025, 1, 1))
    lock = _memory_lock(clock, uuid.uuid4().hex)
    lead = Leadership(lock, "n", ttl=3, clock=clock.mono)
    assert lead.try_acquire()
    return clock, lock, lead


def test_transient_renewal_failure_keeps_the_lock_until_the_deadline():
    clock, lock, lead = _leader()
    fence = lead.fence
    clock.advance(1.0)
    renew = lock.renew
    failures = [TransientAdapterError("database is locked")]

    def busy_once(*args):
        if failures:
            raise failures.pop()
        return renew(*args)

    lock.renew = busy_once  # type: ignore[method-assign]
    assert lead.maintain() is True  # the store was busy: still the leader, same fence
    assert lead.is_leader and lead.fence == fence
    clock.advance(0.25)  # retried a quarter of the renewal interval later, and renewed
    assert lead.maintain() is True
    clock.advance(2.5)  # past the first deadline: only the renewal keeps it
    assert lead.is_leader and lead.fence == fence


def test_renewal_failing_until_the_deadline_steps_down():
    clock, lock, lead = _leader()
    clock.advance(1.0)

    def broken(*args):
        raise TransientAdapterError("connection reset")

    lock.renew = broken  # type: ignore[method-assign]
    assert lead.maintain() is True
    clock.advance(1.9)
    assert lead.maintain() is True
    clock.advance(0.2)  # the deadline (3 s after the acquire started) passed
    assert lead.maintain() is False
    assert lead.token is None and not lead.is_leader


def test_a_failing_renewal_warns_once_per_episode(caplog):
    clock, lock, lead = _leader()
    renew = lock.renew
    failing = [True]

    def flaky(*args):
        if failing[0]:
            raise TransientAdapterError("connection reset")
        return renew(*args)

    lock.renew = flaky  # type: ignore[method-assign]
    caplog.set_level(logging.DEBUG, logger="ackwise")
    clock.advance(1.0)
    for _ in range(4):  # four retries, a quarter of the renewal interval apart
        assert lead.maintain() is True
        clock.advance(0.25)
    failing[0] = False
    assert lead.maintain() is True  # renewed: the episode is over
    warnings = [r for r in caplog.records if r.levelno >= logging.WARNING]
    assert [r.getMessage() for r in warnings] == [
        "lock n: renewal failed (connection reset); retrying until the deadline"
    ]
    assert any("renewed again after 4 failed attempt(s)" in r.getMessage() for r in caplog.records)
    failing[0] = True  # a new episode warns again
    clock.advance(1.0)
    assert lead.maintain() is True
    assert sum(r.levelno >= logging.WARNING for r in caplog.records) == 2


def test_permanent_renewal_failure_steps_down_immediately():
    clock, lock, lead = _leader()
    clock.advance(1.0)

    def refused(*args):
        raise PermanentAdapterError("no such table: ackwise_locks")

    lock.renew = refused  # type: ignore[method-assign]
    assert lead.maintain() is False
    assert not lead.is_leader


# -- beat: fenced fires, policies, takeover ------------------------------------------------------
def _app(every: float = 1.0, **periodic) -> App:
    app = App(f"beat-{uuid.uuid4().hex[:8]}", broker=f"memory://{uuid.uuid4().hex}")

    @app.task(name="tick")
    def tick(n=None):
        pass

    app.periodic(tick, every=every, name="tick", **periodic)
    return app


def _beat(app: App, clock: FakeClock, store: str, **config) -> Beat:
    cfg = BeatConfig(**{"ttl": 3.0, "tick": 0.5, **config})
    return Beat(app, cfg, lock=_memory_lock(clock, store), clock=clock.mono, wall=clock.wall)


def _fired(app: App) -> list[dict]:
    adapter = app.adapter()
    adapter.open()
    adapter.declare(QueueSpec("default"))
    out = []
    for d in adapter.receive("default", max_messages=10_000, wait=0, lease=60):
        env = decode_envelope(d.body)
        out.append({**env.headers["beat"], "key": env.headers["idempotency_key"]})
    return out


def _drive(beats: list[Beat], clock: FakeClock, seconds: float, step: float = 0.0625) -> None:
    """Run the beats' loops for ``seconds`` of fake time, end included (exact binary steps)."""
    end = clock.now + seconds
    while clock.now <= end:
        for b in beats:
            b.run_once()
        clock.advance(step)


def test_two_beats_on_one_store_fire_every_tick_once_with_its_idempotency_key():
    clock = FakeClock(utc(2025, 1, 1, 12))
    app, store = _app(every=1.0), uuid.uuid4().hex
    a, b = _beat(app, clock, store), _beat(app, clock, store)
    _drive([a, b], clock, 10.0)
    fires = _fired(app)
    assert [f["fire_time"] for f in fires] == [
        utc(2025, 1, 1, 12, 0, s).isoformat() for s in range(1, 11)
    ]
    assert {f["fence"] for f in fires} == {1}
    assert fires[0]["key"] == "tick:2025-01-01T12:00:01+00:00"
    assert a.is_leader != b.is_leader


def test_coalesce_fires_once_for_ticks_missed_while_no_leader_ran():
    clock = FakeClock(utc(2025, 1, 1, 12))
    app, store = _app(every=1.0), uuid.uuid4().hex
    a = _beat(app, clock, store)
    _drive([a], clock, 2.5)
    clock.advance(10.0)  # the only beat was stopped: ten ticks pass
    _drive([a], clock, 0.1)
    assert [f["fire_time"][11:19] for f in _fired(app)] == ["12:00:01", "12:00:02", "12:00:12"]


def test_catch_up_fires_each_missed_tick_bounded_by_the_limit():
    clock = FakeClock(utc(2025, 1, 1, 12))
    app, store = _app(every=1.0, missed="catch_up", catch_up_limit=4), uuid.uuid4().hex
    a = _beat(app, clock, store)
    _drive([a], clock, 1.5)
    clock.advance(2.0)
    _drive([a], clock, 0.1)  # 2 missed: both fired
    clock.advance(10.0)
    _drive([a], clock, 0.1)  # 10 missed: the newest 4
    seconds = [int(f["fire_time"][17:19]) for f in _fired(app)]
    assert seconds == [1, 2, 3, 10, 11, 12, 13]


def test_a_catch_up_slower_than_the_ttl_renews_the_lock_between_claims():
    # A store that takes 0.1 s a claim (a loaded database): catching up on 60 missed ticks
    # takes 6 s, twice the TTL.  The leader must renew as it goes, not lose the lock halfway
    # and leave the rest to a handover (which, repeated, never catches up).
    clock = FakeClock(utc(2025, 1, 1, 12))
    app, store = _app(every=1.0, missed="catch_up"), uuid.uuid4().hex
    a = _beat(app, clock, store)
    real_claim = a.lock.claim

    def slow_claim(*args):
        clock.advance(0.1)
        return real_claim(*args)

    a.lock.claim = slow_claim  # type: ignore[method-assign]
    _drive([a], clock, 1.2)
    assert a.is_leader and len(_fired(app)) == 1
    clock.advance(60.0)  # frozen: the lock expired, 60 ticks passed unfired
    a.run_once()  # takes the lock again and catches up, in one pass
    assert a.is_leader
    fires = _fired(app)
    assert [f["fire_time"][11:19] for f in fires] == [
        (utc(2025, 1, 1, 12) + dt.timedelta(seconds=s)).isoformat()[11:19] for s in range(2, 62)
    ]
    assert {f["fence"] for f in fires} == {2}


def test_a_new_leader_continues_from_the_fires_recorded_in_the_store():
    clock = FakeClock(utc(2025, 1, 1, 12))
    app, store = _app(every=1.0, missed="catch_up"), uuid.uuid4().hex
    a, b = _beat(app, clock, store), _beat(app, clock, store)
    _drive([a, b], clock, 3.2)
    leader, follower = (a, b) if a.is_leader else (b, a)
    _drive([follower], clock, 6.0)  # the leader froze: the follower takes over after the TTL
    assert follower.is_leader
    _drive([leader, follower], clock, 2.0)  # the old leader wakes up, steps down
    assert not leader.is_leader
    fires = _fired(app)
    assert [int(f["fire_time"][17:19]) for f in fires] == list(range(1, 12))
    assert [f["fence"] for f in fires] == [1, 1, 1] + [2] * 8


def test_a_paused_leader_that_wakes_cannot_fire_a_tick_again():
    clock = FakeClock(utc(2025, 1, 1, 12))
    app, store = _app(every=1.0), uuid.uuid4().hex
    a, b = _beat(app, clock, store), _beat(app, clock, store)
    _drive([a], clock, 1.2)
    assert a.is_leader
    # Paused right before it would fire 12:00:02; B leads meanwhile and fires it.
    _drive([b], clock, 5.0)
    token = a.leadership.token
    assert token is not None
    # Even bypassing A's own deadline check, the store refuses its token.
    assert a.lock.claim(a.lock_name, token, "tick", 1) is Claim.NOT_HOLDER
    _drive([a, b], clock, 1.0)
    keys = [f["key"] for f in _fired(app)]
    assert len(keys) == len(set(keys))


def test_lost_ownership_makes_the_beat_a_follower_instead_of_crashing():
    clock = FakeClock(utc(2025, 1, 1, 12))
    app, store = _app(every=1.0), uuid.uuid4().hex
    a = _beat(app, clock, store)
    a.run_once()
    assert a.is_leader
    failing = {"on": True}
    real_renew, real_acquire = a.lock.renew, a.lock.acquire

    def renew(*args):
        if failing["on"]:
            raise TransientAdapterError("lock store unreachable")
        return real_renew(*args)

    def acquire(*args):
        if failing["on"]:
            raise TransientAdapterError("lock store unreachable")
        return real_acquire(*args)

    a.lock.renew, a.lock.acquire = renew, acquire  # type: ignore[method-assign]
    _drive([a], clock, 2.5)  # renewal due at ttl/3 fails: retried, still the leader
    assert a.is_leader and a.leadership.fence == 1
    _drive([a], clock, 1.0)  # the deadline passed without a renewal: step down, no exception
    assert not a.is_leader
    failing["on"] = False
    _drive([a], clock, 4.0)  # store back; the old lock expired: leader again
    assert a.is_leader and a.leadership.fence == 2


def _failing_claims(beat: Beat, fate: Callable[[int], str]) -> None:
    """Have ``beat``'s claims fail as ``fate(n)`` says of its n-th claim (from 1): ``"ok"``,
    ``"lost"`` (the store records it, then the answer is lost: a timeout, a cut connection)
    or ``"down"`` (the store is not reached)."""
    real_claim = beat.lock.claim
    count = [0]

    def claim(*args):
        count[0] += 1
        what = fate(count[0])
        if what == "down":
            raise TransientAdapterError("lock store unreachable")
        result = real_claim(*args)
        if what == "lost":
            raise TransientAdapterError("lock store: the connection broke before the answer")
        return result

    beat.lock.claim = claim  # type: ignore[method-assign]


def test_a_claim_whose_answer_was_lost_is_fired_once_when_the_store_answers_again():
    # The store recorded the claim, its answer was lost (a timeout under load, a cut): the
    # beat steps down, asks again with the same token, and fires it (B04 on a loaded host:
    # the new leader's first claim timed out and its tick was never fired).
    clock = FakeClock(utc(2025, 1, 1, 12))
    app, store = _app(every=1.0, missed="catch_up"), uuid.uuid4().hex
    a = _beat(app, clock, store)
    _failing_claims(a, lambda n: "lost" if n == 3 else "ok")
    _drive([a], clock, 8.0)
    fires = _fired(app)
    assert [int(f["fire_time"][17:19]) for f in fires] == list(range(1, 9))


def _answer_lost_then_the_lock_moves(
    a: Beat, b: Beat, clock: FakeClock, first: str = "lost"
) -> list[bool]:
    """A fires 12:00:01 and 12:00:02; its claim of 12:00:03 fails as ``first`` says (``"lost"``:
    recorded, its answer lost; ``"down"``: not recorded) and A's store stays out of reach
    (every later claim of A's fails) until B has led for a while.  Returns the switch that
    brings A's store back: ``down[0] = False``."""
    _drive([a], clock, 2.5)
    down = [True]
    _failing_claims(a, lambda n: first if n == 1 else ("down" if down[0] else "ok"))
    _drive([a], clock, 0.6)  # the claim of 12:00:03
    assert not a.is_leader
    _drive([b], clock, 5.0)  # a's lock expires in the store; b leads from what it records
    assert b.is_leader
    return down


def _fires_by_second(app: App) -> list[tuple[int, int]]:
    """(second, fence) of every fire, in the order published."""
    return [(int(f["fire_time"][17:19]), f["fence"]) for f in _fired(app)]


def test_a_claim_whose_answer_was_lost_is_fired_once_by_its_leader_after_the_lock_moved_on():
    # The claim of 12:00:03 was recorded under A's lock, so B started after it; when A's store
    # answers again, the lock has moved: the store says the claim was A's (fence 1), and A
    # publishes it, late.  Before, A gave that tick up and nobody fired it (B04 on Redis
    # Cluster: one tick missing).
    clock = FakeClock(utc(2025, 1, 1, 12))
    app, store = _app(every=1.0, missed="catch_up"), uuid.uuid4().hex
    a, b = _beat(app, clock, store), _beat(app, clock, store)
    down = _answer_lost_then_the_lock_moves(a, b, clock)
    down[0] = False
    _drive([a, b], clock, 1.0)
    fires = _fires_by_second(app)
    assert sorted(fires) == [(1, 1), (2, 1), (3, 1), *((s, 2) for s in range(4, 10))]
    assert fires.index((3, 1)) > fires.index((4, 2))  # late: after b's first fires
    assert not a.is_leader and b.is_leader


def test_a_beat_stopping_after_the_lock_moved_fires_its_claim_whose_answer_was_lost(caplog):
    # B04 as it failed: the old leader, frozen with its claim on the wire, wakes to a SIGTERM
    # after the lock moved.  As it stops, it asks who claimed the tick, fires it, and its
    # release is refused as stale.
    clock = FakeClock(utc(2025, 1, 1, 12))
    app, store = _app(every=1.0, missed="catch_up"), uuid.uuid4().hex
    a, b = _beat(app, clock, store), _beat(app, clock, store)
    down = _answer_lost_then_the_lock_moves(a, b, clock)
    down[0] = False
    with caplog.at_level(logging.INFO, logger="ackwise"):
        a.shutdown()
    assert sorted(_fires_by_second(app)) == [
        (1, 1),
        (2, 1),
        (3, 1),
        *((s, 2) for s in range(4, 9)),
    ]
    assert "firing it late" in caplog.text and "release refused" in caplog.text
    _drive([b], clock, 1.0)
    assert _fires_by_second(app) == [(9, 2)]  # b goes on, and never fires 12:00:03


def test_a_beat_leads_again_only_once_its_claim_whose_answer_was_lost_is_settled():
    # One beat; its claim of 12:00:03 is recorded, its answer lost, and its claims keep failing
    # past the TTL while the store still answers acquires.  Leading again then would lose the
    # next claim's answer too, and forget the first: it takes the lock again only once the
    # store has told it the first claim was its own.
    clock = FakeClock(utc(2025, 1, 1, 12))
    app, store = _app(every=1.0, missed="catch_up"), uuid.uuid4().hex
    a = _beat(app, clock, store)
    _drive([a], clock, 2.5)
    down = [True]
    _failing_claims(a, lambda n: "lost" if n == 1 else ("down" if down[0] else "ok"))
    _drive([a], clock, 5.0)
    down[0] = False
    _drive([a], clock, 2.0)
    assert sorted(_fires_by_second(app)) == [
        (1, 1),
        (2, 1),
        (3, 1),
        *((s, 2) for s in range(4, 10)),
    ]


def test_a_claim_whose_answer_was_lost_before_the_store_recorded_it_is_fired_by_the_next_leader(
    caplog,
):
    # The claim never reached the store: B starts from 12:00:02 and claims 12:00:03 itself;
    # A, asking later, learns that B's fence claimed it, and publishes nothing.
    clock = FakeClock(utc(2025, 1, 1, 12))
    app, store = _app(every=1.0, missed="catch_up"), uuid.uuid4().hex
    a, b = _beat(app, clock, store), _beat(app, clock, store)
    down = _answer_lost_then_the_lock_moves(a, b, clock, first="down")
    down[0] = False
    with caplog.at_level(logging.INFO, logger="ackwise"):
        _drive([a, b], clock, 1.0)
    assert _fires_by_second(app) == [(1, 1), (2, 1), *((s, 2) for s in range(3, 10))]
    assert "the leader with fence 2 claimed that fire" in caplog.text


def test_a_claim_whose_answer_was_lost_is_given_up_by_a_store_that_cannot_say_who_claimed_it(
    caplog,
):
    # A third-party lock without claimed_by (the default answers None): once the lock moved
    # on, what the lost attempt did cannot be known, so its tick is given up, never fired
    # twice (as before claimed_by existed).
    from ackwise.backends.memory._lock import MemoryLeaderLock

    class NoClaimers(MemoryLeaderLock):
        claimed_by = LeaderLock.claimed_by

    clock = FakeClock(utc(2025, 1, 1, 12))
    app, store = _app(every=1.0, missed="catch_up"), uuid.uuid4().hex
    cfg = BeatConfig(ttl=3.0, tick=0.5)
    a, b = (
        Beat(
            app,
            cfg,
            lock=NoClaimers(BrokerURL.parse(f"memory://{store}"), clock=clock.mono),
            clock=clock.mono,
            wall=clock.wall,
        )
        for _ in range(2)
    )
    down = _answer_lost_then_the_lock_moves(a, b, clock)
    down[0] = False
    with caplog.at_level(logging.WARNING, logger="ackwise"):
        _drive([a, b], clock, 1.0)
    seconds = [s for s, _ in _fires_by_second(app)]
    assert seconds == [1, 2, *range(4, 10)]
    assert "the fire for 2025-01-01T12:00:03+00:00 is given up" in caplog.text


def test_a_beat_stopping_while_its_store_is_out_of_reach_warns_of_its_unanswered_claim(caplog):
    clock = FakeClock(utc(2025, 1, 1, 12))
    app, store = _app(every=1.0, missed="catch_up"), uuid.uuid4().hex
    a, b = _beat(app, clock, store), _beat(app, clock, store)
    _answer_lost_then_the_lock_moves(a, b, clock)  # a's store stays down
    with caplog.at_level(logging.WARNING, logger="ackwise"):
        a.shutdown()
    assert "the fire for 2025-01-01T12:00:03+00:00 may be lost" in caplog.text
    assert 3 not in [s for s, _ in _fires_by_second(app)]


def test_a_schedule_never_fired_starts_at_its_next_tick():
    clock = FakeClock(utc(2025, 1, 1, 12, 0, 0) + dt.timedelta(milliseconds=500))
    app = _app(every=60.0)
    a = _beat(app, clock, uuid.uuid4().hex)
    delay = a.run_once()
    assert a.is_leader and _fired(app) == []
    assert delay == pytest.approx(0.5)  # the loop sleeps at most a tick
    _drive([a], clock, 60.0, step=0.25)
    assert [f["fire_time"] for f in _fired(app)] == ["2025-01-01T12:01:00+00:00"]


def test_stop_releases_the_lock_for_the_next_beat():
    clock = FakeClock(utc(2025, 1, 1, 12))
    app, store = _app(), uuid.uuid4().hex
    a, b = _beat(app, clock, store), _beat(app, clock, store)
    a.run_once()
    assert a.is_leader
    a.shutdown()
    b.run_once()
    assert b.is_leader


# -- the command ---------------------------------------------------------------------------------
def _beat_module(tmp_path: Path, broker: str, every: float = 0.2) -> str:
    name = f"beatmod_{uuid.uuid4().hex[:8]}"
    (tmp_path / f"{name}.py").write_text(
        textwrap.dedent(
            f"""
            from ackwise import App

            app = App("beatcli-{name}", broker={broker!r})

            @app.periodic_task(every={every})
            def ping():
                pass

            @app.task(name="report")
            def report(day):
                pass

            app.periodic(report.s("today"), cron="30 2 * * *", tz="Europe/Paris", name="nightly",
                         missed="catch_up", catch_up_limit=3)
            """
        )
    )
    return name


def test_beat_list_prints_every_schedule_with_its_next_fire_times(tmp_path, capsys, monkeypatch):
    module = _beat_module(tmp_path, f"sqlite:///{tmp_path / 'b.db'}", every=3600)
    monkeypatch.syspath_prepend(str(tmp_path))
    assert ackwise_main(["beat", f"{module}:app", "--list"]) == 0
    out = capsys.readouterr().out
    lines = out.splitlines()
    assert lines[0].split() == [
        "schedule",
        "task",
        "when",
        "missed",
        "queue",
        "next",
        "fire",
        "times",
    ]
    ping = next(line for line in lines if line.startswith(f"{module}.ping"))
    assert "every 3600s" in ping and "coalesce" in ping and ping.count(":00:00+00:00") == 3
    nightly = next(line for line in lines if line.startswith("nightly"))
    assert "cron 30 2 * * * Europe/Paris" in nightly and "catch_up (limit 3)" in nightly
    assert nightly.count("T02:30:00+0") == 3 or "T03:00:00+02:00" in nightly
    assert not (tmp_path / "b.db").exists()  # --list touches no store


def test_format_schedules_shows_the_dst_shifted_fire():
    from ackwise.cli._beat import format_schedules

    app = App("fmt", broker="memory://fmt")
    app.periodic(app.task(name="t")(lambda: None), cron="30 2 * * *", tz=PARIS, name="n")
    out = format_schedules(app, now=utc(2025, 3, 29, 12), count=2)
    assert "2025-03-30T03:00:00+02:00, 2025-03-31T02:30:00+02:00" in out


@pytest.mark.slow
def test_beat_process_fires_then_releases_its_lock_on_sigterm(tmp_path):
    url = f"sqlite:///{tmp_path / 'b.db'}"
    module = _beat_module(tmp_path, url, every=0.2)
    log = tmp_path / "beat.log"
    with open(log, "wb") as out:
        proc = subprocess.Popen(
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
    try:
        app = App("reader", broker=url)
        adapter = app.adapter()
        eventually(
            lambda: os.path.exists(tmp_path / "b.db") and adapter.stats("default").ready >= 3,
            30,
            description=f"three fires:\n{log.read_text()}",
        )
        lock = open_lock(url)
        info = lock.info(f"ackwise.beat.beatcli-{module}")
        assert isinstance(info, LockInfo) and info.owner.endswith(f":{proc.pid}")
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(30) == 0
        assert lock.info(f"ackwise.beat.beatcli-{module}") is None
        assert "released" in log.read_text()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)
