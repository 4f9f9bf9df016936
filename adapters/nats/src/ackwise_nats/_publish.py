"""Publishing: ready messages, delayed ones (a not-before header on the delayed subject) and
dead letters, each batch pipelined and confirmed by the stream's PubAcks.  What is published
was checked (delays, priorities) by the adapter."""

from __future__ import annotations

import time
from collections.abc import Sequence

from ackwise.spi import Outgoing
from ackwise_nats._client import Client
from ackwise_nats._connection import Connection
from ackwise_nats._headers import H_ATTEMPT, H_DEAD_AT, H_ID, H_NOT_BEFORE, H_REASON

__all__ = ["Publisher"]

Item = tuple[str, bytes, dict[str, str]]


class Publisher:
    """Publishes through the connection: ready, delayed and dead messages."""

    def __init__(self, connection: Connection) -> None:
        self._connection = connection

    def publish(self, queue: str, messages: Sequence[Outgoing]) -> None:
        names = self._connection.names(queue)
        now = time.time()
        items: list[Item] = []
        for m in messages:
            if m.delay > 0:
                headers = {H_ID: m.id, H_NOT_BEFORE: f"{now + m.delay:.6f}"}
                items.append((names.delayed, m.body, headers))
            else:
                items.append((names.ready, m.body, {H_ID: m.id}))
        self._connection.call("publish", queue, Client.publish_all, items)

    def publish_dead(self, queue: str, messages: Sequence[Outgoing], *, reason: str) -> None:
        names = self._connection.names(queue)
        now = f"{time.time():.6f}"
        items: list[Item] = [
            (names.dead, m.body, {H_ID: m.id, H_REASON: reason, H_DEAD_AT: now, H_ATTEMPT: "1"})
            for m in messages
        ]
        self._connection.call("publish_dead", queue, Client.publish_all, items)
