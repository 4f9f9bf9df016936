"""Redis Cluster and Sentinel: the SPI conformance (level 1) on each, and what only they do.

The deployments are the tests' own (``redis_topologies``): a 3-primary cluster with a replica
each, and a master with a replica watched by 3 sentinels, all on free ports.
"""

from __future__ import annotations

import socket
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from redis.crc import key_slot
from redis_topologies import LocalCluster, LocalSentinels, Node

from ackwise import Adapter, BrokerURL, open_adapter
from ackwise.errors import BrokerUnavailable, InvalidBrokerURL, TransientAdapterError
from ackwise.spi import Outgoing, QueueSpec
from ackwise_conformance import AdapterConformance
from ackwise_conformance.brokers import free_port
from ackwise_redis import parse_redis_url
from ackwise_redis._keys import _keys


def _prefix() -> str:
    return f"t-{uuid.uuid4().hex[:12]}"


class TestRedisClusterConformance(AdapterConformance):
    @pytest.fixture
    def adapter_factory(self, redis_cluster: LocalCluster) -> Callable[[], Adapter]:
        url = redis_cluster.url(f"prefix={_prefix()}")
        return lambda: open_adapter(url)


class TestRedisSentinelConformance(AdapterConformance):
    @pytest.fixture
    def adapter_factory(self, redis_sentinels: LocalSentinels) -> Callable[[], Adapter]:
        url = redis_sentinels.url(f"prefix={_prefix()}")
        return lambda: open_adapter(url)


def _message(i: int) -> Outgoing:
    return Outgoing(id=f"m{i}", body=b"body-%d" % i)


@pytest.fixture
def cluster_adapter(redis_cluster: LocalCluster) -> Iterator[Adapter]:
    adapter = open_adapter(redis_cluster.url(f"prefix={_prefix()}"))
    adapter.open()
    yield adapter
    for name in adapter.queues():
        adapter.delete_queue(name)
    adapter.close()


def test_queues_spread_over_the_primaries_and_each_works(
    redis_cluster: LocalCluster, cluster_adapter: Adapter
) -> None:
    names = [f"q{i}" for i in range(12)]
    owners = set()
    for name in names:
        cluster_adapter.declare(QueueSpec(name))
        cluster_adapter.publish(name, [_message(1), _message(2)])
        owners.add(redis_cluster.primary_of(cluster_adapter.keys(name).ready).port)  # type: ignore[attr-defined]
    assert len(owners) > 1, "12 queues all hashed to one primary: the test proves nothing"
    for name in names:
        got = cluster_adapter.receive(name, max_messages=10, wait=1.0, lease=30)
        assert [d.message_id for d in got] == ["m1", "m2"]
        cluster_adapter.ack(got)
        assert cluster_adapter.stats(name).ready == 0
    assert sorted(cluster_adapter.queues()) == sorted(names)


def test_a_moved_slot_is_followed_without_losing_a_message(
    redis_cluster: LocalCluster, cluster_adapter: Adapter
) -> None:
    """MOVED: the slot of a queue migrates (with its keys) while the adapter holds the old
    slot map; publish, receive and ack go to the new primary, nothing is lost or doubled."""
    cluster_adapter.declare(QueueSpec("moving"))
    ready = cluster_adapter.keys("moving").ready  # type: ignore[attr-defined]
    cluster_adapter.publish("moving", [_message(i) for i in range(5)])
    held = cluster_adapter.receive("moving", max_messages=2, wait=1.0, lease=30)
    source = redis_cluster.primary_of(ready)
    target = next(n for n in redis_cluster.live() if n is not source and _is_primary(n))
    redis_cluster.move_slot(ready, target)
    assert redis_cluster.primary_of(ready) is target
    cluster_adapter.ack(held)  # the old map says source: MOVED to target
    cluster_adapter.publish("moving", [_message(5)])
    rest = cluster_adapter.receive("moving", max_messages=10, wait=1.0, lease=30)
    assert [d.message_id for d in rest] == ["m2", "m3", "m4", "m5"]
    cluster_adapter.ack(rest)
    stats = cluster_adapter.stats("moving")
    assert (stats.ready, stats.in_flight) == (0, 0)


def _is_primary(node: Node) -> bool:
    with node.client() as c:
        return bool(c.execute_command("ROLE")[0] == b"master")


def test_every_key_of_a_queue_is_in_one_slot() -> None:
    """The scripts take all of a queue's keys at once: a cluster runs them only in one slot."""
    k = _keys("ackwise", "some:queue.name")
    assert len({key_slot(key) for key, _ in k.typed}) == 1


