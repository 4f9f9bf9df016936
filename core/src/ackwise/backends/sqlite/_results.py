"""The result store of ``sqlite://`` apps (docs/results.md): tables in the broker's file."""

from __future__ import annotations

import threading
import time
from collections.abc import Sequence

from ackwise.backends.sqlite._file import SQLiteStore
from ackwise.stores._results import ResultStore, TaskResult

__all__ = ["SQLiteResultStore"]

_SQLITE_SCHEMA = """
CREATE TABLE IF NOT EXISTS ackwise_results (
    id       TEXT PRIMARY KEY,
    state    TEXT NOT NULL,
    record   TEXT NOT NULL,      -- the TaskResult as JSON
    expires  REAL NOT NULL
) WITHOUT ROWID
"""
_SQLITE_CHORDS = """
CREATE TABLE IF NOT EXISTS ackwise_chord_members (
    chord    TEXT NOT NULL,
    member   INTEGER NOT NULL,
    expires  REAL NOT NULL,
    PRIMARY KEY (chord, member)
) WITHOUT ROWID
"""

#: Expired records are deleted at most this often (seconds), by a writer.
_SWEEP_EVERY = 60.0


class SQLiteResultStore(SQLiteStore, ResultStore):
    """Results in the SQLite database file of an embedded broker (table ``ackwise_results``).

    ``wait`` polls (SQLite cannot tell another process of a write).
    """

    scheme = "sqlite"
    what = "SQLite result store"
    schema = (_SQLITE_SCHEMA, _SQLITE_CHORDS)

    def open(self) -> None:
        self._lock = threading.Lock()  # handles read from several producer threads
        self._swept = 0.0
        SQLiteStore.open(self)

    def join(self, chord_id: str, member: int) -> int:
        now = time.time()
        with self._lock, self._tx() as db:
            db.execute(
                "INSERT INTO ackwise_chord_members (chord, member, expires) VALUES (?, ?, ?) "
                "ON CONFLICT (chord, member) DO NOTHING",
                (chord_id, member, now + self.ttl),
            )
            row = db.execute(
                "SELECT COUNT(*) FROM ackwise_chord_members WHERE chord = ?", (chord_id,)
            ).fetchone()
        return int(row[0])

    def put(self, records: Sequence[TaskResult]) -> None:
        if not records:
            return
        now = time.time()
        with self._lock, self._tx() as db:
            for r in records:
                row = db.execute(
                    "SELECT record FROM ackwise_results WHERE id = ? AND expires > ?", (r.id, now)
                ).fetchone()
                old = TaskResult.from_json(row[0]) if row is not None else None
                if r.replaces(old):
                    db.execute(
                        "INSERT INTO ackwise_results (id, state, record, expires) "
                        "VALUES (?, ?, ?, ?) ON CONFLICT (id) DO UPDATE SET "
                        "state = excluded.state, record = excluded.record, "
                        "expires = excluded.expires",
                        (r.id, r.state, r.to_json().decode(), now + self.ttl),
                    )
            if now - self._swept >= _SWEEP_EVERY:
                self._swept = now
                db.execute("DELETE FROM ackwise_results WHERE expires <= ?", (now,))
                db.execute("DELETE FROM ackwise_chord_members WHERE expires <= ?", (now,))

    def forget(self, message_ids: Sequence[str]) -> None:
        with self._lock, self._tx() as db:
            db.executemany("DELETE FROM ackwise_results WHERE id = ?", [(m,) for m in message_ids])
            db.executemany(
                "DELETE FROM ackwise_chord_members WHERE chord = ?", [(m,) for m in message_ids]
            )

    def get(self, message_id: str) -> TaskResult | None:
        with self._lock, self._open_file().read() as db:
            row = db.execute(
                "SELECT record FROM ackwise_results WHERE id = ? AND expires > ?",
                (message_id, time.time()),
            ).fetchone()
        return TaskResult.from_json(row[0]) if row is not None else None
