"""The NATS JetStream adapter: the class, its capabilities and the queues' topology.

Each ackwise queue is a work-queue stream with two durable pull consumers (``ready``,
``delayed``) and a dead-letter stream (:mod:`ackwise_nats._names`).  Receiving and leases:
:mod:`ackwise_nats._receive`; settling and stale receipts: :mod:`ackwise_nats._settle`;
stats, purge and dead letters: :mod:`ackwise_nats._browse`.
"""

from __future__ import annotations

from typing import Any

from ackwise.spi import AttemptCount, BrokerURL, Capabilities, LeaseExtension, QueueSpec
from ackwise_nats._browse import Browsing
from ackwise_nats._client import Client
from ackwise_nats._errors import JetStreamError
from ackwise_nats._names import DELAYED_CONSUMER, READY_CONSUMER, QueueNames
from ackwise_nats._settle import Settling

__all__ = ["NatsAdapter"]

#: "stream name already in use with a different configuration", "consumer already exists"
#: (with another configuration): kept as they are, the queue is usable.
_EXISTS = (10058, 10013, 10148)
#: Room left under NATS's default max_payload (1 MiB) for ackwise's headers.
_MAX_MESSAGE = 1_000_000


class NatsAdapter(Settling, Browsing):
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
        self._declared: set[str] = set()

    def declare(self, queue: QueueSpec) -> None:
        if queue.name in self._declared:
            return
        self.call("declare", queue.name, self._declare, self.names(queue.name))
        self._declared.add(queue.name)

    def _forget(self, queue: str) -> None:
        self._declared.discard(queue)

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
