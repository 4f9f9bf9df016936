"""A settlement whose lease ran out before it could go is stale, whatever the caller checked.

JetStream applies an ack to whatever delivery of the message is pending, an older one's too.
So an ack that leaves after its lease ended, and after the message went to another consumer,
would remove that consumer's delivery.  Here the adapter's event loop is held up (as a paused
or overloaded process holds it) between the caller's call and the request: the lease runs out,
another consumer gets the message, then the loop goes on.  The ack must be refused as stale and
the newer delivery must stay (conformance C07-LATE failed so on a loaded host).
"""

from __future__ import annotations

import threading
import uuid
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from ackwise import open_adapter
from ackwise.errors import StaleReceipt
from ackwise.spi import Delivery, Outgoing, QueueSpec
from ackwise_conformance.helpers import eventually

LEASE = 1.0


@pytest.fixture
def two(nats_url: str) -> Iterator[tuple[Any, Any, str]]:
    queue = f"stale-{uuid.uuid4().hex[:8]}"
    a, b = open_adapter(nats_url), open_adapter(nats_url)
    a.open()
    b.open()
    a.declare(QueueSpec(queue))
    yield a, b, queue
    a.close()
    b.close()


def _held_loop(adapter: Any) -> threading.Event:
    """Hold ``adapter``'s event loop until the returned event is set."""
    release = threading.Event()
    adapter._connection.connected().loop.call_soon_threadsafe(release.wait, 30.0)
    return release


def _in_thread(fn: Callable[[], None]) -> tuple[threading.Thread, list[BaseException]]:
    errors: list[BaseException] = []

    def run() -> None:
        try:
            fn()
        except BaseException as exc:
            errors.append(exc)

    t = threading.Thread(target=run)
    t.start()
    return t, errors


@pytest.mark.parametrize("operation", ["ack", "extend", "nack", "dead_letter"])
def test_a_settlement_sent_after_its_lease_ran_out_is_stale_and_the_new_delivery_stays(
    two: tuple[Any, Any, str], operation: str
) -> None:
    a, b, queue = two
    a.publish(queue, [Outgoing(uuid.uuid4().hex, b"late", 0.0, 0)])
    [d] = a.receive(queue, max_messages=1, wait=5.0, lease=LEASE)
    calls: dict[str, Callable[[Delivery], None]] = {
        "ack": lambda d: a.ack([d]),
        "extend": lambda d: a.extend([d], lease=LEASE),
        "nack": lambda d: a.nack(d),
        "dead_letter": lambda d: a.dead_letter(d, reason="failed"),
    }
    release = _held_loop(a)
    # The caller's own check passes now (most of the lease is left); the request waits.
    t, errors = _in_thread(lambda: calls[operation](d))
    got: list[Delivery] = []
    eventually(
        lambda: got.extend(b.receive(queue, max_messages=1, wait=0.5, lease=30.0)) or got,
        15.0,
        description="the message delivered to the other consumer after the lease",
    )
    release.set()
    t.join(30.0)
    assert len(errors) == 1 and isinstance(errors[0], StaleReceipt), errors
    stats = b.stats(queue)
    assert (stats.ready, stats.in_flight, stats.dead) == (0, 1, 0), stats
    b.ack(got)  # the newer delivery is still the other consumer's to settle
    assert b.stats(queue).in_flight == 0
