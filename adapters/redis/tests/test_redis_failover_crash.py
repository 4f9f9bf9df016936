"""Failover: the primary that holds a queue is SIGKILLed mid-drain (late ack), a replica takes
over, and the ``ackwise worker`` finds the new primary by itself; nothing is lost.

Redis replicates asynchronously: what the dead primary had not yet sent its replica is gone.
For a publish, ``wait_replicas=1`` closes that hole (the publish returns once a replica has
the message).  For a receive or an ack it cannot: the new primary may not know that a message
was taken or acked, and delivers it again, so a message may run twice.  Each such duplicate
must be one that was taken before the kill; none first taken after it may run twice.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from redis_topologies import (
    LocalCluster,
    LocalSentinels,
    Node,
    TopologyUnavailable,
    publish_through_failover,
)

from ackwise import Ack
from ackwise.errors import TransientAdapterError
from ackwise_conformance.brokers import missing_broker
from ackwise_conformance.checker import History
from ackwise_conformance.harness import Harness, SimpleBroker
from ackwise_conformance.helpers import eventually

pytestmark = pytest.mark.slow

TASKS = 600
KILL_AFTER = 150  # tasks ended


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[LocalCluster]:
    try:
        deployment = LocalCluster(tmp_path / "cluster").start()
    except TopologyUnavailable as exc:
        missing_broker(str(exc))
    yield deployment
    deployment.stop()


@pytest.fixture
def sentinels(tmp_path: Path) -> Iterator[LocalSentinels]:
    try:
        deployment = LocalSentinels(tmp_path / "sentinel").start()
    except TopologyUnavailable as exc:
        missing_broker(str(exc))
    yield deployment
    deployment.stop()


def _kill_mid_drain(
    harness: Harness, victim: Node, failed_over: Callable[[], bool]
) -> tuple[float, float]:
    """Publish, start a worker, SIGKILL ``victim`` once KILL_AFTER tasks ended; once
    ``failed_over()``, drain.  When the kill came and how long the failover took."""
    keys = [f"k{i}" for i in range(TASKS)]
    for i in range(0, TASKS, 100):
        harness.publish(keys[i : i + 100], {"sleep": 0.004})
    harness.worker(pool="threads", concurrency=4)
    harness.wait_for("end", count=KILL_AFTER)
    killed_at = time.time()
    victim.kill()
    eventually(failed_over, 60, interval=0.1, description="a replica took over")
    took = time.time() - killed_at
    # The suite's own adapter (the checker's view) was idle through the failover: its
    # first call may still meet the dead primary's connection, and reconnects after it.
    eventually(_answers(harness), 10, interval=0.1, description="the new primary answers")
    harness.drain(timeout=90)
    return killed_at, took


def _answers(harness: Harness) -> Callable[[], bool]:
    def answers() -> bool:
        try:
            harness.stats()
        except TransientAdapterError:
            return False
        return True

    return answers


def _check(harness: Harness, killed_at: float, took: float) -> dict[str, int]:
    history = History.build(harness)
    history.expect_no_unexpected()
    history.expect_completed()  # nothing lost
    late = [
        f
        for f in history.fates.values()
        if len(f.starts) > 1 and min(s["t"] for s in f.starts) > killed_at
    ]
    if late:
        history.fail("a message first taken after the failover ran more than once", *late)
    history.expect_broker_settled(dead=0)
    summary = history.summary()
    print(f"failover in {took:.1f} s: {summary}")  # the duplicates, for the record (-s)
    return summary


def test_cluster_primary_killed_mid_drain(cluster: LocalCluster, tmp_path: Path) -> None:
    url = cluster.url(f"prefix=t-{uuid.uuid4().hex[:12]}&wait_replicas=1")
    harness = Harness(SimpleBroker(url, name="redis-cluster"), Ack.LATE, tmp_path / "case")
    try:
        ready = harness.adapter.keys(harness.queue).ready  # type: ignore[attr-defined]
        victim = cluster.primary_of(ready)

        def failed_over() -> bool:
            return cluster.healthy() and cluster.primary_of(ready) is not victim

        killed_at, took = _kill_mid_drain(harness, victim, failed_over)
        summary = _check(harness, killed_at, took)
        assert summary.get("ok", 0) + summary.get("duplicated", 0) == TASKS
    finally:
        harness.close()


def test_sentinel_master_killed_mid_drain(sentinels: LocalSentinels, tmp_path: Path) -> None:
    url = sentinels.url(f"prefix=t-{uuid.uuid4().hex[:12]}&wait_replicas=1")
    harness = Harness(SimpleBroker(url, name="redis-sentinel"), Ack.LATE, tmp_path / "case")
    try:
        victim = sentinels.master()

        def failed_over() -> bool:
            return sentinels.master() is not victim

        killed_at, took = _kill_mid_drain(harness, victim, failed_over)
        summary = _check(harness, killed_at, took)
        assert summary.get("ok", 0) + summary.get("duplicated", 0) == TASKS
    finally:
        harness.close()


def test_with_wait_replicas_a_master_killed_mid_publish_loses_no_confirmed_message(
    sentinels: LocalSentinels,
) -> None:
    """Producers publish one message per call with ``wait_replicas=1`` while the master is
    SIGKILLed: every publish that returned is on the new master (bench/redis_failover.py
    measures what the same kill loses without it)."""
    outcome = publish_through_failover(
        sentinels, f"prefix=t-{uuid.uuid4().hex[:12]}&wait_replicas=1", publish_for=0.5
    )
    assert len(outcome.confirmed) > 100, "too few publishes before the kill to prove anything"
    assert not outcome.lost, (
        f"{len(outcome.lost)} confirmed publish(es) lost: {sorted(outcome.lost)[:5]}"
    )
