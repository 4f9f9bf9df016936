"""The worker registry of ``sqlite://`` apps (docs/workers.md): a table in the broker's file."""

from __future__ import annotations

import time
from collections.abc import Sequence

from ackwise.backends.sqlite._file import SQLiteStore
from ackwise.stores._presence import FORGET_AFTER, WorkerInfo, WorkerRegistry, ordered

__all__ = ["SQLiteWorkerRegistry"]

_SQLITE_SCHEMA = """
CREATE TABLE IF NOT EXISTS ackwise_workers (
    id         TEXT PRIMARY KEY,
    last_seen  REAL NOT NULL,    -- unix time of the record
    record     TEXT NOT NULL     -- WorkerInfo as JSON
) WITHOUT ROWID
"""


class SQLiteWorkerRegistry(SQLiteStore, WorkerRegistry):
    """In the SQLite file of an embedded broker (table ``ackwise_workers``)."""

    scheme = "sqlite"
    what = "SQLite worker registry"
    schema = (_SQLITE_SCHEMA,)

    def beat(self, info: WorkerInfo) -> None:
        with self._tx() as db:
            db.execute(
                "INSERT INTO ackwise_workers (id, last_seen, record) VALUES (?, ?, ?) "
                "ON CONFLICT (id) DO UPDATE SET last_seen = excluded.last_seen, "
                "record = excluded.record",
                (info.id, info.last_seen, info.to_json()),
            )

    def workers(self) -> list[WorkerInfo]:
        with self._tx() as db:
            db.execute(
                "DELETE FROM ackwise_workers WHERE last_seen < ?", (time.time() - FORGET_AFTER,)
            )
            rows = db.execute("SELECT record FROM ackwise_workers").fetchall()
        return ordered([WorkerInfo.from_json(r[0]) for r in rows])

    def forget(self, worker_ids: Sequence[str]) -> None:
        with self._tx() as db:
            db.executemany("DELETE FROM ackwise_workers WHERE id = ?", [(w,) for w in worker_ids])
