"""A 3-node RabbitMQ cluster loses the node that leads a quorum queue in the middle of a
late-ack drain: nothing is lost, the worker reconnects to a surviving node from the URL's
``hosts`` by itself, and only messages taken before the kill run twice.

When the node dies, its connections go with it: what the worker held unacked (taken on the
dead connection, whether it had run yet or not) goes back to the queue under the new leader,
and an ack sent on that connection went nowhere, so such a message runs again.  A message
first run after the new leader took over never runs twice.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from rabbit_cluster import LocalRabbitCluster

from ackwise import Ack
from ackwise_conformance.brokers import missing_broker
from ackwise_conformance.failover import kill_mid_drain
from ackwise_conformance.harness import Harness, SimpleBroker
from ackwise_conformance.helpers import eventually
from ackwise_conformance.provisioning import BrokerUnavailable

# Not a "crash" file (conftest.py): its takeover waits tolerate a loaded host, so it runs on
# the other pytest process, beside the unit tests, not in line with the crash suites.
pytestmark = pytest.mark.slow


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[LocalRabbitCluster]:
    try:
        deployment = LocalRabbitCluster(tmp_path / "cluster").start()
    except BrokerUnavailable as exc:
        missing_broker(str(exc))
    yield deployment
    deployment.stop()


def test_the_leader_node_killed_mid_drain_loses_nothing(
    cluster: LocalRabbitCluster, tmp_path: Path
) -> None:
    victim = cluster.nodes[0]
    harness = Harness(
        SimpleBroker(cluster.url(), name="rabbitmq-cluster"), Ack.LATE, tmp_path / "case"
    )
    try:
        assert cluster.leader_of(harness.queue) is victim, "led by the node it was declared on"
        members = cluster.nodes[1].api(f"/api/queues/%2F/{harness.queue}").get("members", [])
        assert len(members) == 3, f"a quorum queue on every node, got members {members}"
        outcome = kill_mid_drain(
            harness,
            victim.kill,
            lambda: cluster.leader_of(harness.queue) not in (None, victim),
        )
        print(f"leader killed, new leader after {outcome.takeover:.1f} s: {outcome.summary}")
    finally:
        # Back in the cluster before the queues are deleted: deleting a quorum queue one
        # of whose members is down waits for it (seconds per queue).
        if victim.proc is None:
            victim.start()
            eventually(victim.answers, 120, interval=0.2, description="the node is back")
        harness.close()
