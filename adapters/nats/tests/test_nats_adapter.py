"""Behaviour of the NATS adapter beyond the SPI suite: where delayed, nacked and foreign
messages live in JetStream, and what the worker sees of them."""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator

import nats
import pytest

from ackwise import Adapter, open_adapter
from ackwise.errors import StaleReceipt
from ackwise.spi import Outgoing, QueueSpec
from ackwise_nats._names import QueueNames


@pytest.fixture
def adapter(nats_url: str) -> Iterator[Adapter]:
    a = open_adapter(nats_url)
    a.open()
    yield a
    a.close()


@pytest.fixture
def queue(adapter: Adapter) -> Iterator[str]:
    name = f"q-{uuid.uuid4().hex[:8]}"
    adapter.declare(QueueSpec(name))
    yield name
    adapter.delete_queue(name)


def _take(adapter: Adapter, queue: str, lease: float = 30.0, timeout: float = 10.0):  # type: ignore[no-untyped-def]
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        got = adapter.receive(queue, max_messages=1, wait=0.5, lease=lease)
        if got:
            return got[0]
    raise AssertionError(f"nothing received from {queue} within {timeout}s")


def test_nack_with_delay_is_counted_delayed_and_keeps_the_attempt(
    adapter: Adapter, queue: str
) -> None:
    adapter.publish(queue, [Outgoing("m", b"body")])
    first = _take(adapter, queue)
    adapter.nack(first, delay=1.0)
    stats = adapter.stats(queue)
    assert (stats.ready, stats.delayed, stats.in_flight) == (0, 1, 0)
    again = _take(adapter, queue)
    assert (again.message_id, again.body, again.attempt) == ("m", b"body", 2)
    adapter.nack(again)  # without delay: JetStream's own redelivery counts on
    third = _take(adapter, queue)
    assert third.attempt == 3
    adapter.ack([third])
    stats = adapter.stats(queue)
    assert (stats.ready, stats.delayed, stats.in_flight) == (0, 0, 0)


def test_a_lease_other_than_ack_wait_is_set_per_message(adapter: Adapter, queue: str) -> None:
    adapter.publish(queue, [Outgoing("short", b"x"), Outgoing("long", b"y")])
    short = _take(adapter, queue, lease=1.0)
    long = _take(adapter, queue, lease=60.0)  # longer than the AckWait (30 s)
    assert long.lease_deadline - time.time() > 55
    again = _take(adapter, queue, lease=30.0, timeout=5.0)
    assert (again.message_id, again.attempt) == ("short", 2)
    with pytest.raises(StaleReceipt):
        adapter.ack([short])
    adapter.ack([long, again])


def test_a_foreign_message_is_a_corrupt_delivery_and_dead_letters_as_stored(
    adapter: Adapter, queue: str, nats_url: str
) -> None:
    import asyncio

    prefix = nats_url.rsplit("prefix=", 1)[1]
    subject = QueueNames.of(prefix, queue).ready

    async def foreign() -> None:
        nc = await nats.connect(nats_url.split("?")[0])
        await nc.jetstream().publish(subject, b"\x00not ackwise")
        await nc.close()

    asyncio.run(foreign())
    adapter.publish(queue, [Outgoing("valid", b"ok")])
    bad = _take(adapter, queue)
    assert bad.corrupt and bad.message_id.startswith("corrupt-")
    assert bad.body == b"\x00not ackwise"
    adapter.dead_letter(bad, reason="corrupt_record")
    good = _take(adapter, queue)
    assert good.message_id == "valid" and good.corrupt is None
    adapter.ack([good])
    (dead,) = adapter.dead_letters(queue)
    assert (dead.message_id, dead.body, dead.reason) == (
        bad.message_id,
        b"\x00not ackwise",
        "corrupt_record",
    )
    assert adapter.delete_dead(queue, [bad.message_id]) == 1


def test_queues_lists_only_this_prefix(adapter: Adapter, queue: str, nats_url: str) -> None:
    assert adapter.queues() == [queue]
    other = open_adapter(nats_url.replace("prefix=", "prefix=x"))
    other.open()
    try:
        assert queue not in other.queues()
    finally:
        other.close()
