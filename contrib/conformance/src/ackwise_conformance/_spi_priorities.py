"""SPI conformance tests (level 1): message priorities, or their refusal.

Where the adapter's capabilities say ``priorities``, a queue's ready messages are received
highest priority first (first in, first out within one priority), and a message keeps its
priority when it is nacked, comes due after a delay, or is replayed from the dead letters.
Elsewhere, a priority above 0 is refused with :class:`~ackwise.errors.UnsupportedCapability`.

A consumer may hold messages the broker pushed to it before a more urgent one arrived (AMQP's
window): the checks read with a consumer that holds nothing yet, and ``stop_receiving`` gives
back what one holds, as a worker does when it stops.
"""

from __future__ import annotations

import time
from collections.abc import Callable

import pytest

from ackwise import Adapter
from ackwise.errors import UnsupportedCapability
from ackwise.spi import Outgoing
from ackwise_conformance._spi_base import SPIBase, ids_of

__all__ = ["PriorityChecks"]


class PriorityChecks(SPIBase):
    """Tests: priorities order what is ready, and survive every way back to ready."""

    def require_priorities(self, adapter: Adapter) -> None:
        if not adapter.capabilities.priorities:
            pytest.skip(
                "n/a: the adapter declares priorities=False (the gate is checked by "
                "test_priority_is_refused_without_priorities)"
            )

    def first_of(self, connect: Callable[[], Adapter], queue: str, n: int) -> list[str]:
        """The ids of the first ``n`` messages a new consumer receives, one call each."""
        reader = connect()
        return ids_of([self.take(reader, queue, max_messages=1)[0] for _ in range(n)])

    def test_priority_is_refused_without_priorities(self, adapter: Adapter, queue: str) -> None:
        if adapter.capabilities.priorities:
            pytest.skip("n/a: the adapter declares priorities=True, so there is no gate to check")
        with pytest.raises(UnsupportedCapability):
            adapter.publish(queue, [Outgoing("m", b"x", priority=5)])
        self.assert_stats(adapter, queue, "a refused publish stores nothing", ready=0)
        adapter.publish(queue, [Outgoing("m", b"x", priority=0)])  # 0 is no priority
        self.take(adapter, queue)

    def test_higher_priority_is_received_first(
        self, adapter: Adapter, connect: Callable[[], Adapter], queue: str
    ) -> None:
        self.require_priorities(adapter)
        adapter.publish(
            queue,
            [
                Outgoing("low-1", b"x"),
                Outgoing("mid-1", b"x", priority=5),
                Outgoing("top", b"x", priority=9),
                Outgoing("mid-2", b"x", priority=5),
                Outgoing("low-2", b"x"),
            ],
        )
        self.assert_stats(adapter, queue, "every priority counts as ready", ready=5)
        assert self.first_of(connect, queue, 5) == ["top", "mid-1", "mid-2", "low-1", "low-2"]

    def test_one_receive_hands_out_the_highest_priorities(
        self, adapter: Adapter, connect: Callable[[], Adapter], queue: str
    ) -> None:
        self.require_priorities(adapter)
        adapter.publish(queue, [Outgoing(f"low-{i}", b"x") for i in range(5)])
        adapter.publish(queue, [Outgoing("urgent", b"x", priority=3)])
        reader = connect()
        got = self.take(reader, queue, 2, max_messages=2)
        assert ids_of(got) == ["urgent", "low-0"]

    def test_a_nacked_message_keeps_its_priority(
        self, adapter: Adapter, connect: Callable[[], Adapter], queue: str
    ) -> None:
        self.require_priorities(adapter)
        adapter.publish(queue, [Outgoing("urgent", b"x", priority=6)])
        (d,) = self.take(adapter, queue)
        connect().publish(queue, [Outgoing("low-1", b"x"), Outgoing("low-2", b"x")])
        adapter.nack(d)
        adapter.stop_receiving()
        assert self.first_of(connect, queue, 3) == ["urgent", "low-1", "low-2"]

    def test_a_message_nacked_with_a_delay_keeps_its_priority(
        self, adapter: Adapter, connect: Callable[[], Adapter], queue: str
    ) -> None:
        self.require_priorities(adapter)
        self.require_native_delay(adapter)
        adapter.publish(queue, [Outgoing("urgent", b"x", priority=6)])
        (d,) = self.take(adapter, queue)
        delay = 0.5 * self.scale
        adapter.nack(d, delay=delay)
        adapter.stop_receiving()
        connect().publish(queue, [Outgoing("low-1", b"x"), Outgoing("low-2", b"x")])
        time.sleep(delay + 0.5 * self.scale)
        assert self.first_of(connect, queue, 3) == ["urgent", "low-1", "low-2"]

    def test_a_delayed_message_comes_due_with_its_priority(
        self, adapter: Adapter, connect: Callable[[], Adapter], queue: str
    ) -> None:
        self.require_priorities(adapter)
        self.require_native_delay(adapter)
        delay = 0.5 * self.scale
        adapter.publish(queue, [Outgoing("urgent", b"x", delay=delay, priority=4)])
        adapter.publish(queue, [Outgoing("low-1", b"x"), Outgoing("low-2", b"x")])
        time.sleep(delay + 0.5 * self.scale)
        assert self.first_of(connect, queue, 3) == ["urgent", "low-1", "low-2"]

    def test_a_redelivered_message_keeps_its_priority(
        self, adapter: Adapter, connect: Callable[[], Adapter], queue: str
    ) -> None:
        self.require_priorities(adapter)
        adapter.publish(queue, [Outgoing("urgent", b"x", priority=2)])
        self.take(adapter, queue, lease=self.lease_s)
        connect().publish(queue, [Outgoing("low-1", b"x"), Outgoing("low-2", b"x")])
        self.lose_lease(adapter)
        adapter.stop_receiving()
        time.sleep(self.lease_s + 0.2 * self.scale)
        first = self.take(connect(), queue, max_messages=1)
        assert ids_of(first) == ["urgent"]
        self.assert_attempt(adapter, first[0], 2)

    def test_a_replayed_dead_letter_keeps_its_priority(
        self, adapter: Adapter, connect: Callable[[], Adapter], queue: str
    ) -> None:
        self.require_priorities(adapter)
        adapter.publish(queue, [Outgoing("urgent", b"x", priority=7)])
        (d,) = self.take(adapter, queue)
        adapter.dead_letter(d, reason="failed")
        adapter.stop_receiving()
        connect().publish(queue, [Outgoing("low-1", b"x"), Outgoing("low-2", b"x")])
        assert adapter.requeue_dead(queue, ["urgent"]) == 1
        assert self.first_of(connect, queue, 3) == ["urgent", "low-1", "low-2"]

    def test_a_dead_letter_published_with_a_priority_is_replayed_with_it(
        self, adapter: Adapter, connect: Callable[[], Adapter], queue: str
    ) -> None:
        self.require_priorities(adapter)
        adapter.publish_dead(queue, [Outgoing("urgent", b"x", priority=8)], reason="failed")
        adapter.publish(queue, [Outgoing("low-1", b"x")])
        assert adapter.requeue_dead(queue, ["urgent"]) == 1
        assert self.first_of(connect, queue, 2) == ["urgent", "low-1"]
