"""The rate limiter of ``sqlite://`` apps (docs/rate-limits.md): tables in the broker's file."""

from __future__ import annotations

import time

from ackwise.backends.sqlite._file import SQLiteStore
from ackwise.stores._ratelimit import RateLimiter, next_slot, start_wait

__all__ = ["SQLiteRateLimiter"]

_SQLITE_SCHEMA = """
CREATE TABLE IF NOT EXISTS ackwise_rate_limits (
    key   TEXT PRIMARY KEY,
    next  REAL NOT NULL          -- the next free start (unix time)
) WITHOUT ROWID
"""
_SQLITE_STARTS = """
CREATE TABLE IF NOT EXISTS ackwise_rate_starts (
    key   TEXT PRIMARY KEY,
    last  REAL NOT NULL          -- the last recorded start, margin included (unix time)
) WITHOUT ROWID
"""
_SQLITE_SET_NEXT = (
    "INSERT INTO ackwise_rate_limits (key, next) VALUES (?, ?) "
    "ON CONFLICT (key) DO UPDATE SET next = excluded.next"
)


class SQLiteRateLimiter(SQLiteStore, RateLimiter):
    """In the SQLite file of an embedded broker (table ``ackwise_rate_limits``); the workers
    share the host, hence its clock."""

    scheme = "sqlite"
    what = "SQLite rate limits"
    schema = (_SQLITE_SCHEMA, _SQLITE_STARTS)

    def reserve(self, key: str, interval: float) -> float:
        with self._tx() as db:
            row = db.execute(
                "SELECT next FROM ackwise_rate_limits WHERE key = ?", (key,)
            ).fetchone()
            wait, after = next_slot(None if row is None else row[0], time.time(), interval)
            db.execute(_SQLITE_SET_NEXT, (key, after))
        return wait

    def start(self, key: str, interval: float, margin: float = 0.0) -> float:
        with self._tx() as db:
            now = time.time()
            row = db.execute(
                "SELECT last FROM ackwise_rate_starts WHERE key = ?", (key,)
            ).fetchone()
            wait = start_wait(None if row is None else row[0], now, interval)
            if wait == 0.0:
                begun = now + margin
                db.execute(
                    "INSERT INTO ackwise_rate_starts (key, last) VALUES (?, ?) "
                    "ON CONFLICT (key) DO UPDATE SET last = excluded.last",
                    (key, begun),
                )
                row = db.execute(
                    "SELECT next FROM ackwise_rate_limits WHERE key = ?", (key,)
                ).fetchone()
                if row is None or row[0] < begun + interval:
                    db.execute(_SQLITE_SET_NEXT, (key, begun + interval))
        return wait

    def forget(self, key: str) -> None:
        with self._tx() as db:
            db.execute("DELETE FROM ackwise_rate_limits WHERE key = ?", (key,))
            db.execute("DELETE FROM ackwise_rate_starts WHERE key = ?", (key,))
