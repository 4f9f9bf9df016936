"""The level-2 runner: cases at once, the exclusive ones alone, a case past its time failed and
closed, an interrupt closing the running cases.  Scenarios of this module's own on the memory
broker (registered for one test, then removed)."""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from ackwise import Ack
from ackwise_conformance import runner
from ackwise_conformance.harness import Harness, SimpleBroker
from ackwise_conformance.runner import run_cases
from ackwise_conformance.scenarios import SCENARIOS, Scenario


@pytest.fixture
def register(monkeypatch: pytest.MonkeyPatch) -> Callable[..., str]:
    def add(fn: Callable[[Harness], None], *, exclusive: bool = False) -> str:
        sid = f"T{uuid.uuid4().hex[:6]}"
        monkeypatch.setitem(
            SCENARIOS, sid, Scenario(sid, "runner test", fn, (Ack.LATE,), {}, exclusive, 1.0)
        )
        return sid

    return add


@pytest.fixture
def broker() -> Iterator[SimpleBroker]:
    yield SimpleBroker(f"memory://{uuid.uuid4().hex}", name="memory")


def _until_closed(h: Harness, limit: float = 30.0) -> None:
    deadline = time.monotonic() + limit
    while not h.closed and time.monotonic() < deadline:
        time.sleep(0.02)


def test_cases_run_at_once(register, broker, tmp_path: Path) -> None:
    # Each of the two waits for the other: they pass only when both run at the same time.
    meet = threading.Barrier(2, timeout=20)
    sids = [register(lambda h: meet.wait()) for _ in range(2)]
    results = run_cases(broker, [(s, Ack.LATE) for s in sids], tmp_path, jobs=2)
    assert [r.status for r in results] == ["pass", "pass"], [r.reason for r in results]


def test_one_job_runs_the_cases_one_by_one(register, broker, tmp_path: Path) -> None:
    running, most = [0], [0]
    lock = threading.Lock()

    def case(h: Harness) -> None:
        with lock:
            running[0] += 1
            most[0] = max(most[0], running[0])
        time.sleep(0.2)
        with lock:
            running[0] -= 1

    sids = [register(case) for _ in range(3)]
    results = run_cases(broker, [(s, Ack.LATE) for s in sids], tmp_path, jobs=1)
    assert [r.status for r in results] == ["pass"] * 3
    assert most[0] == 1


def test_an_exclusive_case_runs_alone_after_the_others(register, broker, tmp_path: Path) -> None:
    finished: list[str] = []
    seen_at_start: list[list[str]] = []

    def shared(name: str) -> Callable[[Harness], None]:
        def run(h: Harness) -> None:
            time.sleep(0.3)
            finished.append(name)

        return run

    alone = register(lambda h: seen_at_start.append(list(finished)), exclusive=True)
    others = [register(shared(f"s{i}")) for i in range(3)]
    selected = [(alone, Ack.LATE), *[(s, Ack.LATE) for s in others]]
    results = run_cases(broker, selected, tmp_path, jobs=4)
    assert [r.status for r in results] == ["pass"] * 4
    assert [sorted(s) for s in seen_at_start] == [["s0", "s1", "s2"]]


