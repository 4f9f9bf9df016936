"""The leader lock of ``ackwise beat`` in a SQLite file (docs/periodic.md): for beats on one
host, like the SQLite broker itself."""

from __future__ import annotations

import sqlite3
import time
from contextlib import AbstractContextManager

from ackwise.backends.sqlite._file import SQLiteFile, run_schema
from ackwise.contract._spi import BrokerURL
from ackwise.stores._locks import KEEP_FIRES, Claim, LeaderLock, LockInfo

__all__ = ["SQLiteLeaderLock"]

_SQLITE_SCHEMA = (
    """CREATE TABLE IF NOT EXISTS ackwise_locks (
        name       TEXT PRIMARY KEY,
        token      TEXT,
        fence      INTEGER NOT NULL,
        expires_at REAL    NOT NULL,
        owner      TEXT
    ) WITHOUT ROWID""",
    """CREATE TABLE IF NOT EXISTS ackwise_fires (
        lock       TEXT    NOT NULL,
        schedule   TEXT    NOT NULL,
        fire_time  INTEGER NOT NULL,
        fence      INTEGER NOT NULL,
        claimed_at REAL    NOT NULL,
        PRIMARY KEY (lock, schedule, fire_time)
    ) WITHOUT ROWID""",
)
_SQL_HOLDS = "SELECT fence FROM ackwise_locks WHERE name = ? AND token = ? AND expires_at > ?"
_SQL_PRUNE = """
DELETE FROM ackwise_fires
 WHERE lock = :lock AND schedule = :schedule
   AND fire_time <= (SELECT fire_time FROM ackwise_fires
                      WHERE lock = :lock AND schedule = :schedule
                      ORDER BY fire_time DESC LIMIT 1 OFFSET :keep)
"""


class SQLiteLeaderLock(LeaderLock):
    """The lock in a SQLite file (``sqlite:///path.db``, by default the broker's own file).

    Tables ``ackwise_locks`` (name, token, fence, expires_at, owner) and ``ackwise_fires``
    (lock, schedule, fire_time, fence: the claiming holder's, claimed_at; the fence has been
    recorded since the table's first version, so every file's claims say who made them).  Every operation is one ``BEGIN
    IMMEDIATE`` transaction, so it is atomic against every other process on the host; the
    store's expiry uses the host's wall clock, shared by all of them.  The fencing number
    lives in the lock's row, which a release empties but never deletes.
    """

    def __init__(self, url: BrokerURL) -> None:
        super().__init__(url)
        self._file = SQLiteFile(
            url,
            what="SQLite lock store",
            setup=lambda db: run_schema(db, _SQLITE_SCHEMA),
        )
        self.path = self._file.path

    def open(self) -> None:
        self._file.timeout = self.timeout  # set between creation and open
        self._file.open()

    def close(self) -> None:
        self._file.close()

    def _write(self) -> AbstractContextManager[sqlite3.Connection]:
        self._file.timeout = self.timeout
        return self._file.write()

    def _read(self) -> AbstractContextManager[sqlite3.Connection]:
        """A plain read: in WAL mode a consistent snapshot that takes no write lock."""
        self._file.timeout = self.timeout
        return self._file.read()

    def acquire(self, name: str, token: str, ttl: float, owner: str) -> int | None:
        with self._read() as db:  # a follower's usual answer, without the write lock
            row = db.execute(
                "SELECT expires_at FROM ackwise_locks WHERE name = ? AND token IS NOT NULL",
                (name,),
            ).fetchone()
        if row is not None and row[0] > time.time():
            return None
        with self._write() as db:
            now = time.time()  # read after the write lock is ours
            row = db.execute(
                "SELECT token, fence, expires_at FROM ackwise_locks WHERE name = ?", (name,)
            ).fetchone()
            if row is not None and row[0] is not None and row[2] > now:
                return None
            fence = (row[1] if row is not None else 0) + 1
            db.execute(
                "INSERT INTO ackwise_locks (name, token, fence, expires_at, owner) "
                "VALUES (?, ?, ?, ?, ?) ON CONFLICT (name) DO UPDATE SET token = excluded.token, "
                "fence = excluded.fence, expires_at = excluded.expires_at, owner = excluded.owner",
                (name, token, fence, now + ttl, owner),
            )
            return int(fence)

    def renew(self, name: str, token: str, ttl: float) -> bool:
        with self._write() as db:
            now = time.time()
            cur = db.execute(
                "UPDATE ackwise_locks SET expires_at = ? "
                "WHERE name = ? AND token = ? AND expires_at > ?",
                (now + ttl, name, token, now),
            )
            return cur.rowcount == 1

    def release(self, name: str, token: str) -> bool:
        with self._write() as db:
            cur = db.execute(
                "UPDATE ackwise_locks SET token = NULL, expires_at = 0, owner = NULL "
                "WHERE name = ? AND token = ?",
                (name, token),
            )
            return cur.rowcount == 1

    def claim(self, name: str, token: str, schedule: str, fire_time: int) -> Claim:
        with self._write() as db:
            now = time.time()
            row = db.execute(_SQL_HOLDS, (name, token, now)).fetchone()
            if row is None:
                return Claim.NOT_HOLDER
            cur = db.execute(
                "INSERT OR IGNORE INTO ackwise_fires (lock, schedule, fire_time, fence, claimed_at) "
                "VALUES (?, ?, ?, ?, ?)",
                (name, schedule, fire_time, row[0], now),
            )
            if cur.rowcount != 1:
                return Claim.TAKEN
            db.execute(_SQL_PRUNE, {"lock": name, "schedule": schedule, "keep": KEEP_FIRES})
            return Claim.CLAIMED

    def last_fires(self, name: str) -> dict[str, int]:
        with self._read() as db:
            rows = db.execute(
                "SELECT schedule, max(fire_time) FROM ackwise_fires WHERE lock = ? "
                "GROUP BY schedule",
                (name,),
            ).fetchall()
        return {schedule: int(t) for schedule, t in rows}

    def claimed_by(self, name: str, schedule: str, fire_time: int) -> int | None:
        with self._read() as db:
            row = db.execute(
                "SELECT fence FROM ackwise_fires WHERE lock = ? AND schedule = ? AND fire_time = ?",
                (name, schedule, fire_time),
            ).fetchone()
        return None if row is None or row[0] is None else int(row[0])

    def delete(self, name: str) -> None:
        with self._write() as db:
            db.execute("DELETE FROM ackwise_fires WHERE lock = ?", (name,))
            db.execute("DELETE FROM ackwise_locks WHERE name = ?", (name,))

    def info(self, name: str) -> LockInfo | None:
        with self._read() as db:
            now = time.time()
            row = db.execute(
                "SELECT owner, fence, expires_at FROM ackwise_locks "
                "WHERE name = ? AND token IS NOT NULL AND expires_at > ?",
                (name, now),
            ).fetchone()
        if row is None:
            return None
        return LockInfo(name, row[0] or "?", int(row[1]), row[2] - now)
