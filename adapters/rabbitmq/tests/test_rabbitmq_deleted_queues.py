"""A queue deleted under the adapter (by itself or another client, while it consumes or
only publishes): the connection, the receipts it holds and its memory of what it declared."""

from __future__ import annotations

import time
import uuid

import pytest

from ackwise import open_adapter
from ackwise.errors import QueueNotFound
from ackwise.spi import Outgoing, QueueSpec
from ackwise_rabbitmq import RabbitMQAdapter


def _queue() -> str:
    return f"deleted-{uuid.uuid4().hex[:12]}"


def _adapter(url: str) -> RabbitMQAdapter:
    adapter = open_adapter(url)
    assert isinstance(adapter, RabbitMQAdapter)
    adapter.open()
    return adapter


@pytest.mark.parametrize("deleted_by", ["this adapter", "another client"])
def test_deleting_a_queue_the_adapter_consumes_keeps_its_connection(
    rabbitmq_url: str, deleted_by: str
) -> None:
    """RabbitMQ cancels the consumers of a queue it deletes: the adapter forgets them and
    keeps its connection, so what it holds of other queues stays settleable, and the queue
    declared again is consumed again."""
    adapter = _adapter(rabbitmq_url)
    other = _adapter(rabbitmq_url)
    try:
        doomed, kept = _queue(), _queue()
        for queue in (doomed, kept):
            adapter.declare(QueueSpec(queue))
            adapter.publish(queue, [Outgoing(f"{queue}-1", b"x")])
        (held,) = adapter.receive(kept, max_messages=1, wait=10.0, lease=30.0)
        (d,) = adapter.receive(doomed, max_messages=1, wait=10.0, lease=30.0)
        adapter.ack([d])
        (adapter if deleted_by == "this adapter" else other).delete_queue(doomed)
        # The cancel comes on the consuming channel, not with the delete's answer: give it
        # time to arrive (had it cost the connection, the ack below is of a lost one).
        time.sleep(0.5)
        adapter.ack([held])  # not a stale receipt: the same connection
        adapter.declare(QueueSpec(doomed))
        adapter.publish(doomed, [Outgoing("again", b"x")])
        (d,) = adapter.receive(doomed, max_messages=1, wait=10.0, lease=30.0)
        assert d.message_id == "again"
        adapter.ack([d])
        for queue in (doomed, kept):
            adapter.delete_queue(queue)
    finally:
        adapter.close()
        other.close()


def test_a_queue_deleted_by_another_client_is_declared_again_after_its_publish_failed(
    rabbitmq_url: str,
) -> None:
    """A producer's memory of what it declared does not outlive the queue: the publish that
    finds it deleted raises QueueNotFound ("declare it first"), and ``declare`` then does."""
    producer = _adapter(rabbitmq_url)
    other = _adapter(rabbitmq_url)
    try:
        queue = _queue()
        producer.declare(QueueSpec(queue))
        other.delete_queue(queue)
        with pytest.raises(QueueNotFound, match="declare it first"):
            producer.publish(queue, [Outgoing("lost?", b"x")])
        producer.declare(QueueSpec(queue))
        producer.publish(queue, [Outgoing("stored", b"x")])
        assert other.stats(queue).ready == 1
        producer.delete_queue(queue)
    finally:
        producer.close()
        other.close()
