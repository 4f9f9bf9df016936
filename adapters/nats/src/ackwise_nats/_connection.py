"""The adapter's connection: its settings, the client (opened lazily, again after fork), and
the calls run on the client's event loop with their errors mapped.  Every part of the adapter
(:mod:`ackwise_nats._adapter`) holds the one :class:`Connection`."""

from __future__ import annotations

from collections.abc import Coroutine
from typing import Any, TypeVar

from ackwise.spi import fork_generation
from ackwise_nats._client import Client
from ackwise_nats._errors import map_nats_errors
from ackwise_nats._names import QueueNames
from ackwise_nats._url import NatsSettings

__all__ = ["Connection"]

T = TypeVar("T")


class Connection:
    """Settings, the client (opened lazily, again after fork) and error mapping."""

    def __init__(self, settings: NatsSettings) -> None:
        self.settings = settings
        self._client: Client | None = None
        self._generation = -1

    # -- lifecycle -------------------------------------------------------------------------
    def open(self) -> None:
        self.connected()

    def close(self) -> None:
        client, self._client = self._client, None
        if client is not None and self._generation == fork_generation():
            client.stop()
        # After fork() the parent's thread is not in this process: its client is dropped.

    def connected(self) -> Client:
        """The client, connected (again, if the connection was lost or this is a child)."""
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
        """The context that maps nats-py and JetStream errors of ``operation``."""
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
            client = self.connected()
            coro: Coroutine[Any, Any, Any] = coro_fn(client, *args)
            return client.run(coro, timeout=timeout)

    def names(self, queue: str) -> QueueNames:
        """Where ``queue`` lives in JetStream."""
        return QueueNames.of(self.settings.prefix, queue)
