"""Level 1 of the conformance suite: the adapter SPI, one guarantee per test.

An adapter author subclasses :class:`AdapterConformance` and overrides one fixture::

    class TestRedisAdapter(AdapterConformance):
        @pytest.fixture
        def adapter_factory(self, redis_url):
            return lambda: ackwise.open_adapter(redis_url)

``adapter_factory`` returns a zero-argument callable that builds a **new, unopened** adapter on
the same broker each time it is called (the suite opens several: "another consumer").
Optional overrides:

``time_scale`` (fixture, default 1.0)
    multiplies every lease, delay and timeout of the suite.
``lease`` (fixture, default ``1.0 * time_scale`` seconds)
    the short lease the tests let expire.
``ordered`` (class attribute, default True)
    set False for brokers that do not keep publication order (SQS standard queues); the
    ordering test is then reported as skipped with that reason.

``queue_prefix`` (fixture, default ``"conformance-"``)
    what the name of every queue the suite declares starts with.

Each test gets a fresh queue with a unique name (``queue`` fixture); deliveries the test left
in flight are acked and every queue the test declared is deleted afterwards
(:meth:`~ackwise.Adapter.delete_queue`).

A test whose capability the adapter declares absent is skipped with ``n/a:`` and the reason;
the gate tests check that such an adapter raises :class:`~ackwise.errors.UnsupportedCapability`.

Connection-based leases (``lease_extension=CONNECTION``, RabbitMQ) do not expire while the
consumer's connection lives: for those adapters "the lease expires" is expressed as "the
consumer loses its connection" (:meth:`AdapterConformance.lose_lease`: close and reopen the
adapter), and the lease-expiry test checks that the delivery outlives its nominal lease while
the connection lives and comes back with ``attempt + 1`` once it is gone.
"""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Callable, Iterator, Sequence
from contextlib import suppress
from typing import ClassVar

import pytest

from ackwise import (
    Adapter,
    AttemptCount,
    Capabilities,
    Delivery,
    LeaseExtension,
    Outgoing,
    QueueSpec,
    QueueStats,
)
from ackwise.errors import AdapterError, StaleReceipt, UnsupportedCapability
from ackwise_conformance.helpers import eventually

__all__ = ["AdapterConformance"]

AdapterFactory = Callable[[], Adapter]

_STATS_FIELDS = ("ready", "delayed", "in_flight", "dead")


def _ids(deliveries: Sequence[Delivery]) -> list[str]:
    return [d.message_id for d in deliveries]


