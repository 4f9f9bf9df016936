"""The result store in PostgreSQL (``postgresql://``, ``postgres://``; docs/results.md).

Tables ``ackwise_results`` (a record per message id, as JSON, with its expiry) and
``ackwise_chord_members``, made on first use in the connection's schema.  The write-once rule
of :meth:`ackwise.TaskResult.replaces` is one statement, so the database serializes racing
writers; a write that changed a record NOTIFYs ``ackwise_results`` with the message id, which
``wait`` LISTENs for on a connection of its own.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Iterator, Sequence
from typing import Any

from ackwise.spi import BrokerURL, ResultStore, TaskResult
from ackwise_postgresql._link import StoreLink

__all__ = ["PostgresResultStore"]

_SCHEMA = """
CREATE TABLE IF NOT EXISTS ackwise_results (
    id       TEXT PRIMARY KEY,
    state    TEXT NOT NULL,
    record   TEXT NOT NULL,
    expires  DOUBLE PRECISION NOT NULL
);
CREATE TABLE IF NOT EXISTS ackwise_chord_members (
    chord    TEXT NOT NULL,
    member   INTEGER NOT NULL,
    expires  DOUBLE PRECISION NOT NULL,
    PRIMARY KEY (chord, member)
)
"""

#: The channel a write is announced on (the payload: the message id).
_CHANNEL = "ackwise_results"

#: Expired records are deleted at most this often (seconds), by a writer (as ackwise's SQLite
#: store).
_SWEEP_EVERY = 60.0

# The write-once rule of TaskResult.replaces, in one statement: the database serializes racing
# writers.
_PUT = (
    "INSERT INTO ackwise_results AS r (id, state, record, expires) VALUES (%s, %s, %s, %s) "
    "ON CONFLICT (id) DO UPDATE SET state = excluded.state, record = excluded.record, "
    "expires = excluded.expires WHERE r.expires <= %s OR (r.state <> 'succeeded' AND NOT "
    "(excluded.state = 'started' AND r.state IN ('failed', 'dead'))) RETURNING id"
)


class PostgresResultStore(ResultStore):
    """Results in PostgreSQL (``postgresql://user@host/db``); see the module documentation."""

    scheme = "postgresql"

    def __init__(self, url: BrokerURL, **kwargs: Any) -> None:
        super().__init__(url, **kwargs)
        self._link = StoreLink(url, "result store", [s for s in _SCHEMA.split(";") if s.strip()])
        self._exec = self._link.execute
        self._swept = 0.0

    def open(self) -> None:
        self._link.open()

    def close(self) -> None:
        self._link.close()

    def put(self, records: Sequence[TaskResult]) -> None:
        now = time.time()
        for r in records:
            row = self._exec(
                _PUT, (r.id, r.state, r.to_json().decode(), now + self.ttl, now)
            ).fetchone()
            if row is not None:
                self._exec("SELECT pg_notify(%s, %s)", (_CHANNEL, r.id))
        if now - self._swept >= _SWEEP_EVERY:
            self._swept = now
            self._exec("DELETE FROM ackwise_results WHERE expires <= %s", (now,))
            self._exec("DELETE FROM ackwise_chord_members WHERE expires <= %s", (now,))

    def get(self, message_id: str) -> TaskResult | None:
        row = self._exec(
            "SELECT record FROM ackwise_results WHERE id = %s AND expires > %s",
            (message_id, time.time()),
        ).fetchone()
        return TaskResult.from_json(row[0]) if row is not None else None

    def forget(self, message_ids: Sequence[str]) -> None:
        for mid in message_ids:
            self._exec("DELETE FROM ackwise_results WHERE id = %s", (mid,))
            self._exec("DELETE FROM ackwise_chord_members WHERE chord = %s", (mid,))

    def join(self, chord_id: str, member: int) -> int:
        self._exec(
            "INSERT INTO ackwise_chord_members (chord, member, expires) "
            "VALUES (%s, %s, %s) ON CONFLICT (chord, member) DO NOTHING",
            (chord_id, member, time.time() + self.ttl),
        )
        row = self._exec(
            "SELECT count(*) FROM ackwise_chord_members WHERE chord = %s", (chord_id,)
        ).fetchone()
        return int(row[0]) if row is not None else 0

    @contextlib.contextmanager
    def _listening(self, message_id: str) -> Iterator[Callable[[float | None], None]]:
        listener = self._link.connect()
        try:
            with self._link.errors("listen"):
                listener.execute(f"LISTEN {_CHANNEL}")

            def pause(left: float | None) -> None:
                # At most 1 s at a time: a missed notification costs a second, not the wait.
                step = 1.0 if left is None else min(left, 1.0)
                with self._link.errors("wait for a notification"):
                    for note in listener.notifies(timeout=step, stop_after=1):
                        if note.payload == message_id:
                            break

            yield pause
        finally:
            listener.close()
