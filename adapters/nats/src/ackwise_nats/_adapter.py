"""The NATS JetStream adapter: the class, its capabilities and the queues' topology.

Each ackwise queue is a work-queue stream with two durable pull consumers (``ready``,
``delayed``) and a dead-letter stream (:mod:`ackwise_nats._names`).  The adapter holds one
object per concern, each using the connection (:class:`~ackwise_nats._connection.Connection`)
by its methods: publishing (:mod:`ackwise_nats._publish`), receiving and leases
(:mod:`ackwise_nats._receive`), settling and stale receipts (:mod:`ackwise_nats._settle`),
stats, purge and dead letters (:mod:`ackwise_nats._browse`).  It checks what it is given
(delays, priorities) before handing a call on.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from ackwise.spi import (
    Adapter,
    AttemptCount,
    BrokerURL,
    Capabilities,
    DeadLetter,
    Delivery,
    LeaseExtension,
    Outgoing,
    QueueSpec,
    QueueStats,
)
from ackwise_nats._browse import Browser
from ackwise_nats._client import Client
from ackwise_nats._connection import Connection
from ackwise_nats._errors import JetStreamError
from ackwise_nats._names import DELAYED_CONSUMER, READY_CONSUMER, QueueNames
from ackwise_nats._publish import Publisher
from ackwise_nats._receive import Receiver
from ackwise_nats._settle import Settler
from ackwise_nats._url import parse_nats_url

__all__ = ["NatsAdapter"]

#: "stream name already in use with a different configuration", "consumer already exists"
#: (with another configuration): kept as they are, the queue is usable.
_EXISTS = (10058, 10013, 10148)
#: Room left under NATS's default max_payload (1 MiB) for ackwise's headers.
_MAX_MESSAGE = 1_000_000


class NatsAdapter(Adapter):
    """``nats://host:port?prefix=...``: one JetStream work-queue stream per queue."""

    name = "nats"
    capabilities = Capabilities(
        native_delay=True,  # a not-before header, held by naks with a delay
        max_delay=None,
        lease_extension=LeaseExtension.PER_MESSAGE,  # +WPI, or a nak with the lease as delay
        max_lease=None,
        attempt_count=AttemptCount.EXACT,  # num_delivered (+ the deliveries a copy carries)
        native_dead_letter=True,  # a dead-letter stream per queue
        max_message_size=_MAX_MESSAGE,
        multi_process=True,
        oldest_age=True,
        purge_delayed=True,
        time_resolution=0.0,
        priorities=False,
    )

    def __init__(self, url: BrokerURL) -> None:
        super().__init__(url)
        self.settings = parse_nats_url(url)
        self._connection = Connection(self.settings)
        self._publisher = Publisher(self._connection)
        self._receiver = Receiver(self._connection)
        self._settler = Settler(self._connection)
        self._browser = Browser(self._connection)
        self._declared: set[str] = set()

    @property
    def due_hints(self) -> dict[str, float]:
        """Per queue, the soonest a delayed message this adapter saw comes due."""
        return self._receiver.due_hints

    # -- lifecycle -------------------------------------------------------------------------
    def open(self) -> None:
        self._connection.open()

    def close(self) -> None:
        self._connection.close()

    # -- topology --------------------------------------------------------------------------
    def declare(self, queue: QueueSpec) -> None:
        if queue.name in self._declared:
            return
        connection = self._connection
        connection.call("declare", queue.name, self._declare, connection.names(queue.name))
        self._declared.add(queue.name)

    def delete_queue(self, queue: str) -> None:
        self._browser.delete_queue(queue)
        self._declared.discard(queue)

    # -- producing -------------------------------------------------------------------------
    def publish(self, queue: str, messages: Sequence[Outgoing]) -> None:
        self.check_priorities(messages)
        for m in messages:
            self.check_delay(m.delay)
        self._publisher.publish(queue, messages)

    def publish_dead(self, queue: str, messages: Sequence[Outgoing], *, reason: str) -> None:
        self.check_priorities(messages)
        self._publisher.publish_dead(queue, messages, reason=reason)

    # -- consuming -------------------------------------------------------------------------
    def receive(
        self, queue: str, *, max_messages: int, wait: float, lease: float
    ) -> Sequence[Delivery]:
        """No-wait pulls from the queue's ``ready`` consumer, polled while ``wait`` lasts, due
        delayed messages moved there first; a lease other than the AckWait is set per message
        by a nak (:mod:`ackwise_nats._receive`)."""
        return self._receiver.receive(queue, max_messages=max_messages, wait=wait, lease=lease)

    def ack(self, deliveries: Sequence[Delivery]) -> None:
        """``+ACK`` each, waiting for the server's answers (see
        :meth:`Settler.ack <ackwise_nats._settle.Settler.ack>`)."""
        self._settler.ack(deliveries)

    def extend(self, deliveries: Sequence[Delivery], *, lease: float) -> None:
        """``+WPI``, or a nak with the lease as its delay: counted only when answered before
        the old deadline."""
        self._settler.extend(deliveries, lease=lease)

    def nack(self, delivery: Delivery, *, delay: float = 0.0) -> None:
        """A copy that counts the deliveries so far goes to the ready subject (with a delay: to
        the delayed one, with its not-before header), then the original is acked."""
        self.check_delay(delay)
        self._settler.nack(delivery, delay=delay)

    def dead_letter(self, delivery: Delivery, *, reason: str, body: bytes | None = None) -> None:
        """A copy with the reason goes to the dead-letter stream, then the original is acked."""
        self._settler.dead_letter(delivery, reason=reason, body=body)

    # -- inspection ------------------------------------------------------------------------
    def stats(self, queue: str) -> QueueStats:
        """The ready consumer's pending (ready) and ack-pending (in flight) counts, the delayed
        subject's and the dead-letter stream's message counts, the first pending message's
        age."""
        return self._browser.stats(queue)

    def dead_letters(self, queue: str, *, limit: int = 100) -> Sequence[DeadLetter]:
        """Read from the dead-letter stream in sequence order."""
        return self._browser.dead_letters(queue, limit=limit)

    def requeue_dead(self, queue: str, message_ids: Sequence[str]) -> int:
        """Each chosen dead letter is copied to the ready subject (deduplicated by its
        sequence: a replay asked twice copies once), then deleted."""
        return self._browser.requeue_dead(queue, message_ids)

    def delete_dead(self, queue: str, message_ids: Sequence[str] | None = None) -> int:
        """By stream sequence; all of them: a purge of the dead-letter stream."""
        return self._browser.delete_dead(queue, message_ids)

    def purge(self, queue: str) -> int:
        """The delayed subject, and the ready messages not delivered yet (those in flight
        stay)."""
        return self._browser.purge(queue)

    def queues(self) -> Sequence[str]:
        """The queues whose streams are under the URL's prefix."""
        return self._browser.queues()

    async def _declare(self, client: Client, names: QueueNames) -> None:
        s = self.settings
        await self._create(
            client,
            f"STREAM.CREATE.{names.stream}",
            {
                "name": names.stream,
                "subjects": [names.ready, names.delayed],
                "retention": "workqueue",
                "storage": "file",
                "num_replicas": s.replicas,
                "duplicate_window": 120 * 10**9,
            },
        )
        for consumer, subject in ((READY_CONSUMER, names.ready), (DELAYED_CONSUMER, names.delayed)):
            await self._create(
                client,
                f"CONSUMER.DURABLE.CREATE.{names.stream}.{consumer}",
                {
                    "stream_name": names.stream,
                    "config": {
                        "durable_name": consumer,
                        "deliver_policy": "all",
                        "ack_policy": "explicit",
                        "ack_wait": int(s.ack_wait * 1e9),
                        "max_deliver": -1,  # the worker dead-letters past max_deliveries
                        "max_ack_pending": -1,
                        "max_waiting": 512,
                        "filter_subject": subject,
                    },
                },
            )
        await self._create(
            client,
            f"STREAM.CREATE.{names.dead_stream}",
            {
                "name": names.dead_stream,
                "subjects": [names.dead],
                "retention": "limits",
                "storage": "file",
                "num_replicas": s.replicas,
            },
        )

    @staticmethod
    async def _create(client: Client, subject: str, request: dict[str, Any]) -> None:
        try:
            await client.api(subject, request)
        except JetStreamError as exc:
            if exc.err_code not in _EXISTS:
                raise
