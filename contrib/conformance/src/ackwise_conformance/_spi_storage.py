"""SPI conformance tests (level 1): dead letters, stats, purge and queue deletion."""

from __future__ import annotations

import time

import pytest

from ackwise import Adapter
from ackwise.errors import UnsupportedCapability
from ackwise.spi import Outgoing, QueueSpec
from ackwise_conformance._spi_base import SPIBase
from ackwise_conformance.helpers import eventually

__all__ = ["StorageChecks"]


class StorageChecks(SPIBase):
    """Tests: dead letters, stats, purge and queue deletion."""

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
