"""The fixtures and helpers of the SPI conformance tests (level 1); the tests are in the
``_spi_*`` modules, put together by :class:`ackwise_conformance.spi.AdapterConformance`."""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Callable, Iterator, Sequence
from contextlib import suppress
from typing import ClassVar

import pytest

from ackwise import Adapter, AttemptCount, Capabilities, LeaseExtension, QueueStats
from ackwise.errors import AdapterError, StaleReceipt
from ackwise.spi import Delivery, Outgoing, QueueSpec
from ackwise_conformance._held_lock import held_lock_reason
from ackwise_conformance.helpers import eventually

__all__ = ["AdapterFactory", "SPIBase", "ids_of"]

AdapterFactory = Callable[[], Adapter]

_STATS_FIELDS = ("ready", "delayed", "in_flight", "dead")


def ids_of(deliveries: Sequence[Delivery]) -> list[str]:
    """The message ids of ``deliveries``, in order."""
    return [d.message_id for d in deliveries]


class SPIBase:
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
                    f"{len(out)}: {ids_of(out)}"
                )
            batch = self.receive(
                adapter,
                queue,
                max_messages=min(n - len(out), max_messages or n),
                wait=min(remaining, 1.0 * self.scale),
                lease=lease,
            )
            out.extend(batch)
        assert len(out) == n, f"asked for {n} deliveries, got {len(out)}: {ids_of(out)}"
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
                f"{head}{ids_of(got)} delivered from {queue} within {wait:.2f}s, where nothing "
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

    def take_redelivery(
        self, holder: Adapter, other: Adapter, queue: str, *, lease: float | None = None
    ) -> Delivery:
        """``other`` receives the one delivery whose lease ``holder`` let end while idle.

        ``holder`` makes no call meanwhile: a client frozen between two calls.  When nothing
        comes within the lease and the patience, ``holder`` is closed and ``other`` looks
        again: a delivery that comes now was kept by a lock the broker held for ``holder``'s
        connection, and the failure says so (docs/conformance.md#a-frozen-client-holds-no-lock).
        Where leases last as long as the connection, ``holder`` lost it already: nothing to
        tell apart.
        """
        timeout = self.lease_s + self.patience
        try:
            (new,) = self.take(other, queue, lease=lease, timeout=timeout)
            return new
        except AssertionError as exc:
            if self.connection_leases(holder):
                raise
            missed = exc
        holder.close()  # its transactions end, its locks go with its connection
        if self.receive(other, queue, max_messages=1, wait=2 * self.lease_s, lease=lease):
            raise AssertionError(
                "broken: "
                + held_lock_reason(f"the message of {queue}", "the idle consumer", timeout)
            )
        raise missed

    def _expire_and_redeliver(
        self, adapter: Adapter, other: Adapter, queue: str
    ) -> tuple[Delivery, Delivery]:
        """Publish one message; let ``adapter``'s lease expire; ``other`` receives it again.

        The new delivery's lease is long, so it stays in flight for the rest of the test.
        """
        adapter.publish(queue, [Outgoing("m", b"body")])
        (old,) = self.take(adapter, queue, lease=self.lease_s)
        self.lose_lease(adapter)
        new = self.take_redelivery(adapter, other, queue, lease=30 * self.lease_s)
        assert new.message_id == old.message_id and new.body == old.body
        self.assert_attempt(other, new, old.attempt + 1)
        return old, new


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