def test_a_case_past_its_time_fails_and_is_closed(
    register, broker, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(runner, "CASE_TIMEOUT", 1.0)
    harnesses: list[Harness] = []

    def hangs(h: Harness) -> None:
        harnesses.append(h)
        _until_closed(h)

    quick = register(lambda h: None)
    slow = register(hangs)
    results = run_cases(broker, [(slow, Ack.LATE), (quick, Ack.LATE)], tmp_path, jobs=2)
    assert results[0].status == "fail"
    assert "did not finish within 1s" in results[0].reason
    assert results[1].status == "pass"
    assert harnesses and harnesses[0].closed


def test_an_interrupt_closes_the_running_cases(register, broker, tmp_path: Path) -> None:
    harnesses: list[Harness] = []
    started = threading.Event()

    def hangs(h: Harness) -> None:
        harnesses.append(h)
        started.set()
        _until_closed(h)

    def interrupt(result: object, progress: object) -> None:
        started.wait(10)
        raise KeyboardInterrupt

    quick = register(lambda h: None)
    slow = register(hangs)
    with pytest.raises(KeyboardInterrupt):
        run_cases(
            broker, [(slow, Ack.LATE), (quick, Ack.LATE)], tmp_path, jobs=2, on_result=interrupt
        )
    assert harnesses and harnesses[0].closed


def test_embedded_cases_get_a_store_of_their_own(tmp_path: Path) -> None:
    from ackwise_conformance.harness import own_store

    abs_url = f"sqlite:///{tmp_path / 'user.db'}?busy_timeout=20"  # sqlite:////tmp/…/user.db
    case = own_store(SimpleBroker(abs_url), tmp_path / "stores" / "C01-LATE")
    assert case.url == f"sqlite:///{tmp_path / 'stores' / 'C01-LATE' / 'user.db'}?busy_timeout=20"
    assert (tmp_path / "stores" / "C01-LATE").is_dir()
    rel = own_store(SimpleBroker("sqlite:///relative.db"), tmp_path / "C02-LATE")
    assert rel.url == f"sqlite:///{tmp_path / 'C02-LATE' / 'relative.db'}"
    mem = own_store(SimpleBroker("memory://abc"), tmp_path / "C03-LATE")
    assert mem.url == "memory://abc-C03-LATE"
    redis = SimpleBroker("redis://127.0.0.1:6379/0")
    assert own_store(redis, tmp_path / "C04-LATE") is redis


def test_early_messages_acked_but_never_started_count_as_lost(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """On a broker that cannot count what the workers hold, an early-acked message that never
    started is gone for good: the drain ends once the journal is quiet, the checker sees it
    lost (it timed out as "did not drain" before)."""
    import dataclasses

    from ackwise_conformance import harness as harness_module

    monkeypatch.setattr(harness_module, "EARLY_QUIET", 0.5)
    h = Harness(SimpleBroker(f"memory://{uuid.uuid4().hex}"), Ack.EARLY, tmp_path / "case")
    try:
        h.capabilities = dataclasses.replace(h.capabilities, global_in_flight=False)
        h.publish(["a"])
        (d,) = h.adapter.receive(h.queue, max_messages=1, wait=1.0, lease=30.0)
        h.adapter.ack_before_start([d])  # recorded at the broker; the task never starts
        h.drain(timeout=10.0)
        assert h.history().summary() == {"lost": 1}
    finally:
        h.close()


def test_the_drain_waits_for_the_journal_where_the_broker_totals_lag(tmp_path: Path) -> None:
    """A broker that counts every delivery can still report a publish late (RabbitMQ's
    management totals): its empty stats alone must not end the drain while the journal has
    not seen the messages end (C02-LATE ended early so and reported them lost)."""
    from ackwise import QueueStats
    from ackwise_conformance.harness import ScenarioFailed

    h = Harness(SimpleBroker(f"memory://{uuid.uuid4().hex}"), Ack.LATE, tmp_path / "case")
    try:
        assert h.counts_in_flight
        h.adapter.stats = lambda queue: QueueStats(queue, 0, 0, 0, 0, 0.0)  # type: ignore[method-assign]
        h.publish(["a", "b", "c"])
        assert not h.settled()
        with pytest.raises(ScenarioFailed, match="did not drain"):
            h.drain(timeout=1.0)
        h.worker()
        h.drain(timeout=30.0)
        assert h.history().summary() == {"ok": 3}
    finally:
        h.close()


def test_the_drain_waits_through_transient_errors_of_its_own_reads(tmp_path: Path) -> None:
    """After a failover the suite's reads can meet a queue whose new leader is still being
    elected (RabbitMQ answers "nodedown", a transient error): the drain waits on, within its
    patience, instead of failing the case (a RabbitMQ cluster failover run failed so)."""
    from ackwise.errors import BrokerUnavailable

    h = Harness(SimpleBroker(f"memory://{uuid.uuid4().hex}"), Ack.LATE, tmp_path / "case")
    try:
        h.publish(["a", "b", "c"])
        h.worker()
        listed = h.adapter.dead_letters
        failures = [5]

        def recovering(queue: str, *, limit: int = 100) -> Any:
            if failures[0]:
                failures[0] -= 1
                raise BrokerUnavailable("nodedown (541)")
            return listed(queue, limit=limit)

        h.adapter.dead_letters = recovering  # type: ignore[method-assign]
        h.drain(timeout=30.0)
        assert failures == [0]
        assert h.history().summary() == {"ok": 3}
    finally:
        h.close()


def test_closing_waits_for_a_publish_declaring_the_queue(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An interrupted run closes cases from another thread: a publish still declaring the
    case's queue must not re-create it after the close deleted it (a run on RabbitMQ left
    delay tiers so)."""
    from ackwise import open_adapter
    from ackwise.backends.memory._adapter import MemoryAdapter
    from ackwise.errors import QueueNotFound

    url = f"memory://{uuid.uuid4().hex}"
    h = Harness(SimpleBroker(url), Ack.LATE, tmp_path / "case")
    declare = MemoryAdapter.declare
    declaring = threading.Event()

    def slow_declare(self: MemoryAdapter, spec: object) -> None:
        declaring.set()
        time.sleep(0.5)
        declare(self, spec)  # type: ignore[arg-type]

    monkeypatch.setattr(MemoryAdapter, "declare", slow_declare)
    publisher = threading.Thread(target=lambda: _ignore_closed(h.publish, ["a"]))
    publisher.start()
    assert declaring.wait(5)
    h.close()
    publisher.join(5)
    probe = open_adapter(url)
    probe.open()
    try:
        with pytest.raises(QueueNotFound):
            probe.stats(h.queue)
    finally:
        probe.close()
    with pytest.raises(Exception, match="closed"):
        h.publish(["b"])


def _ignore_closed(call: Callable[..., object], *args: object) -> None:
    try:
        call(*args)
    except Exception:
        pass


def test_the_drain_waits_for_a_slow_broker_that_keeps_finishing_messages(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``drain(timeout)`` bounds the time without progress, not the whole drain: a broker
    slower than the timeout that keeps finishing messages drains (C21's 5,000 messages on the
    example directory adapter, a loaded machine, failed as "did not drain")."""
    from ackwise.backends.memory._adapter import MemoryAdapter

    h = Harness(SimpleBroker(f"memory://{uuid.uuid4().hex}"), Ack.LATE, tmp_path / "case")
    receive = MemoryAdapter.receive

    def one_at_a_time(self: MemoryAdapter, queue: str, **kw: Any) -> Any:
        time.sleep(0.4)  # a slow broker: 5 messages take 2 s
        return receive(self, queue, **{**kw, "max_messages": 1})

    try:
        h.publish([f"m{i}" for i in range(5)])
        monkeypatch.setattr(MemoryAdapter, "receive", one_at_a_time)
        h.worker(prefetch=1)
        h.drain(timeout=1.5)
        assert h.history().summary() == {"ok": 5}
    finally:
        h.close()


def test_a_worker_of_a_network_broker_is_paused_once_however_slow_a_probe_write(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The write probe that keeps a paused process out of a SQLite write transaction is for
    embedded stores.  On SQS under load a probe slower than its timeout resumed the paused
    worker in slices until its lease lapsed and its own receive took the redelivery that C07
    waits for another worker to run ("start attempt 2: still false after 60 s")."""
    import signal

    from ackwise_conformance._case_helpers import pause_outside_writes
    from ackwise_conformance.brokers import (
        provide_or_skip,
    )

    redis = provide_or_skip("redis", tmp_dir=tmp_path / "redis", durable=False)
    h = Harness(redis, Ack.LATE, tmp_path / "case")
    probes = [0]

    def too_slow(timeout: float) -> bool:
        probes[0] += 1
        return False

    monkeypatch.setattr(h, "write_gets_through", too_slow)
    try:
        w = h.worker(pool="prefork", concurrency=1)
        pause_outside_writes(h, w, 0.5, "worker 0")
        assert w.stopped()
        assert probes[0] == 0
        time.sleep(0.3)
        assert w.stopped(), "the paused worker was resumed"
        w.signal(signal.SIGCONT)
    finally:
        h.close()
        redis.stop()
