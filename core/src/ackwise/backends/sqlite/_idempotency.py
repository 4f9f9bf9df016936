"""The idempotency store of ``sqlite://`` apps (docs/idempotency.md): a table in the broker's
file."""

from __future__ import annotations

import time
from collections.abc import Sequence

from ackwise.backends.sqlite._file import SQLiteStore
from ackwise.stores._idempotency import ClaimResult, IdempotencyStore, KeyState

__all__ = ["SQLiteIdempotencyStore"]

_SQLITE_SCHEMA = """
CREATE TABLE IF NOT EXISTS ackwise_idempotency (
    key        TEXT PRIMARY KEY,
    status     TEXT NOT NULL,      -- 'running' or 'done'
    holder     TEXT,
    until      REAL NOT NULL       -- running: lease end; done: when the key is forgotten
) WITHOUT ROWID
"""


class SQLiteIdempotencyStore(SQLiteStore, IdempotencyStore):
    """Keys in the SQLite database file of an embedded broker (table ``ackwise_idempotency``)."""

    scheme = "sqlite"
    what = "SQLite idempotency store"
    schema = (_SQLITE_SCHEMA,)

    def claim(self, key: str, holder: str, lease: float) -> ClaimResult:
        now = time.time()
        with self._tx() as db:
            row = db.execute(
                "SELECT status, until FROM ackwise_idempotency WHERE key = ?", (key,)
            ).fetchone()
            if row is not None and row[1] > now:
                if row[0] == "done":
                    return ClaimResult(KeyState.DONE)
                return ClaimResult(KeyState.BUSY, row[1] - now)
            # New, or its holder's lease ran out (taken over), or a done key that expired.
            db.execute(
                "INSERT INTO ackwise_idempotency (key, status, holder, until) "
                "VALUES (?, 'running', ?, ?) ON CONFLICT (key) DO UPDATE SET "
                "status = 'running', holder = excluded.holder, until = excluded.until",
                (key, holder, now + lease),
            )
            return ClaimResult(KeyState.RUN)

    def extend(self, claims: Sequence[tuple[str, str]], lease: float) -> None:
        if not claims:
            return
        until = time.time() + lease
        with self._tx() as db:
            db.executemany(
                "UPDATE ackwise_idempotency SET until = ? "
                "WHERE key = ? AND holder = ? AND status = 'running'",
                [(until, key, holder) for key, holder in claims],
            )

    def complete(self, key: str, holder: str) -> None:
        with self._tx() as db:
            db.execute(
                "UPDATE ackwise_idempotency SET status = 'done', holder = NULL, until = ? "
                "WHERE key = ?",
                (time.time() + self.done_ttl, key),
            )

    def release(self, key: str, holder: str) -> None:
        with self._tx() as db:
            db.execute(
                "DELETE FROM ackwise_idempotency "
                "WHERE key = ? AND holder = ? AND status = 'running'",
                (key, holder),
            )

    def forget(self, keys: Sequence[str]) -> None:
        with self._tx() as db:
            db.executemany("DELETE FROM ackwise_idempotency WHERE key = ?", [(k,) for k in keys])