class AdapterConformance:
    """Base class of the SPI conformance tests.  Override :meth:`adapter_factory`."""

    #: False for brokers that do not keep publication order.
    ordered: ClassVar[bool] = True
    #: Why the broker does not keep order (shown in the skip message).
    unordered_reason: ClassVar[str] = "the adapter declares that it does not keep order"
    #: Why ``stats().oldest_age`` is not measured (``None``: it is); its check is then n/a.
    no_oldest_age: ClassVar[str | None] = None

    # Set per test by the autouse fixture below.
    prefix: str
    lease_s: float
    scale: float
    patience: float
    _taken: list[tuple[Adapter, Delivery]]
    _queues: list[tuple[Adapter, str]]

    # -- fixtures an adapter author overrides ----------------------------------------------
    @pytest.fixture
    def adapter_factory(self) -> AdapterFactory:
        """Return a callable that builds a new, unopened adapter on the broker under test."""
        pytest.fail(
            f"{type(self).__name__} must override the 'adapter_factory' fixture: return a "
            "zero-argument callable that builds a new, unopened adapter"
        )

    @pytest.fixture
    def time_scale(self) -> float:
        """Multiplier for every lease, delay and timeout of the suite."""
        return 1.0

    @pytest.fixture
    def queue_prefix(self) -> str:
        """What the name of every queue the suite declares starts with."""
        return "conformance-"

    @pytest.fixture
    def lease(self, time_scale: float) -> float:
        """The short lease (seconds) that tests let expire."""
        return 1.0 * time_scale

    # -- fixtures of the suite -------------------------------------------------------------
    @pytest.fixture(autouse=True)
    def _conformance_settings(
        self,
        lease: float,
        time_scale: float,
        queue_prefix: str,
        adapter_factory: AdapterFactory,
    ) -> Iterator[None]:
        self.prefix = queue_prefix
        self.lease_s = lease
        self.scale = time_scale
        self.patience = 10.0 * time_scale
        self._taken = []
        self._queues = []
        yield
        # After every other fixture's teardown (the test's adapters are closed by now): delete
        # what is left on a new connection -- queues of a test that used declare_queue without
        # the queue fixture, or whose adapter it closed itself.
        self._cleanup()
        if self._queues:
            with suppress(Exception):
                sweeper = adapter_factory()
                sweeper.open()
                try:
                    for _, name in self._queues:
                        with suppress(AdapterError):
                            sweeper.delete_queue(name)
                finally:
                    sweeper.close()

    @pytest.fixture
    def connect(self, adapter_factory: AdapterFactory) -> Iterator[AdapterFactory]:
        """Open a new adapter on the broker; every one is closed after the test."""
        opened: list[Adapter] = []
        lock = threading.Lock()

        def make() -> Adapter:
            adapter = adapter_factory()
            adapter.open()
            with lock:
                opened.append(adapter)
            return adapter

        yield make
        for adapter in reversed(opened):
            with suppress(Exception):
                adapter.close()

    @pytest.fixture
    def adapter(self, connect: AdapterFactory) -> Adapter:
        """The adapter under test, open."""
        return connect()

    @pytest.fixture
    def other(self, connect: AdapterFactory) -> Adapter:
        """A second adapter on the same broker: another consumer."""
        return connect()

    @pytest.fixture
    def queue(self, adapter: Adapter, connect: AdapterFactory) -> Iterator[str]:
        """A declared queue with a unique name; cleaned up after the test."""
        name = self.declare_queue(adapter)
        yield name
        self._cleanup()

    # -- helpers ---------------------------------------------------------------------------
    def declare_queue(self, adapter: Adapter) -> str:
        """Declare a new uniquely named queue, cleaned up after the test."""
        name = f"{self.prefix}{uuid.uuid4().hex[:16]}"
        adapter.declare(QueueSpec(name))
        self._queues.append((adapter, name))
        return name

    def _cleanup(self) -> None:
        by_adapter: dict[int, tuple[Adapter, list[Delivery]]] = {}
        for adapter, delivery in self._taken:
            by_adapter.setdefault(id(adapter), (adapter, []))[1].append(delivery)
        for adapter, deliveries in by_adapter.values():
            with suppress(AdapterError):
                adapter.ack(deliveries)
        self._taken = []
        left = []
        for adapter, name in self._queues:
            try:
                adapter.delete_queue(name)
            except AdapterError:
                left.append((adapter, name))
        self._queues = left

    def track(self, adapter: Adapter, deliveries: Sequence[Delivery]) -> Sequence[Delivery]:
        """Remember ``deliveries`` so that they are acked after the test."""
        self._taken.extend((adapter, d) for d in deliveries)
        return deliveries

    def receive(
        self,
        adapter: Adapter,
        queue: str,
        *,
        max_messages: int = 10,
        wait: float = 0.0,
        lease: float | None = None,
    ) -> Sequence[Delivery]:
        """One ``adapter.receive`` call, its deliveries tracked for cleanup."""
        got = adapter.receive(
            queue,
            max_messages=max_messages,
            wait=wait,
            lease=self.lease_s if lease is None else lease,
        )
        return self.track(adapter, got)

    def take(
        self,
        adapter: Adapter,
        queue: str,
        n: int = 1,
        *,
        lease: float | None = None,
        timeout: float | None = None,
        max_messages: int | None = None,
    ) -> list[Delivery]:
        """Receive exactly ``n`` deliveries within ``timeout`` (default: the suite's patience)."""
        timeout = self.patience if timeout is None else timeout
        deadline = time.monotonic() + timeout
        out: list[Delivery] = []
        while len(out) < n:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise AssertionError(
                    f"expected {n} deliveries from {queue} within {timeout:.2f}s, got "
                    f"{len(out)}: {_ids(out)}"
                )
            batch = self.receive(
                adapter,
                queue,
                max_messages=min(n - len(out), max_messages or n),
                wait=min(remaining, 1.0 * self.scale),
                lease=lease,
            )
            out.extend(batch)
        assert len(out) == n, f"asked for {n} deliveries, got {len(out)}: {_ids(out)}"
        return out

    def assert_nothing_receivable(
        self, adapter: Adapter, queue: str, wait: float, why: str = ""
    ) -> None:
        """Assert that no delivery comes from ``queue`` for ``wait`` seconds.

        :param why: the guarantee, in words ("ack removes the message for good").
        """
        deadline = time.monotonic() + wait
        while (remaining := deadline - time.monotonic()) > 0:
            got = self.receive(adapter, queue, wait=remaining)
            head = f"broken: {why}: " if why else ""
            assert not got, (
                f"{head}{_ids(got)} delivered from {queue} within {wait:.2f}s, where nothing "
                "should be receivable"
            )

    def assert_stats(
        self, adapter: Adapter, queue: str, why: str = "", **expected: int
    ) -> QueueStats:
        """Wait (up to the patience) until ``stats(queue)`` shows the ``expected`` counts.

        :param why: the guarantee the counts check, in words ("ack removes the message"): a
            failure says it broke, and how the counts differ.
        """
        unknown = set(expected) - set(_STATS_FIELDS)
        assert not unknown, f"unknown stats fields {unknown}"
        last: list[QueueStats] = []

        def matches() -> bool:
            stats = adapter.stats(queue)
            last[:] = [stats]
            return all(getattr(stats, k) == v for k, v in expected.items())

        try:
            eventually(matches, self.patience, description=f"stats of {queue} == {expected}")
        except AssertionError:
            raise AssertionError(
                _stats_failure(why, queue, expected, last, self.patience)
            ) from None
        return last[0]

    def expect_stale(self, settle: Callable[[], object], what: str) -> StaleReceipt:
        """Run ``settle``, which must raise :class:`StaleReceipt`; return the exception.

        :param what: the settlement and its receipt, in words ("ack of an acked receipt").
        """
        try:
            settle()
        except StaleReceipt as exc:
            return exc
        raise AssertionError(
            f"a stale receipt was accepted: {what} returned without StaleReceipt; a receipt "
            "whose delivery was settled, or whose lease expired and went to another consumer, "
            "must be refused and change nothing"
        )

    def assert_attempt(self, adapter: Adapter, delivery: Delivery | int, expected: int) -> None:
        """Check a delivery's ``attempt`` as precisely as the adapter's capabilities promise."""
        kind = self.capabilities_of(adapter).attempt_count
        got = delivery if isinstance(delivery, int) else delivery.attempt
        if kind is AttemptCount.EXACT:
            assert got == expected, f"attempt: expected {expected}, got {got}"
        elif kind is AttemptCount.APPROXIMATE:
            assert got >= 1 and (got > 1) == (expected > 1), (
                f"attempt (approximate): expected about {expected}, got {got}"
            )
        else:
            assert (got > 1) == (expected > 1), (
                f"attempt (flag only): expected {'a redelivery' if expected > 1 else 'a first '}"
                f"delivery, got attempt={got}"
            )

    @staticmethod
    def capabilities_of(adapter: Adapter) -> Capabilities:
        return type(adapter).capabilities

    def long_delay(self, adapter: Adapter) -> float:
        """A delay no test outlives: 60 s scaled, within the adapter's ``max_delay``."""
        max_delay = self.capabilities_of(adapter).max_delay
        delay = 60.0 * self.scale
        return delay if max_delay is None else min(delay, max_delay)

    def require_native_delay(self, adapter: Adapter) -> None:
        if not self.capabilities_of(adapter).native_delay:
            pytest.skip(
                "n/a: the adapter declares native_delay=False (the gate is checked by "
                "test_delay_is_refused_without_native_delay)"
            )

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
        assert _ids(got) == ids

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
        got = _ids([*first, *more, *rest])
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

    def connection_leases(self, adapter: Adapter) -> bool:
        return self.capabilities_of(adapter).lease_extension is LeaseExtension.CONNECTION

    def lose_lease(self, adapter: Adapter) -> None:
        """End the leases ``adapter`` holds: wait them out, or drop its connection.

        With connection-based leases the broker takes a delivery back only when the
        consumer's connection goes, so the adapter is closed and opened again: its receipts
        are now of a connection that is gone.
        """
        if self.connection_leases(adapter):
            adapter.close()
            adapter.open()

    def _expire_and_redeliver(
        self, adapter: Adapter, other: Adapter, queue: str
    ) -> tuple[Delivery, Delivery]:
        """Publish one message; let ``adapter``'s lease expire; ``other`` receives it again.

        The new delivery's lease is long, so it stays in flight for the rest of the test.
        """
        adapter.publish(queue, [Outgoing("m", b"body")])
        (old,) = self.take(adapter, queue, lease=self.lease_s)
        self.lose_lease(adapter)
        (new,) = self.take(
            other, queue, lease=30 * self.lease_s, timeout=self.lease_s + self.patience
        )
        assert new.message_id == old.message_id and new.body == old.body
        self.assert_attempt(other, new, old.attempt + 1)
        return old, new

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

    # -- lease expiry and extension --------------------------------------------------------
    def test_unsettled_delivery_is_redelivered_after_lease_with_attempt_plus_one(
        self, adapter: Adapter, other: Adapter, queue: str
    ) -> None:
        adapter.publish(queue, [Outgoing("m", b"body")])
        (first,) = self.take(adapter, queue, lease=self.lease_s)
        if self.connection_leases(adapter):
            # Held while the connection lives, past the nominal lease; back once it is gone.
            self.assert_nothing_receivable(
                other,
                queue,
                1.5 * self.lease_s,
                "a delivery within its lease is not given to another consumer",
            )
            self.lose_lease(adapter)
        else:
            self.assert_nothing_receivable(
                other,
                queue,
                0.5 * self.lease_s,
                "a delivery within its lease is not given to another consumer",
            )
        (second,) = self.take(other, queue, timeout=self.lease_s + self.patience)
        received_at = time.time()
        assert received_at >= first.lease_deadline - 0.05 * self.scale, (
            "redelivered before the lease expired"
        )
        assert (second.message_id, second.body) == ("m", b"body")
        self.assert_attempt(other, second, first.attempt + 1)
        other.ack([second])

    def test_extend_keeps_a_delivery_invisible_past_its_original_lease(
        self, adapter: Adapter, other: Adapter, queue: str
    ) -> None:
        if self.capabilities_of(adapter).lease_extension is not LeaseExtension.PER_MESSAGE:
            pytest.skip(
                "n/a: the adapter's lease_extension is "
                f"{self.capabilities_of(adapter).lease_extension.value}, not per-message"
            )
        adapter.publish(queue, [Outgoing("m", b"body")])
        (d,) = self.take(adapter, queue, lease=self.lease_s)
        until = d.lease_deadline + 0.5 * self.lease_s
        while time.time() < until:
            adapter.extend([d], lease=self.lease_s)
            self.assert_nothing_receivable(
                other,
                queue,
                self.lease_s / 4,
                "extend keeps the delivery from other consumers past its original lease",
            )
        self.assert_stats(
            adapter,
            queue,
            "extend keeps the delivery in flight past its original lease",
            ready=0,
            in_flight=1,
        )
        adapter.ack([d])  # still owned by the original delivery
        self.assert_stats(
            adapter, queue, "ack after extend removes the message", ready=0, in_flight=0
        )

    def test_batch_extend_with_one_stale_receipt_extends_the_valid_ones(
        self, adapter: Adapter, other: Adapter, queue: str
    ) -> None:
        if self.capabilities_of(adapter).lease_extension is not LeaseExtension.PER_MESSAGE:
            pytest.skip("n/a: the adapter's leases are not extended per message")
        old, new = self._expire_and_redeliver(adapter, other, queue)
        adapter.publish(queue, [Outgoing("y", b"y")])
        (valid,) = self.take(adapter, queue, lease=30 * self.lease_s)
        stale = self.expect_stale(
            lambda: adapter.extend([old, valid], lease=30 * self.lease_s),
            "a batch extend with one expired, redelivered receipt",
        )
        assert stale.deliveries == (old,)
        adapter.ack([valid])
        other.ack([new])
        self.assert_stats(
            adapter,
            queue,
            "a batch extend with a stale receipt extends the valid ones; acks remove all",
            ready=0,
            in_flight=0,
        )

    # -- nack ------------------------------------------------------------------------------
    def test_nack_without_delay_makes_the_message_receivable_at_once_with_attempt_plus_one(
        self, adapter: Adapter, queue: str
    ) -> None:
        adapter.publish(queue, [Outgoing("m", b"body")])
        (first,) = self.take(adapter, queue, lease=30 * self.lease_s)
        adapter.nack(first)
        (second,) = self.take(adapter, queue, timeout=0.5 * self.lease_s)
        assert (second.message_id, second.body) == ("m", b"body")
        self.assert_attempt(adapter, second, first.attempt + 1)
        self.expect_stale(lambda: adapter.ack([first]), "ack of a nacked delivery's receipt")
        adapter.ack([second])

    def test_nack_then_close_returns_the_message_to_other_consumers_at_once(
        self, adapter_factory: AdapterFactory, other: Adapter, queue: str
    ) -> None:
        # The graceful-shutdown path: prefetched messages are nacked, then the adapter closes.
        first = adapter_factory()
        first.open()
        first.publish(queue, [Outgoing("m", b"x")])
        (d,) = first.receive(queue, max_messages=1, wait=self.patience, lease=self.patience * 10)
        first.nack(d)
        first.close()
        (again,) = self.take(other, queue, timeout=self.patience)
        assert again.message_id == "m"

    def test_nack_with_delay_hides_the_message_until_due(
        self, adapter: Adapter, queue: str
    ) -> None:
        self.require_native_delay(adapter)
        delay = 1.0 * self.scale
        adapter.publish(queue, [Outgoing("m", b"body")])
        (first,) = self.take(adapter, queue, lease=30 * self.lease_s)
        nacked_at = time.time()
        adapter.nack(first, delay=delay)
        self.assert_nothing_receivable(
            adapter, queue, 0.5 * delay, "nack(delay) hides the message until the delay is over"
        )
        (second,) = self.take(adapter, queue, timeout=delay + self.patience)
        assert time.time() >= nacked_at + delay - 0.05 * self.scale, "received before due"
        self.assert_attempt(adapter, second, first.attempt + 1)
        adapter.ack([second])

    # -- delays ----------------------------------------------------------------------------
    def test_delayed_publish_is_invisible_until_due_and_counted_as_delayed(
        self, adapter: Adapter, queue: str
    ) -> None:
        self.require_native_delay(adapter)
        delay = 1.5 * self.scale
        published_at = time.time()
        adapter.publish(queue, [Outgoing("later", b"x", delay=delay)])
        stats = adapter.stats(queue)
        if time.time() < published_at + delay:  # only meaningful before it is due
            assert (stats.ready, stats.delayed) == (0, 1), f"a delayed message: {stats}"
        # Watched only while it is surely not due: a slow stats call must not push the
        # window past the due time (CI: 'later' was received in a window that ended past it).
        watch = min(0.5 * delay, published_at + 0.9 * delay - time.time())
        if watch > 0:
            self.assert_nothing_receivable(
                adapter, queue, watch, "a delayed publish is not delivered before it is due"
            )
        (d,) = self.take(adapter, queue, timeout=delay + self.patience)
        assert time.time() >= published_at + delay - 0.05 * self.scale, "received before due"
        assert d.message_id == "later"
        self.assert_attempt(adapter, d, 1)
        adapter.ack([d])

    def test_delayed_and_ready_messages_in_one_batch(self, adapter: Adapter, queue: str) -> None:
        self.require_native_delay(adapter)
        adapter.publish(
            queue, [Outgoing("now", b"x"), Outgoing("later", b"y", delay=self.long_delay(adapter))]
        )
        (d,) = self.take(adapter, queue)
        assert d.message_id == "now"
        self.assert_stats(
            adapter,
            queue,
            "a batch publish counts a delayed message as delayed and the other as received",
            ready=0,
            delayed=1,
            in_flight=1,
        )

    # -- dead letters ----------------------------------------------------------------------
    def test_dead_letter_keeps_body_and_reason_and_leaves_in_flight(
        self, adapter: Adapter, queue: str
    ) -> None:
        body = b'{"task": "t"}'
        adapter.publish(queue, [Outgoing("m", body)])
        (d,) = self.take(adapter, queue)
        before = time.time()
        adapter.dead_letter(d, reason="failed")
        after = time.time()
        self.assert_stats(
            adapter,
            queue,
            "dead_letter moves the message out of flight into the dead letters",
            ready=0,
            in_flight=0,
            dead=1,
        )
        (dead,) = adapter.dead_letters(queue)
        assert (dead.queue, dead.message_id, dead.body, dead.reason) == (
            queue,
            "m",
            body,
            "failed",
        )
        assert before - 1.0 <= dead.dead_at <= after + 1.0
        self.assert_attempt(adapter, dead.attempt, 1)
        self.assert_nothing_receivable(
            adapter, queue, 0.2 * self.scale, "a dead-lettered message is not delivered again"
        )
        self.expect_stale(lambda: adapter.ack([d]), "ack of a dead-lettered delivery's receipt")

    def test_dead_letter_with_a_replacement_body_keeps_the_id(
        self, adapter: Adapter, queue: str
    ) -> None:
        adapter.publish(queue, [Outgoing("m", b"original")])
        (d,) = self.take(adapter, queue)
        adapter.dead_letter(d, reason="worker_lost", body=b"annotated")
        (dead,) = eventually(lambda: adapter.dead_letters(queue), self.patience)
        assert (dead.message_id, dead.body, dead.reason) == ("m", b"annotated", "worker_lost")

    def test_publish_dead_stores_messages_directly_as_dead_letters(
        self, adapter: Adapter, queue: str
    ) -> None:
        adapter.publish_dead(queue, [Outgoing("a", b"A"), Outgoing("b", b"B")], reason="failed")
        self.assert_stats(
            adapter,
            queue,
            "publish_dead stores the messages as dead letters only",
            ready=0,
            delayed=0,
            in_flight=0,
            dead=2,
        )
        dead = eventually(lambda: adapter.dead_letters(queue), self.patience)
        assert [(x.message_id, x.body, x.reason) for x in dead] == [
            ("a", b"A", "failed"),
            ("b", b"B", "failed"),
        ]
        self.assert_nothing_receivable(
            adapter,
            queue,
            0.2 * self.scale,
            "publish_dead stores dead letters that are never delivered",
        )

    def test_dead_letters_are_listed_oldest_first_up_to_limit(
        self, adapter: Adapter, queue: str
    ) -> None:
        for name in ("a", "b", "c"):
            adapter.publish_dead(queue, [Outgoing(name, b"x")], reason="failed")
            time.sleep(0.002)  # distinct dead_at values
        self.assert_stats(
            adapter, queue, "publish_dead stores each message as a dead letter", dead=3
        )
        assert [x.message_id for x in adapter.dead_letters(queue, limit=2)] == ["a", "b"]

    # -- stats and purge -------------------------------------------------------------------
    def test_requeue_dead_replays_each_message_once_as_a_new_delivery(
        self, adapter: Adapter, queue: str
    ) -> None:
        adapter.publish(queue, [Outgoing("a", b"body-a"), Outgoing("b", b"body-b")])
        for d in self.take(adapter, queue, 2):
            adapter.dead_letter(d, reason="failed", body=d.body + b"+history")
        self.assert_stats(
            adapter,
            queue,
            "dead_letter moves both messages to the dead letters",
            ready=0,
            in_flight=0,
            dead=2,
        )
        assert adapter.requeue_dead(queue, ["a", "missing"]) == 1
        assert adapter.requeue_dead(queue, ["a"]) == 0  # run twice: replayed once
        self.assert_stats(
            adapter,
            queue,
            "requeue_dead makes the requeued message ready and leaves the other dead",
            ready=1,
            dead=1,
        )
        (d,) = self.take(adapter, queue)
        assert (d.message_id, d.body) == ("a", b"body-a+history")
        self.assert_attempt(adapter, d.attempt, 1)  # a new delivery: the count starts again
        adapter.ack([d])
        assert [x.message_id for x in adapter.dead_letters(queue)] == ["b"]

    def test_delete_dead_removes_the_named_or_all_dead_letters(
        self, adapter: Adapter, queue: str
    ) -> None:
        adapter.publish_dead(
            queue, [Outgoing("a", b"1"), Outgoing("b", b"2"), Outgoing("c", b"3")], reason="failed"
        )
        eventually(lambda: len(adapter.dead_letters(queue)) == 3, self.patience)
        assert adapter.delete_dead(queue, ["b", "missing"]) == 1
        assert sorted(x.message_id for x in adapter.dead_letters(queue)) == ["a", "c"]
        assert adapter.delete_dead(queue) == 2
        assert adapter.dead_letters(queue) == []
        self.assert_stats(adapter, queue, "delete_dead removes the dead letters", ready=0, dead=0)

    def test_delete_queue_removes_every_message_and_the_queue(
        self, adapter: Adapter, queue: str
    ) -> None:
        native_delay = self.capabilities_of(adapter).native_delay
        adapter.publish(queue, [Outgoing("r", b"x")])
        if native_delay:
            adapter.publish(queue, [Outgoing("d", b"x", delay=self.long_delay(adapter))])
        adapter.publish_dead(queue, [Outgoing("x", b"x")], reason="failed")
        self.assert_stats(
            adapter,
            queue,
            "the queue holds the ready, delayed and dead messages published",
            ready=1,
            delayed=1 if native_delay else 0,
            dead=1,
        )
        adapter.delete_queue(queue)
        adapter.delete_queue(queue)  # a queue that is gone: not an error
        try:
            listed = adapter.queues()
        except UnsupportedCapability:
            # Declared again, the queue must hold nothing of before.  (Where the broker lists
            # its queues that is the check: SQS refuses a deleted name for 60 s.)
            adapter.declare(QueueSpec(queue))
            self.assert_stats(
                adapter,
                queue,
                "delete_queue removes every message of the queue",
                ready=0,
                delayed=0,
                in_flight=0,
                dead=0,
            )
            assert adapter.dead_letters(queue) == [], "delete_queue left dead letters"
        else:
            assert queue not in listed, "delete_queue left the queue on the broker's list"

    def test_stats_of_an_empty_queue_are_zero(self, adapter: Adapter, queue: str) -> None:
        stats = adapter.stats(queue)
        assert stats.queue == queue
        assert (stats.ready, stats.delayed, stats.in_flight, stats.dead) == (0, 0, 0, 0)
        assert stats.oldest_age == 0.0

    def test_stats_count_each_state_and_the_oldest_age(self, adapter: Adapter, queue: str) -> None:
        if not self.capabilities_of(adapter).oldest_age:
            pytest.skip("n/a: the adapter declares oldest_age=False (the broker does not tell)")
        native_delay = self.capabilities_of(adapter).native_delay
        published_at = time.time()
        adapter.publish(queue, [Outgoing(f"r{i}", b"x") for i in range(3)])
        (taken,) = self.take(adapter, queue, max_messages=1, lease=30 * self.lease_s)
        if native_delay:
            adapter.publish(queue, [Outgoing("d", b"x", delay=self.long_delay(adapter))])
        adapter.publish_dead(queue, [Outgoing("x", b"x")], reason="failed")
        stats = self.assert_stats(
            adapter, queue, ready=2, delayed=1 if native_delay else 0, in_flight=1, dead=1
        )
        assert 0.0 <= stats.oldest_age <= time.time() - published_at + 1.0 * self.scale
        if self.no_oldest_age:
            adapter.ack([taken])
            pytest.skip(f"n/a (the counts were checked): oldest_age: {self.no_oldest_age}")
        wait = 0.3 * self.scale
        time.sleep(wait)  # let the oldest ready message age
        aged = adapter.stats(queue)
        assert aged.oldest_age >= wait - 0.05 * self.scale, f"oldest_age did not grow: {aged}"
        adapter.ack([taken])

    def test_purge_deletes_ready_and_delayed_and_leaves_in_flight_alone(
        self, adapter: Adapter, queue: str
    ) -> None:
        native_delay = self.capabilities_of(adapter).native_delay
        if native_delay and not self.capabilities_of(adapter).purge_delayed:
            pytest.skip(
                "n/a: the adapter declares purge_delayed=False (its broker cannot delete a "
                "delayed message without deleting in-flight ones)"
            )
        adapter.publish(queue, [Outgoing(f"r{i}", b"x") for i in range(3)])
        (taken,) = self.take(adapter, queue, max_messages=1, lease=30 * self.lease_s)
        if native_delay:
            adapter.publish(queue, [Outgoing("d", b"x", delay=self.long_delay(adapter))])
        self.assert_stats(
            adapter,
            queue,
            "the published ready and delayed messages are counted",
            ready=2,
            delayed=1 if native_delay else 0,
        )
        assert adapter.purge(queue) == (3 if native_delay else 2)
        self.assert_stats(
            adapter,
            queue,
            "purge removes ready and delayed messages and leaves the in-flight one",
            ready=0,
            delayed=0,
            in_flight=1,
        )
        adapter.ack([taken])  # the in-flight delivery survived the purge
        self.assert_stats(
            adapter,
            queue,
            "ack of the in-flight delivery that survived the purge removes it",
            ready=0,
            delayed=0,
            in_flight=0,
        )

    # -- receive with wait -----------------------------------------------------------------
    def test_receive_without_wait_returns_at_once_when_empty(
        self, adapter: Adapter, queue: str
    ) -> None:
        start = time.monotonic()
        assert not self.receive(adapter, queue, wait=0.0)
        assert time.monotonic() - start < 1.0 * self.scale

    def test_receive_with_wait_returns_empty_after_about_the_wait(
        self, adapter: Adapter, queue: str
    ) -> None:
        wait = 0.5 * self.scale
        start = time.monotonic()
        assert not self.receive(adapter, queue, wait=wait)
        elapsed = time.monotonic() - start
        assert 0.5 * wait <= elapsed <= wait + 1.0 * self.scale, (
            f"receive(wait={wait:.2f}) returned after {elapsed:.3f}s"
        )

    def test_receive_with_wait_returns_promptly_when_a_message_arrives(
        self, adapter: Adapter, connect: Callable[[], Adapter], queue: str
    ) -> None:
        producer = connect()
        delay = 0.3 * self.scale
        published: list[float] = []
        errors: list[BaseException] = []

        def publish_later() -> None:
            try:
                time.sleep(delay)
                producer.publish(queue, [Outgoing("m", b"x")])
                published.append(time.monotonic())
            except BaseException as exc:  # reported by the test thread
                errors.append(exc)

        thread = threading.Thread(target=publish_later, daemon=True)
        wait = 5.0 * self.scale
        thread.start()
        try:
            got: Sequence[Delivery] = []
            end = time.monotonic() + wait
            while not got and time.monotonic() < end:
                got = self.receive(adapter, queue, max_messages=1, wait=end - time.monotonic())
            received = time.monotonic()
        finally:
            thread.join(self.patience)
        assert not errors, f"publishing failed: {errors}"
        assert _ids(got) == ["m"]
        assert published and received - published[0] <= 1.0 * self.scale, (
            f"receive returned {received - published[0]:.3f}s after the publish"
        )

    # -- capability gates ------------------------------------------------------------------
    def test_delay_is_refused_without_native_delay(self, adapter: Adapter, queue: str) -> None:
        if self.capabilities_of(adapter).native_delay:
            pytest.skip(
                "n/a: the adapter declares native_delay=True, so there is no gate to check "
                "(delays are tested by the delay tests)"
            )
        with pytest.raises(UnsupportedCapability):
            adapter.publish(queue, [Outgoing("m", b"x", delay=1.0)])
        self.assert_stats(
            adapter, queue, "a refused delayed publish stores nothing", ready=0, delayed=0
        )
        adapter.publish(queue, [Outgoing("m", b"x")])
        (d,) = self.take(adapter, queue)
        with pytest.raises(UnsupportedCapability):
            adapter.nack(d, delay=1.0)
        adapter.ack([d])  # the refused nack left the delivery owned

    def test_delay_beyond_max_delay_is_refused(self, adapter: Adapter, queue: str) -> None:
        caps = self.capabilities_of(adapter)
        if caps.max_delay is None or not caps.native_delay:
            pytest.skip(
                "n/a: the adapter declares max_delay=None (unbounded delays), so there is no "
                "limit to check"
                if caps.native_delay
                else "n/a: the adapter has no native delay (see the native_delay gate test)"
            )
        too_long = caps.max_delay + 1.0
        with pytest.raises(UnsupportedCapability):
            adapter.publish(queue, [Outgoing("m", b"x", delay=too_long)])
        self.assert_stats(
            adapter, queue, "a refused delayed publish stores nothing", ready=0, delayed=0
        )
        adapter.publish(queue, [Outgoing("m", b"x")])
        (d,) = self.take(adapter, queue)
        with pytest.raises(UnsupportedCapability):
            adapter.nack(d, delay=too_long)
        adapter.ack([d])

    def test_extend_is_refused_without_lease_extension(self, adapter: Adapter, queue: str) -> None:
        if self.capabilities_of(adapter).lease_extension is not LeaseExtension.NONE:
            pytest.skip(
                "n/a: the adapter declares lease_extension="
                f"{self.capabilities_of(adapter).lease_extension.value}, so extend is supported"
            )
        adapter.publish(queue, [Outgoing("m", b"x")])
        (d,) = self.take(adapter, queue)
        with pytest.raises(UnsupportedCapability):
            adapter.extend([d], lease=self.lease_s)
        adapter.ack([d])


def _stats_failure(
    why: str, queue: str, expected: dict[str, int], last: list[QueueStats], waited: float
) -> str:
    """ "<why> did not hold: 1 message ready (expected 0), ... after 10s", with the stats."""
    if not last:
        return f"{why or 'stats'}: stats({queue}) never answered within {waited:g}s"
    got = last[0]
    wrong = ", ".join(
        f"{getattr(got, k)} {_STATE_WORDS[k]} (expected {v})"
        for k, v in expected.items()
        if getattr(got, k) != v
    )
    counts = " ".join(f"{k}={getattr(got, k)}" for k in ("ready", "delayed", "in_flight", "dead"))
    head = f"broken: {why}: " if why else ""
    return f"{head}{wrong} after {waited:g}s (queue {queue}: {counts})"


_STATE_WORDS = {
    "ready": "ready",
    "delayed": "delayed",
    "in_flight": "in flight",
    "dead": "dead-lettered",
}
