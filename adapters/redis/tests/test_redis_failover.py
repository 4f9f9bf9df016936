"""Failover: the primary that holds a queue is SIGKILLed mid-drain (late ack), a replica takes
over, and the ``ackwise worker`` finds the new primary by itself; nothing is lost.

Redis replicates asynchronously: what the dead primary had not yet sent its replica is gone.
For a publish, ``wait_replicas=1`` closes that hole (the publish returns once a replica has
the message).  For a receive or an ack it cannot: the new primary may not know that a message
was taken or acked, and delivers it again, so a message may run twice: only one taken before
the takeover (``ackwise_conformance.failover`` checks it).
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from redis_topologies import (
    LocalCluster,
    LocalSentinels,
    TopologyUnavailable,
    publish_through_failover,
)

from ackwise import Ack
from ackwise_conformance.brokers import missing_broker
from ackwise_conformance.failover import kill_mid_drain
from ackwise_conformance.harness import Harness, SimpleBroker

# Not a "crash" file (conftest.py): its takeover waits tolerate a loaded host, so it runs on
# the other pytest process, beside the unit tests, not in line with the crash suites.
pytestmark = pytest.mark.slow


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


def test_cluster_primary_killed_mid_drain(cluster: LocalCluster, tmp_path: Path) -> None:
    url = cluster.url(f"prefix=t-{uuid.uuid4().hex[:12]}&wait_replicas=1")
    harness = Harness(SimpleBroker(url, name="redis-cluster"), Ack.LATE, tmp_path / "case")
    try:
        ready = harness.adapter.keys(harness.queue).ready  # type: ignore[attr-defined]
        victim = cluster.primary_of(ready)

        def failed_over() -> bool:
            return cluster.healthy() and cluster.primary_of(ready) is not victim

        outcome = kill_mid_drain(harness, victim.kill, failed_over)
        print(f"failover in {outcome.takeover:.1f} s: {outcome.summary}")
    finally:
        harness.close()


def test_sentinel_master_killed_mid_drain(sentinels: LocalSentinels, tmp_path: Path) -> None:
    url = sentinels.url(f"prefix=t-{uuid.uuid4().hex[:12]}&wait_replicas=1")
    harness = Harness(SimpleBroker(url, name="redis-sentinel"), Ack.LATE, tmp_path / "case")
    try:
        victim = sentinels.master()
        outcome = kill_mid_drain(harness, victim.kill, lambda: sentinels.master() is not victim)
        print(f"failover in {outcome.takeover:.1f} s: {outcome.summary}")
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
