"""A 3-node RabbitMQ cluster loses the node that leads a quorum queue in the middle of a
late-ack drain: nothing is lost, the worker reconnects to a surviving node from the URL's
``hosts`` by itself, and only messages taken before the kill run twice.

When the node dies, its connections go with it: what the worker held unacked (taken on the
dead connection, whether it had run yet or not) goes back to the queue under the new leader,
and an ack sent on that connection went nowhere, so such a message runs again.  A message
first run after the new leader took over never runs twice.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from rabbit_cluster import LocalRabbitCluster

from ackwise import Ack
from ackwise.errors import TransientAdapterError
from ackwise_conformance.brokers import missing_broker
from ackwise_conformance.checker import History
from ackwise_conformance.harness import Harness, SimpleBroker
from ackwise_conformance.helpers import eventually
from ackwise_conformance.provisioning import BrokerUnavailable

pytestmark = pytest.mark.slow

TASKS = 600
KILL_AFTER = 150


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
        keys = [f"k{i}" for i in range(TASKS)]
        for i in range(0, TASKS, 100):
            harness.publish(keys[i : i + 100], {"sleep": 0.004})
        worker = harness.worker(pool="threads", concurrency=4)
        harness.wait_for("end", count=KILL_AFTER)
        killed_at = time.time()
        victim.kill()
        eventually(
            lambda: cluster.leader_of(harness.queue) not in (None, victim),
            60,
            interval=0.2,
            description="a surviving node leads the queue",
        )
        failed_over_at = time.time()
        eventually(_answers(harness), 60, interval=0.2, description="the suite reconnects")
        harness.drain(timeout=120)
        assert worker.alive, "the worker must reconnect by itself, not exit"
        history = History.build(harness)
        history.expect_no_unexpected()
        history.expect_completed()  # nothing lost
        # A duplicate is a message the worker had taken on the dead node's connection (run
        # before or just after the kill; its ack went nowhere): its first run began before
        # the new leader was there.  None first run after that may run twice.
        late = [
            f
            for f in history.fates.values()
            if len(f.starts) > 1 and min(s["t"] for s in f.starts) > failed_over_at
        ]
        if late:
            history.fail("a message first run after the failover ran more than once", *late)
        history.expect_broker_settled(dead=0)
        print(
            f"leader killed, new leader after {failed_over_at - killed_at:.1f} s: "
            f"{history.summary()}"
        )
    finally:
        # Back in the cluster before the queues are deleted: deleting a quorum queue one
        # of whose members is down waits for it (seconds per queue).
        if victim.proc is None:
            victim.start()
            eventually(victim.answers, 120, interval=0.2, description="the node is back")
        harness.close()


def _answers(harness: Harness):  # type: ignore[no-untyped-def]
    def answers() -> bool:
        try:
            harness.stats()
        except TransientAdapterError:
            return False
        return True

    return answers
