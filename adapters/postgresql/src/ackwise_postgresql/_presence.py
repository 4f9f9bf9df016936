"""The worker registry in PostgreSQL (``postgresql://``, ``postgres://``; docs/workers.md):
table ``ackwise_workers``, made on first use in the connection's schema."""

from __future__ import annotations

import time
from collections.abc import Sequence

from ackwise.spi import BrokerURL, WorkerInfo, WorkerRegistry
from ackwise_postgresql._link import StoreLink

__all__ = ["PostgresWorkerRegistry"]

#: Records are forgotten this long after their last write (as ackwise's own registries).
FORGET_AFTER = 3600.0

_SCHEMA = [
    """
CREATE TABLE IF NOT EXISTS ackwise_workers (
    id         TEXT PRIMARY KEY,
    last_seen  DOUBLE PRECISION NOT NULL,
    record     TEXT NOT NULL
)""",
]


class PostgresWorkerRegistry(WorkerRegistry):
    """Table ``ackwise_workers`` of a PostgreSQL database (see the module documentation)."""

    scheme = "postgresql"

    def __init__(self, url: BrokerURL) -> None:
        super().__init__(url)
        self._link = StoreLink(url, "worker registry", _SCHEMA)

    def open(self) -> None:
        self._link.open()

    def close(self) -> None:
        self._link.close()

    def beat(self, info: WorkerInfo) -> None:
        self._link.execute(
            "INSERT INTO ackwise_workers (id, last_seen, record) VALUES (%s, %s, %s) "
            "ON CONFLICT (id) DO UPDATE SET last_seen = excluded.last_seen, "
            "record = excluded.record",
            (info.id, info.last_seen, info.to_json()),
        )

    def workers(self) -> list[WorkerInfo]:
        self._link.execute(
            "DELETE FROM ackwise_workers WHERE last_seen < %s", (time.time() - FORGET_AFTER,)
        )
        rows = self._link.execute("SELECT record FROM ackwise_workers").fetchall()
        infos = [WorkerInfo.from_json(r[0]) for r in rows]
        return sorted(infos, key=lambda w: (w.started_at, w.id))

    def forget(self, worker_ids: Sequence[str]) -> None:
        if worker_ids:
            self._link.execute(
                "DELETE FROM ackwise_workers WHERE id = ANY(%s)", (list(worker_ids),)
            )
