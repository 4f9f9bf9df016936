"""The delay tiers are declared when a delay first needs them (issue 21), never lost to that.

``declare`` makes two broker objects per queue (the queue and its dead-letter queue); a
delay of *d* ms adds the ``deliver`` exchange and tiers 0 to that of *d*'s highest bit (an
exchange and a queue each).  The objects are counted on the real broker: a passive declare of
every name the adapter could create, and, where the node has the management API (the suite's
private node), its listing of every queue and exchange whose name holds the queue's.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator, Sequence
from typing import Any

import pika
import pika.exceptions as px
import pytest

from ackwise import App, open_adapter
from ackwise.errors import QueueNotFound
from ackwise.spi import Delivery, Outgoing, QueueSpec
from ackwise.testing import run_worker
from ackwise_conformance.brokers import BrokerHandle
from ackwise_conformance.harness import with_options
from ackwise_conformance.helpers import eventually
from ackwise_rabbitmq import DELAY_TIERS, RabbitMQAdapter


def _queue() -> str:
    return f"lazy-{uuid.uuid4().hex[:12]}"


def _adapter(url: str) -> RabbitMQAdapter:
    adapter = open_adapter(url)
    assert isinstance(adapter, RabbitMQAdapter)
    adapter.open()
    return adapter


def _tier_objects(top: int) -> int:
    """Objects a delay entering tier ``top`` adds: ``deliver`` and tiers 0..top (2 each)."""
    return 1 + 2 * (top + 1)


def _names(adapter: RabbitMQAdapter, queue: str) -> tuple[list[str], list[str]]:
    """Every queue and exchange the adapter could create for ``queue`` (``dlx``: earlier
    versions')."""
    aux = adapter._topology.aux
    queues = [queue, aux(queue, "dead"), *(aux(queue, f"wait.{k}") for k in range(DELAY_TIERS))]
    exchanges = [aux(queue, "dlx"), aux(queue, "deliver")]
    exchanges += [aux(queue, f"delay.{k}") for k in range(DELAY_TIERS)]
    return queues, exchanges


@pytest.fixture
def raw(rabbitmq_url: str) -> Iterator[Any]:
    """A plain pika connection to the same broker, to look and to delete behind the
    adapter's back."""
    adapter = _adapter(rabbitmq_url)
    params = adapter.settings.connection_parameters()
    adapter.close()
    for each in params:
        each.heartbeat = 0  # left idle while a test waits: no heartbeats to miss
    conn = pika.BlockingConnection(params)
    yield conn
    conn.close()


def _existing(raw: Any, adapter: RabbitMQAdapter, queue: str) -> set[str]:
    """The names of ``queue``'s objects that exist on the broker (passive declares; cross-
    checked with the management API's listing where there is one)."""
    queues, exchanges = _names(adapter, queue)
    found: set[str] = set()
    ch = raw.channel()
    for name in queues + exchanges:
        try:
            if name in queues:
                ch.queue_declare(name, passive=True)
            else:
                ch.exchange_declare(name, passive=True)
            found.add(name)
        except px.ChannelClosedByBroker as exc:
            assert exc.reply_code == 404, exc
            ch = raw.channel()
    if ch.is_open:
        ch.close()
    if adapter.settings.management:
        listed = set()
        for kind in ("queues", "exchanges"):
            items = adapter._browser.management(f"/api/{kind}/%2F?columns=name")
            assert items is not None, "the management API did not answer"
            listed |= {i["name"] for i in items if queue in i["name"]}
        assert listed == found, f"the broker lists {sorted(listed ^ found)} differently"
    return found


def _delete_tiers(raw: Any, adapter: RabbitMQAdapter, queue: str, *, only: str = "") -> None:
    """Delete ``queue``'s delay tiers (or the one object ``only``) as an operator would."""
    queues, exchanges = _names(adapter, queue)
    ch = raw.channel()
    for name in queues[2:]:
        if not only or name == only:
            ch.queue_delete(name)
    for name in exchanges[1:]:
        if not only or name == only:
            ch.exchange_delete(name)
    ch.close()


def _take(url: str, queue: str, count: int, timeout: float = 15.0) -> list[Delivery]:
    """Receive and ack, with an adapter of its own, until ``count`` messages came (or
    ``timeout``), then check that no more come."""
    got: list[Delivery] = []
    consumer = _adapter(url)
    try:
        deadline = time.monotonic() + timeout
        while len(got) < count and time.monotonic() < deadline:
            batch = consumer.receive(queue, max_messages=count, wait=0.5, lease=10.0)
            got.extend(batch)
            if batch:
                consumer.ack(batch)
        assert not consumer.receive(queue, max_messages=1, wait=0.5, lease=10.0), "one twice"
    finally:
        consumer.close()
    return got


def _delete(url: str, queue: str) -> None:
    """Delete ``queue`` and its objects with an adapter that does not consume from it (the
    broker cancels a consumer of a deleted queue)."""
    cleanup = _adapter(url)
    try:
        cleanup.delete_queue(queue)
    finally:
        cleanup.close()


def _ids(deliveries: Sequence[Delivery]) -> list[str]:
    return [d.message_id for d in deliveries]


def test_declare_makes_two_objects_and_stats_purge_and_dead_letters_work_without_tiers(
    rabbitmq_url: str, raw: Any
) -> None:
    adapter = _adapter(rabbitmq_url)
    queue = _queue()
    dead = adapter._topology.aux(queue, "dead")
    try:
        adapter.declare(QueueSpec(queue))
        assert _existing(raw, adapter, queue) == {queue, dead}
        stats = adapter.stats(queue)
        assert (stats.ready, stats.delayed, stats.dead) == (0, 0, 0)
        assert adapter.dead_letters(queue) == []
        assert adapter.purge(queue) == 0
        # Neither an immediate publish, nor a dead letter, nor a nack without a delay needs
        # a tier.
        adapter.publish(queue, [Outgoing("now", b"x"), Outgoing("again", b"y")])
        adapter.publish_dead(queue, [Outgoing("dead", b"z")], reason="test")
        consumer = _adapter(rabbitmq_url)
        try:
            first, second = consumer.receive(queue, max_messages=2, wait=10.0, lease=10.0)
            consumer.nack(first)
            consumer.dead_letter(second, reason="test")
        finally:
            consumer.close()
        # the nack's requeue lands after the consumer closed: wait for the figures themselves
        # (any QueueStats is truthy, so waiting for stats alone did not wait at all)
        figures = lambda: (lambda st: (st.ready, st.delayed, st.dead))(adapter.stats(queue))  # noqa: E731
        eventually(lambda: figures() == (1, 0, 2), 5.0)
        assert sorted(d.message_id for d in adapter.dead_letters(queue)) == ["again", "dead"]
        assert adapter.purge(queue) == 1
        assert _existing(raw, adapter, queue) == {queue, dead}
    finally:
        adapter.close()
        _delete(rabbitmq_url, queue)
    assert _existing(raw, adapter, queue) == set()


def test_a_delay_declares_the_tiers_it_needs_and_stats_purge_delete_see_them(
    rabbitmq_url: str, raw: Any
) -> None:
    adapter = _adapter(rabbitmq_url)
    queue = _queue()
    try:
        adapter.declare(QueueSpec(queue))
        assert len(_existing(raw, adapter, queue)) == 2
        adapter.publish(queue, [Outgoing("soon", b"x", delay=0.3)])  # 300 ms: tier 8
        assert len(_existing(raw, adapter, queue)) == 2 + _tier_objects(8)
        assert adapter.stats(queue).delayed in (0, 1)  # it may have gone on already
        assert _ids(_take(rabbitmq_url, queue, 1)) == ["soon"]
        # A longer delay extends the tiers; shorter ones need none more.
        adapter.publish(queue, [Outgoing("later", b"x", delay=60.0)])  # 60,000 ms: tier 15
        adapter.publish(queue, [Outgoing("sooner", b"x", delay=50.0), Outgoing("now", b"x")])
        assert len(_existing(raw, adapter, queue)) == 2 + _tier_objects(15)
        stats = adapter.stats(queue)
        assert (stats.ready, stats.delayed) == (1, 2)
        assert adapter.purge(queue) == 3
        stats = adapter.stats(queue)
        assert (stats.ready, stats.delayed) == (0, 0)
        # The tiers stay (a publisher elsewhere may count on them) and still work.
        assert len(_existing(raw, adapter, queue)) == 2 + _tier_objects(15)
        adapter.publish(queue, [Outgoing("after-purge", b"x", delay=0.2)])
        assert _ids(_take(rabbitmq_url, queue, 1)) == ["after-purge"]
    finally:
        adapter.close()
        _delete(rabbitmq_url, queue)
    assert _existing(raw, adapter, queue) == set()


def test_a_delay_published_by_another_process_declares_its_tiers_there(
    rabbitmq_url: str, raw: Any
) -> None:
    adapter = _adapter(rabbitmq_url)
    queue = _queue()
    script = (
        "import sys\n"
        "from ackwise import open_adapter\n"
        "from ackwise.spi import Outgoing\n"
        "a = open_adapter(sys.argv[1]); a.open()\n"
        "a.publish(sys.argv[2], [Outgoing('elsewhere', b'x', delay=0.5)])\n"
        "a.close()\n"
    )
    try:
        adapter.declare(QueueSpec(queue))
        subprocess.run(
            [sys.executable, "-c", script, rabbitmq_url, queue],
            check=True,
            timeout=60,
            env=dict(os.environ),
        )
        assert len(_existing(raw, adapter, queue)) == 2 + _tier_objects(8)  # 500 ms: tier 8
        assert _ids(_take(rabbitmq_url, queue, 1)) == ["elsewhere"]
        # This adapter declared no tier yet: it declares (again) what its delay needs.
        adapter.publish(queue, [Outgoing("here", b"x", delay=0.1)])
        assert _ids(_take(rabbitmq_url, queue, 1)) == ["here"]
    finally:
        adapter.close()
        _delete(rabbitmq_url, queue)


def test_tiers_deleted_behind_the_adapters_back_cost_no_message(
    rabbitmq_url: str, raw: Any
) -> None:
    """The adapter remembers the tiers it declared; publishes into tiers deleted since are
    refused by RabbitMQ (a closed channel, a returned message), declared again and sent again:
    each message arrives exactly once."""
    adapter = _adapter(rabbitmq_url)
    queue = _queue()
    try:
        adapter.declare(QueueSpec(queue))
        adapter.publish(queue, [Outgoing("first", b"x", delay=1.0)])  # tiers 0..9
        assert _ids(_take(rabbitmq_url, queue, 1)) == ["first"]

        # Every tier gone: the exchange the publish needs does not exist (channel closed).
        _delete_tiers(raw, adapter, queue)
        assert len(_existing(raw, adapter, queue)) == 2
        adapter.publish(queue, [Outgoing("one", b"x", delay=0.3)])
        assert _ids(_take(rabbitmq_url, queue, 1)) == ["one"]

        # A batch: immediate messages keep their order, each message comes once.
        _delete_tiers(raw, adapter, queue)
        batch = [
            Outgoing("i1", b"x"),
            Outgoing("d1", b"x", delay=0.2),
            Outgoing("i2", b"x"),
            Outgoing("d2", b"x", delay=1.0),
            Outgoing("i3", b"x"),
        ]
        adapter.publish(queue, batch)
        got = _ids(_take(rabbitmq_url, queue, 5))
        assert sorted(got) == ["d1", "d2", "i1", "i2", "i3"]
        assert [i for i in got if i.startswith("i")] == ["i1", "i2", "i3"]

        # Only the tier's queue gone: its exchange returns the message (no queue took it).
        _delete_tiers(raw, adapter, queue, only=adapter._topology.aux(queue, "wait.8"))
        adapter.publish(queue, [Outgoing("returned", b"x", delay=0.3)])
        assert _ids(_take(rabbitmq_url, queue, 1)) == ["returned"]

        # The queue deleted elsewhere: refused, nothing declared for it.
        other = _adapter(rabbitmq_url)
        try:
            other.delete_queue(queue)
            with pytest.raises(QueueNotFound, match="does not exist"):
                adapter.publish(queue, [Outgoing("nowhere", b"x", delay=0.3)])
            assert _existing(raw, adapter, queue) == set()
            # Declared again elsewhere: this adapter's memory of the tiers is stale.
            other.declare(QueueSpec(queue))
            adapter.publish(queue, [Outgoing("redeclared", b"x", delay=0.3)])
            assert _ids(_take(rabbitmq_url, queue, 1)) == ["redeclared"]
        finally:
            other.close()
    finally:
        adapter.close()
        _delete(rabbitmq_url, queue)


def test_worker_retry_backoffs_declare_their_tiers_and_survive_their_deletion(
    rabbitmq_url: str, raw: Any, caplog: pytest.LogCaptureFixture
) -> None:
    queue = _queue()
    app = App("lazy", broker=rabbitmq_url, default_queue=queue)
    runs: dict[str, list[float]] = {}
    backoff = 0.3

    @app.task(name="lazy.flaky", max_retries=2, retry_backoff=backoff, retry_jitter=False)
    def flaky(tag: str) -> None:
        runs.setdefault(tag, []).append(time.monotonic())
        if len(runs[tag]) == 1:
            raise TimeoutError("once")  # a transient error: retried after the backoff

    observer = _adapter(rabbitmq_url)
    try:
        with run_worker(app, queues=[queue]):
            eventually(lambda: queue in _existing(raw, observer, queue), 10.0)
            assert len(_existing(raw, observer, queue)) == 2
            flaky.delay("a")
            eventually(lambda: len(runs.get("a", ())) == 2, 15.0, description="a retried")
            assert len(_existing(raw, observer, queue)) == 2 + _tier_objects(8)  # 300 ms
            # The worker's adapter remembers those tiers; deleted since, its retry still
            # goes through them (not a redelivery after a broken channel: that comes at once).
            _delete_tiers(raw, observer, queue)
            flaky.delay("b")
            eventually(lambda: len(runs.get("b", ())) == 2, 15.0, description="b retried")
            time.sleep(0.5)
        assert {tag: len(times) for tag, times in runs.items()} == {"a": 2, "b": 2}
        for tag, (first, second) in runs.items():
            assert second - first >= backoff - 0.01, f"{tag} ran again before its backoff"
        assert not [r for r in caplog.records if "broker error" in r.getMessage()]
        assert observer.stats(queue).dead == 0
    finally:
        observer.close()
        _delete(rabbitmq_url, queue)


def test_tiers_and_delayed_messages_survive_a_broker_restart(
    rabbitmq_broker: BrokerHandle,
) -> None:
    if not rabbitmq_broker.restartable:
        pytest.skip(f"n/a: {rabbitmq_broker.not_restartable_reason}")
    url = with_options(rabbitmq_broker.url, heartbeat=2)
    adapter = _adapter(url)
    queue = _queue()
    try:
        adapter.declare(QueueSpec(queue))
        adapter.publish(queue, [Outgoing("across", b"x", delay=4.0)])  # tiers 0..11
        rabbitmq_broker.restart()
        eventually(lambda: not adapter._io.alive, 10.0, description="the old connection gone")
        # The adapter reconnects; it still counts on its tiers, which are durable.
        adapter.publish(queue, [Outgoing("remembered", b"x", delay=0.5)])
        fresh = _adapter(url)
        try:
            fresh.publish(queue, [Outgoing("fresh", b"x", delay=0.5)])
        finally:
            fresh.close()
        got = _take(url, queue, 3, timeout=30.0)
        assert sorted(_ids(got)) == ["across", "fresh", "remembered"]
    finally:
        adapter.close()
        _delete(url, queue)


@pytest.mark.parametrize("earlier", [False, True], ids=["new", "declared-by-earlier-ackwise"])
def test_the_broker_dead_letters_past_the_delivery_limit_into_the_dead_letter_queue(
    rabbitmq_url: str, raw: Any, earlier: bool
) -> None:
    """A queue dead-letters through the default exchange; one declared by an earlier ackwise
    (through its own fanout exchange ``p.q.dlx``) keeps working: the exchange is bound again."""
    adapter = _adapter(rabbitmq_url)
    queue = _queue()
    dlx, dead = adapter._topology.aux(queue, "dlx"), adapter._topology.aux(queue, "dead")
    try:
        if earlier:
            ch = raw.channel()
            ch.exchange_declare(dlx, "fanout", durable=True)
            args = {
                "x-queue-type": "quorum",
                "x-delivery-limit": 2,
                "x-dead-letter-exchange": dlx,
                "x-dead-letter-strategy": "at-least-once",
                "x-overflow": "reject-publish",
            }
            ch.queue_declare(queue, durable=True, arguments=args)
            ch.close()
        adapter.declare(QueueSpec(queue, max_deliveries=2))
        assert _existing(raw, adapter, queue) == ({queue, dead, dlx} if earlier else {queue, dead})
        adapter.publish(queue, [Outgoing("poison", b"x")])
        consumer = _adapter(rabbitmq_url)
        try:
            deadline = time.monotonic() + 20.0
            while adapter.stats(queue).dead == 0 and time.monotonic() < deadline:
                for d in consumer.receive(queue, max_messages=1, wait=0.5, lease=10.0):
                    consumer.nack(d)  # requeued; the broker counts the delivery
        finally:
            consumer.close()
        assert [d.message_id for d in adapter.dead_letters(queue)] == ["poison"]
        assert adapter.stats(queue).ready == 0
    finally:
        adapter.close()
        _delete(rabbitmq_url, queue)
    assert _existing(raw, adapter, queue) == set()


def test_priorities_accept_a_queue_declared_by_an_earlier_ackwise(
    rabbitmq_url: str, raw: Any
) -> None:
    sep = "&" if "?" in rabbitmq_url else "?"
    adapter = _adapter(rabbitmq_url + sep + "queue_type=classic&priorities=true")
    queue = _queue()
    dlx = adapter._topology.aux(queue, "dlx")
    try:
        ch = raw.channel()
        ch.exchange_declare(dlx, "fanout", durable=True)
        args = {"x-queue-type": "classic", "x-dead-letter-exchange": dlx, "x-max-priority": 9}
        ch.queue_declare(queue, durable=True, arguments=args)
        ch.close()
        adapter.declare(QueueSpec(queue))  # no refusal: it has the priority arguments
        adapter.publish(
            queue, [Outgoing("low", b"x", priority=1), Outgoing("high", b"x", priority=9)]
        )
        assert _ids(_take(rabbitmq_url, queue, 2)) == ["high", "low"]
    finally:
        adapter.close()
        _delete(rabbitmq_url, queue)
