"""A PostgreSQL adapter that holds a row lock across round trips: the suite must say so.

``lock-holding-postgresql://…`` is the real PostgreSQL adapter (``postgresql://…`` with the
prefix) with one trap, the one a MariaDB adapter written from the docs fell into: ``receive``
begins a transaction, takes its rows with the adapter's own ``SELECT … FOR UPDATE SKIP
LOCKED`` and ``UPDATE``, and leaves the transaction open; the next settlement (``ack``,
``nack``, ``dead_letter``) commits it.  While every client runs, nothing shows: each lock
goes at the next settlement.  A client frozen while it holds a delivery keeps that row locked
for as long as it is frozen; every other consumer's ``SKIP LOCKED`` passes the row by, lease
or no lease, and the message comes back only once the frozen client's connection closes
(the broker rolls its transaction back).  The broker holds a lock for a client past one round
trip, which docs/conformance.md forbids (#a-frozen-client-holds-no-lock).

Use: put this directory on ``PYTHONPATH`` and set ``ACKWISE_PLUGINS=lock_holding_adapters``
(worker processes inherit both).  ``tests/test_selftest.py`` runs the suite against it.  The
class is built on first access, as in ``broken_adapters``.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from typing import Any

from ackwise import Adapter, BrokerURL, get_plugins, hookimpl
from ackwise.spi import AdapterRegistry, Delivery

__all__ = ["PREFIX", "SCHEME", "ackwise_register_adapters"]

PREFIX = "lock-holding-"
SCHEME = f"{PREFIX}postgresql"


@hookimpl
def ackwise_register_adapters(registry: AdapterRegistry) -> None:
    registry.add(SCHEME, f"{__name__}:LockHoldingPostgreSQL", distribution="ackwise-selftest")


def __getattr__(name: str) -> type[Adapter]:
    if name == "LockHoldingPostgreSQL":
        return _lock_holding()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


@functools.cache
def _lock_holding() -> type[Adapter]:
    base: Any = get_plugins().adapters.get("postgresql").load()

    class LockHoldingPostgreSQL(base):  # type: ignore[misc,valid-type]
        """BUG: the transaction ``receive`` takes its rows in stays open until a settlement."""

        name = SCHEME

        def __init__(self, url: BrokerURL) -> None:
            super().__init__(BrokerURL.parse(url.raw.removeprefix(PREFIX)))
            self.url = url
            self._holding = False

        def close(self) -> None:
            self._holding = False  # the connection goes, and its transaction with it
            super().close()

        def _take(self, queue: str, n: int, lease: float) -> list[Delivery]:
            began = not self._holding
            if began:
                self._link.execute("begin", "BEGIN")
            taken: list[Delivery] = super()._take(queue, n, lease)
            if taken:
                self._holding = True  # the rows stay locked: the trap
            elif began:
                # Nothing taken, nothing locked: end it, or the LISTEN of an idle receive
                # would hear nothing (notifications wait for the end of a transaction).
                self._link.execute("commit", "COMMIT")
            return taken

        def _commit(self) -> None:
            if self._holding:
                self._holding = False
                self._link.execute("commit", "COMMIT")

        def ack(self, deliveries: Sequence[Delivery]) -> None:
            try:
                super().ack(deliveries)
            finally:
                self._commit()

        def nack(self, delivery: Delivery, *, delay: float = 0.0) -> None:
            try:
                super().nack(delivery, delay=delay)
            finally:
                self._commit()

        def dead_letter(
            self, delivery: Delivery, *, reason: str, body: bytes | None = None
        ) -> None:
            try:
                super().dead_letter(delivery, reason=reason, body=body)
            finally:
                self._commit()

    return LockHoldingPostgreSQL
