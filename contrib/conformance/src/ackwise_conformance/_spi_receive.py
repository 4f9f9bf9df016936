"""SPI conformance tests (level 1): receive with a wait, and the capability gates."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Sequence

import pytest

from ackwise import Adapter, LeaseExtension
from ackwise.errors import UnsupportedCapability
from ackwise.spi import Delivery, Outgoing
from ackwise_conformance._spi_base import SPIBase, ids_of

__all__ = ["ReceiveChecks"]


class ReceiveChecks(SPIBase):
    """Tests: receive with a wait, and the capability gates."""

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
        assert ids_of(got) == ["m"]
        assert published and received - published[0] <= 1.0 * self.scale, (
            f"receive returned {received - published[0]:.3f}s after the publish"
        )

    # -- receive_later (optional) -----------------------------------------------------------
    def _later(
        self, adapter: Adapter, queue: str, n: int, lease: float | None = None
    ) -> Callable[[], Sequence[Delivery]]:
        answer = adapter.receive_later(
            queue, max_messages=n, lease=self.lease_s if lease is None else lease
        )
        if answer is None:
            pytest.skip("n/a: the adapter has no receive_later (the worker calls receive)")
        return answer

    def test_receive_later_answers_as_receive_does_with_other_calls_in_between(
        self, adapter: Adapter, queue: str
    ) -> None:
        adapter.publish(queue, [Outgoing(f"m{i}", b"x%d" % i) for i in range(3)])
        answer = self._later(adapter, queue, 2)
        adapter.publish(queue, [Outgoing("m3", b"x3")])  # calls before the answer is read
        adapter.stats(queue)
        got = self.track(adapter, answer())
        assert ids_of(got) == ["m0", "m1"]
        assert [d.body for d in got] == [b"x0", b"x1"]
        adapter.ack(got)
        rest = self.take(adapter, queue, 2)
        assert sorted(ids_of(rest)) == ["m2", "m3"]
        self.assert_stats(adapter, queue, ready=0, in_flight=2)

    def test_receive_later_of_an_empty_queue_answers_nothing(
        self, adapter: Adapter, queue: str
    ) -> None:
        answer = self._later(adapter, queue, 5)
        assert not self.track(adapter, answer())

    def test_a_receive_later_never_read_gives_its_messages_back_after_the_lease(
        self, adapter: Adapter, other: Adapter, queue: str
    ) -> None:
        if self.connection_leases(adapter):
            pytest.skip("n/a: leases last as long as the connection")
        adapter.publish(queue, [Outgoing("m", b"x")])
        self._later(adapter, queue, 1)  # leased when asked; the answer is never read
        time.sleep(0.2 * self.scale)
        self.assert_nothing_receivable(other, queue, 0.3 * self.lease_s, "leased when asked")
        again = self.take_redelivery(adapter, other, queue)  # a lock held for the answer?
        assert again.message_id == "m"
        self.assert_attempt(other, again, 2)

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