@pytest.mark.parametrize(
    ("url", "says"),
    [
        ("redis+cluster://h:7000/3", "database 0 only"),
        ("redis+cluster://h:7000?nodes=h2", None),
        ("redis+cluster://h:7000?nodes=h2:x", "is not host:port"),
        ("redis+sentinel://h:26379", "no master name"),
        ("redis+sentinel://h:26379/my master", "no master name"),
        ("redis+sentinel://h:26379/mymaster/x", "database 'x'"),
        ("redis://h:6379?nodes=h2:1", r"a redis\+cluster:// URL"),
        ("redis://h:6379?wait_replicas=-1", "wait_replicas"),
    ],
)
def test_cluster_and_sentinel_urls_are_checked(url: str, says: str | None) -> None:
    if says is None:
        settings = parse_redis_url(BrokerURL.parse(url))
        assert settings.nodes == (("h", 7000), ("h2", 6379))
        return
    with pytest.raises(InvalidBrokerURL, match=says):
        parse_redis_url(BrokerURL.parse(url))


def test_sentinel_url_names_service_db_and_sentinels() -> None:
    s = parse_redis_url(
        BrokerURL.parse("rediss+sentinel://:pw@a:1/cache/2?sentinels=b,c:3&sentinel_password=x")
    )
    assert (s.scheme, s.topology, s.service, s.db) == ("rediss", "sentinel", "cache", 2)
    assert s.nodes == (("a", 1), ("b", 26379), ("c", 3))
    assert (s.password, s.sentinel_password) == ("pw", "x")
    assert "pw" not in s.where and "x" not in s.where.split("/")[-1]


def test_no_sentinel_answers_is_a_transient_error_naming_them() -> None:
    port = free_port()
    adapter = open_adapter(f"redis+sentinel://127.0.0.1:{port}/nobody/0")
    with pytest.raises(BrokerUnavailable, match=f"127.0.0.1:{port}"):
        adapter.open()


def test_sentinel_adapter_uses_the_master_the_sentinels_name(
    redis_sentinels: LocalSentinels,
) -> None:
    adapter = open_adapter(redis_sentinels.url(f"prefix={_prefix()}"))
    adapter.open()
    try:
        adapter.declare(QueueSpec("q"))
        adapter.publish("q", [_message(1)])
        with redis_sentinels.master().client() as c:
            assert c.exists(adapter.keys("q").data)  # type: ignore[attr-defined]
        adapter.delete_queue("q")
    finally:
        adapter.close()


def test_wait_replicas_publishes_and_says_when_too_few_replicas_have_it(
    redis_sentinels: LocalSentinels,
) -> None:
    prefix = _prefix()
    enough = open_adapter(redis_sentinels.url(f"prefix={prefix}&wait_replicas=1"))
    too_many = open_adapter(
        redis_sentinels.url(f"prefix={prefix}&wait_replicas=2&wait_timeout=0.2")
    )
    try:
        enough.declare(QueueSpec("q"))
        enough.publish("q", [_message(1)])
        with pytest.raises(TransientAdapterError, match="only 1 of the 2 replicas"):
            too_many.publish("q", [_message(2)])
        # Published on the primary all the same: the error says so, and it is there.
        assert enough.stats("q").ready == 2
        enough.delete_queue("q")
    finally:
        enough.close()
        too_many.close()


def test_cluster_without_any_reachable_node_names_what_it_tried() -> None:
    ports = [free_port(), free_port()]
    url = f"redis+cluster://127.0.0.1:{ports[0]}?nodes=127.0.0.1:{ports[1]}"
    adapter = open_adapter(url)
    with pytest.raises(BrokerUnavailable) as info:
        adapter.open()
    assert all(str(p) in str(info.value) for p in ports)


def test_a_node_whose_port_was_taken_meanwhile_starts_again_on_other_ports(
    tmp_path: Path,
) -> None:
    """The tests' deployments pick free ports, then start redis-server on them: another
    process may bind one in between (a cluster bus port did, on a CI run).  That node is
    started again on new ports instead of failing the deployment."""

    from redis_topologies import _launch, _server

    taken = socket.socket()
    taken.bind(("127.0.0.1", free_port()))
    taken.listen()
    built: list[Node] = []

    def build() -> Node:
        if not built:  # the first try's bus port is held by the test's socket
            node = _server(tmp_path / "n", "--cluster-enabled", "yes", "--cluster-port",
                           str(taken.getsockname()[1]))  # fmt: skip
        else:
            node = _server(tmp_path / "n")
        built.append(node)
        return node

    try:
        node = _launch(build)
        try:
            assert len(built) == 2 and node is built[1]
            assert node.answers()
            assert built[0].exited()
        finally:
            node.stop()
    finally:
        taken.close()
