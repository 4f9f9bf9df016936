"""What every part of the adapter shares: settings, the connection, names and headers."""

from __future__ import annotations

from collections.abc import Coroutine
from typing import Any, TypeVar

from ackwise.spi import Adapter, BrokerURL, fork_generation
from ackwise_nats._client import Client
from ackwise_nats._errors import map_nats_errors
from ackwise_nats._names import QueueNames
from ackwise_nats._url import parse_nats_url

__all__ = ["H_ATTEMPT", "H_ATTEMPTS", "H_DEAD_AT", "H_ID", "H_NOT_BEFORE", "H_REASON", "NatsBase"]

T = TypeVar("T")

#: The message id (JetStream's own Nats-Msg-Id deduplicates: ackwise's ids are not unique).
H_ID = "Ackwise-Id"
#: Epoch seconds before which a message on the delayed subject is not delivered.
H_NOT_BEFORE = "Ackwise-Not-Before"
#: Deliveries a message had before this copy of it (a nack with delay publishes a copy).
H_ATTEMPTS = "Ackwise-Attempts"
#: A dead letter's reason, when it died and the attempt it died at.
H_REASON = "Ackwise-Reason"
H_ATTEMPT = "Ackwise-Attempt"
H_DEAD_AT = "Ackwise-Dead-At"


class NatsBase(Adapter):
    """Settings, the connection (opened lazily, again after fork) and error mapping."""

    name = "nats"

    def __init__(self, url: BrokerURL) -> None:
        super().__init__(url)
        self.settings = parse_nats_url(url)
        self._client: Client | None = None
        self._generation = -1
        #: Per queue, the soonest a delayed message this adapter saw comes due.
        self.due_hints: dict[str, float] = {}

    # -- lifecycle -------------------------------------------------------------------------
    def open(self) -> None:
        self._connected()

    def close(self) -> None:
        client, self._client = self._client, None
        if client is not None and self._generation == fork_generation():
            client.stop()
        # After fork() the parent's thread is not in this process: its client is dropped.

    def _connected(self) -> Client:
        client = self._client
        if client is not None and self._generation == fork_generation():
            if client.nc is not None and not client.nc.is_closed:
                return client
            client.stop()  # the connection was lost: a new one
        self._client = None
        client = Client(self.settings)
        try:
            with self.mapped("connect"):
                client.run(client.connect(), timeout=self.settings.connect_timeout)
        except BaseException:
            client.stop()
            raise
        self._client, self._generation = client, fork_generation()
        return client

    # -- helpers ---------------------------------------------------------------------------
    def mapped(self, operation: str, queue: str | None = None) -> Any:
        where = f"{self.settings.where}: {operation}" + (f" {queue}" if queue else "")
        return map_nats_errors(where, self.settings.password)

    def call(
        self,
        operation: str,
        queue: str | None,
        coro_fn: Any,
        *args: Any,
        timeout: float | None = None,
    ) -> Any:
        """Run ``coro_fn(client, *args)`` on the loop, its errors mapped."""
        with self.mapped(operation, queue):
            client = self._connected()
            coro: Coroutine[Any, Any, Any] = coro_fn(client, *args)
            return client.run(coro, timeout=timeout)

    def names(self, queue: str) -> QueueNames:
        return QueueNames.of(self.settings.prefix, queue)
