"""SPI conformance tests (level 1): publish, receive and ack: what one delivery carries, and what an ack removes."""

from __future__ import annotations

import time
from collections.abc import Callable

import pytest

from ackwise import Adapter, Capabilities
from ackwise.errors import StaleReceipt, UnsupportedCapability
from ackwise.spi import Outgoing, QueueSpec
from ackwise_conformance._spi_base import AdapterFactory, SPIBase, ids_of

__all__ = ["DeliveryChecks"]


class DeliveryChecks(SPIBase):
    """Tests: publish, receive and ack: what one delivery carries, and what an ack removes."""

    # -- publish / receive -----------------------------------------------------------------
    def test_published_message_round_trips_with_id_body_and_first_attempt(
        self, adapter: Adapter, queue: str
    ) -> None:
        body = bytes(range(256)) + "ünïcode ✓".encode()
        adapter.publish(queue, [Outgoing("msg-1", body)])
        before = time.time()
        (d,) = self.take(adapter, queue, max_messages=1)
        after = time.time()
        assert d.queue == queue
        assert d.message_id == "msg-1"
        assert d.body == body
        self.assert_attempt(adapter, d, 1)
        tolerance = 0.5 * self.scale
        assert before - tolerance <= d.lease_deadline - self.lease_s <= after + tolerance, (
            f"lease_deadline {d.lease_deadline} is not about now + lease "
            f"({before} + {self.lease_s})"
        )
        adapter.ack([d])
        self.assert_stats(
            adapter,
            queue,
            "ack removes the message for good",
            ready=0,
            delayed=0,
            in_flight=0,
            dead=0,
        )

    def test_ready_messages_are_received_in_publication_order(
        self, adapter: Adapter, queue: str
    ) -> None:
        if not self.ordered:
            pytest.skip(f"n/a: {self.unordered_reason}")
        ids = [f"m{i}" for i in range(5)]
        for i in ids:
            adapter.publish(queue, [Outgoing(i, i.encode())])
        got = [self.take(adapter, queue, max_messages=1)[0] for _ in ids]
        assert ids_of(got) == ids

    def test_batch_publish_and_receive_respect_max_messages(
        self, adapter: Adapter, queue: str
    ) -> None:
        ids = [f"m{i}" for i in range(10)]
        adapter.publish(queue, [Outgoing(i, i.encode()) for i in ids])
        self.assert_stats(adapter, queue, "every published message is counted ready", ready=10)
        first = self.take(adapter, queue, 1, max_messages=4)
        more = self.receive(adapter, queue, max_messages=4, wait=1.0 * self.scale)
        assert len(more) <= 4, f"receive(max_messages=4) returned {len(more)} deliveries"
        rest = self.take(adapter, queue, 10 - 1 - len(more), max_messages=4)
        got = ids_of([*first, *more, *rest])
        assert sorted(got) == sorted(ids), f"each message once: got {got}"
        assert all(d.body == d.message_id.encode() for d in [*first, *more, *rest])

    def test_messages_with_the_same_id_are_distinct_deliveries(
        self, adapter: Adapter, queue: str
    ) -> None:
        # A retry republishes with the message's id: ids are not unique in a queue.
        adapter.publish(queue, [Outgoing("same", b"one"), Outgoing("same", b"two")])
        a, b = self.take(adapter, queue, 2)
        assert {a.body, b.body} == {b"one", b"two"}
        adapter.ack([a])
        self.assert_stats(
            adapter,
            queue,
            "ack of one of two messages with the same id removes only that delivery",
            ready=0,
            in_flight=1,
        )
        adapter.ack([b])
        self.assert_stats(
            adapter, queue, "ack removes the second delivery too", ready=0, in_flight=0
        )

    def test_queues_are_isolated(self, adapter: Adapter, queue: str) -> None:
        second = self.declare_queue(adapter)
        adapter.publish(queue, [Outgoing("here", b"x")])
        self.assert_nothing_receivable(
            adapter,
            second,
            0.2 * self.scale,
            "a message published to one queue is never delivered from another",
        )
        (d,) = self.take(adapter, queue)
        assert d.message_id == "here"

    def test_declare_is_idempotent(self, adapter: Adapter, queue: str) -> None:
        adapter.publish(queue, [Outgoing("kept", b"x")])
        adapter.declare(QueueSpec(queue))
        (d,) = self.take(adapter, queue)
        assert d.message_id == "kept"

    def test_declared_queue_is_listed_where_the_broker_can_list(
        self, adapter: Adapter, queue: str
    ) -> None:
        try:
            names = adapter.queues()
        except UnsupportedCapability as exc:
            pytest.skip(f"n/a: {exc}")
        assert queue in names

    def test_open_and_close_are_idempotent(self, adapter_factory: AdapterFactory) -> None:
        adapter = adapter_factory()
        adapter.open()
        adapter.open()
        adapter.close()
        adapter.close()

    def test_capabilities_are_declared_on_the_class(self, adapter: Adapter) -> None:
        caps = type(adapter).capabilities
        assert isinstance(caps, Capabilities)
        described = caps.describe()
        assert set(described) >= {"native_delay", "max_delay", "lease_extension"}

    # -- ack -------------------------------------------------------------------------------
    def test_batch_ack_removes_every_message(self, adapter: Adapter, queue: str) -> None:
        adapter.publish(queue, [Outgoing(f"m{i}", b"x") for i in range(10)])
        got = self.take(adapter, queue, 10)
        adapter.ack(got)
        self.assert_stats(
            adapter,
            queue,
            "one ack of a batch removes every message of it",
            ready=0,
            delayed=0,
            in_flight=0,
            dead=0,
        )
        self.assert_nothing_receivable(
            adapter, queue, 0.2 * self.scale, "ack removes the messages for good"
        )

    def test_ack_of_an_already_acked_receipt_is_stale_and_changes_nothing(
        self, adapter: Adapter, queue: str
    ) -> None:
        adapter.publish(queue, [Outgoing("a", b"a"), Outgoing("b", b"b")])
        got = {d.message_id: d for d in self.take(adapter, queue, 2)}
        adapter.ack([got["a"]])
        stale = self.expect_stale(
            lambda: adapter.ack([got["a"]]), "a second ack of an acked receipt"
        )
        assert stale.deliveries == (got["a"],)
        self.assert_stats(
            adapter,
            queue,
            "a second ack of an acked receipt changes nothing (the other delivery stays in flight)",
            ready=0,
            in_flight=1,
        )
        adapter.ack([got["b"]])  # the other delivery was not touched
        self.assert_stats(adapter, queue, "ack removes the other delivery", ready=0, in_flight=0)

    def test_ack_before_start_removes_the_messages_and_refuses_a_stale_receipt(
        self, adapter: Adapter, queue: str
    ) -> None:
        """``Ack.EARLY``'s ack: done for good when it returns.

        Asked again for a receipt it acked already (the worker does so when a cut connection
        swallowed the first answer), an adapter either vouches for that ack (returns) or
        cannot tell (raises :class:`StaleReceipt` for exactly that one: the task is not run);
        a receipt whose lease moved on is stale (``test_stale_receipt_is_refused…``).
        """
        adapter.publish(queue, [Outgoing(f"m{i}", b"x") for i in range(3)])
        got = self.take(adapter, queue, 3)
        adapter.ack_before_start(got[:2])
        try:
            adapter.ack_before_start(got[1:])
        except StaleReceipt as exc:
            assert exc.deliveries == (got[1],)
        self.assert_stats(
            adapter,
            queue,
            "ack_before_start removes the messages before their tasks run",
            ready=0,
            delayed=0,
            in_flight=0,
            dead=0,
        )
        self.assert_nothing_receivable(
            adapter, queue, 0.2 * self.scale, "ack_before_start removes the messages for good"
        )

    @pytest.mark.parametrize(
        "operation", ["ack", "ack_before_start", "extend", "nack", "dead_letter"]
    )
    def test_stale_receipt_is_refused_and_the_new_delivery_is_untouched(
        self, adapter: Adapter, other: Adapter, queue: str, operation: str
    ) -> None:
        old, new = self._expire_and_redeliver(adapter, other, queue)
        settle: dict[str, Callable[[], None]] = {
            "ack": lambda: adapter.ack([old]),
            "ack_before_start": lambda: adapter.ack_before_start([old]),
            "extend": lambda: adapter.extend([old], lease=self.lease_s),
            "nack": lambda: adapter.nack(old),
            "dead_letter": lambda: adapter.dead_letter(old, reason="failed"),
        }
        stale = self.expect_stale(
            settle[operation], f"{operation} with the receipt of an expired, redelivered lease"
        )
        assert stale.deliveries == (old,)
        # The new delivery still owns the message: in flight, not receivable, not dead.  Asked
        # of the consumer that holds it: a broker without global_in_flight counts only those.
        self.assert_stats(
            other,
            queue,
            "a stale settlement leaves the new delivery in flight, neither ready nor dead",
            ready=0,
            delayed=0,
            in_flight=1,
            dead=0,
        )
        assert not adapter.dead_letters(queue)
        other.ack([new])
        self.assert_stats(
            other,
            queue,
            "ack of the new delivery removes the message",
            ready=0,
            delayed=0,
            in_flight=0,
            dead=0,
        )

    def test_batch_ack_with_one_stale_receipt_settles_the_valid_ones(
        self, adapter: Adapter, other: Adapter, queue: str
    ) -> None:
        old, new = self._expire_and_redeliver(adapter, other, queue)
        adapter.publish(queue, [Outgoing("y", b"y"), Outgoing("z", b"z")])
        valid = self.take(adapter, queue, 2, lease=30 * self.lease_s)
        stale = self.expect_stale(
            lambda: adapter.ack([old, *valid]), "a batch ack with one expired, redelivered receipt"
        )
        assert stale.deliveries == (old,), "exactly the stale delivery is reported"
        self.assert_stats(
            other,
            queue,
            "a batch ack with a stale receipt settles the valid ones and leaves the new delivery in flight",
            ready=0,
            in_flight=1,
        )  # only the new delivery
        other.ack([new])
        self.assert_stats(
            other, queue, "ack of the new delivery removes the message", ready=0, in_flight=0
        )
