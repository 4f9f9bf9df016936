"""Crash tests on the embedded SQLite broker beyond the conformance catalogue.

The catalogue itself (C01-C28 in every mode) runs in tests/test_crash_conformance.py; these
add faults it does not: random SIGKILLs of workers and executors during a drain, and a long
task under the prefork pool.  They use the same harness, journal and checker.
"""

from __future__ import annotations

import os
import random

import pytest

from ackwise import Ack
from ackwise_conformance import eventually
from ackwise_conformance.harness import Harness, SimpleBroker

pytestmark = pytest.mark.slow


@pytest.fixture
def harness_for(tmp_path):
    made: list[Harness] = []

    def make(mode: Ack) -> Harness:
        h = Harness(SimpleBroker(f"sqlite:///{tmp_path / 'broker.db'}"), mode, tmp_path / "case")
        made.append(h)
        return h

    yield make
    for h in made:
        h.close()


@pytest.mark.parametrize("mode", list(Ack), ids=lambda m: m.name)
def test_random_kills_during_a_drain_keep_the_mode_contract(harness_for, mode):
    """Workers and executor children SIGKILLed at random while 400 tasks drain."""
    h = harness_for(mode)
    rng = random.Random(1234)
    keys = [f"r{i}" for i in range(400)]
    h.publish(keys, {"sleep": 0.01})
    workers = [h.worker(pool="prefork", concurrency=2, prefetch=4) for _ in range(2)]
    for _ in range(6):
        h.wait_for("start")
        starts = h.journal.records(ev="start")
        if rng.random() < 0.5:
            # the executor process of the latest start, wherever it runs
            h.kill_pid(int(starts[-1]["pid"]))
        else:
            victim = rng.choice(workers)
            victim.kill()
            workers.remove(victim)
            workers.append(h.worker(pool="prefork", concurrency=2, prefetch=4))
        h.quiet(0.3)
    h.drain(120)
    hist = h.history()
    hist.expect_no_unexpected()
    if mode is Ack.EARLY:
        hist.expect_no_duplicates()  # at most once, whatever was lost
    else:
        # At least once: every message completed, or is in the dead-letter store with a reason
        # (LATE: worker_lost when its executor was killed). Nothing silently dropped.
        lost = [f for f in hist.fates.values() if f.status == "lost"]
        assert not lost, f"lost: {[f.key for f in lost][:10]}"
        reasons = {d.reason for f in hist.fates.values() for d in f.dead}
        allowed = {"worker_lost"} if mode is Ack.LATE else {"max_deliveries"}
        assert reasons <= allowed, reasons
    hist.expect_broker_settled()


@pytest.mark.parametrize("pool", ["prefork", "threads"])
def test_task_four_times_its_lease_never_runs_twice(harness_for, pool):
    h = harness_for(Ack.LATE)
    h.publish(["long"], {"sleep": h.lease * 4})
    h.worker(pool=pool, concurrency=1)
    h.worker(pool=pool, concurrency=1)
    h.wait_for("end", key="long", timeout=h.lease * 4 + h.patience)
    h.drain()
    hist = h.history()
    hist.expect_ok_once()
    hist.expect_no_duplicates()
    hist.expect_broker_settled(dead=0)


def test_executor_children_die_with_their_worker(harness_for):
    """No orphan finishes a task behind the broker's back once its supervisor is gone."""
    h = harness_for(Ack.LATE)
    w = h.worker(pool="prefork", concurrency=1)
    h.publish(["victim"], {"gate": "victim"})
    [start] = h.wait_for("start", key="victim")
    child = int(start["pid"])
    assert child != w.pid
    w.kill()

    def gone() -> bool:
        try:
            os.kill(child, 0)
        except ProcessLookupError:
            return True
        try:
            with open(f"/proc/{child}/stat") as f:
                return f.read().split()[2] == "Z"
        except FileNotFoundError:
            return True

    eventually(gone, 5, description="the executor child to die with its SIGKILLed worker")
