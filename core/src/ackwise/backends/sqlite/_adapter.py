"""``sqlite:///path.db``: the embedded default broker, one database file shared by processes.

URLs follow SQLAlchemy's convention: three slashes before a relative path, four before an
absolute one::

    sqlite:///ackwise.db                 ./ackwise.db (relative to the working directory
                                         when the adapter is created)
    sqlite:////var/lib/app/ackwise.db    /var/lib/app/ackwise.db

Options (query string):

``synchronous=normal|full`` (default ``normal``)
    ``normal``: in WAL mode a commit is not fsync'ed; the queue survives any *process* crash
    (SIGKILL, OOM) but the last transactions may be lost on power loss or an OS crash.
    ``full``: every commit is fsync'ed; survives power loss, at a cost per transaction.
``busy_timeout=SECONDS`` (default ``10``)
    how long one operation waits for another process's write lock before raising
    :class:`~ackwise.errors.TransientAdapterError`.

The parent directory must exist; it is never created.

Storage: one table, ``ackwise_messages``.  A row is ready (``state=0``; ``available_at`` is when
it becomes due: this is the native delay), in flight (``state=1``; ``available_at`` is the lease
deadline) or dead (``state=2``, with ``reason`` and ``dead_at``).  Receiving is one
``UPDATE … RETURNING`` over a partial index on ``(queue, available_at) WHERE state < 2``: it takes
ready rows that are due *and* in-flight rows whose lease has expired, which is how a dead
worker's messages come back, with the delivery count incremented.  Every receive call draws a
fresh random 63-bit lease token; a delivery's receipt is ``(seq, token)``, so a settlement with an
outdated receipt matches no row and raises :class:`~ackwise.errors.StaleReceipt`.

Every write runs in an explicit ``BEGIN IMMEDIATE`` transaction (the connection is in
autocommit mode), so writers queue on the database lock instead of failing on a lock upgrade.

Rows ackwise did not write (SQLite keeps any type in any column) never stop a worker nor hide
valid messages: a received row whose ``body`` is not a BLOB, whose ``id`` is not TEXT or whose
delivery count is not an integer is handed over as a corrupt delivery, which the worker
dead-letters ``corrupt_record`` with the row kept as it is.  A row that could never become due
(``available_at`` not a number, or absurdly far: TEXT and BLOB sort after every number) or
whose ``state`` is none of 0, 1, 2 (looked for when a queue is declared) is first marked
corrupt by a ``reason`` on a row that is not dead, which ackwise itself never writes.
"""

from __future__ import annotations

import logging
import secrets
import sqlite3
import time
from collections.abc import Iterator, Sequence
from contextlib import AbstractContextManager
from typing import Any

from ackwise.backends.sqlite._file import SQLiteFile, map_sqlite_errors
from ackwise.contract._spi import (
    Adapter,
    BrokerURL,
    Capabilities,
    DeadLetter,
    Delivery,
    Outgoing,
    QueueSpec,
    QueueStats,
)
from ackwise.errors import (
    MessageTooLarge,
    PermanentAdapterError,
    StaleReceipt,
)

__all__ = ["SQLiteAdapter"]

log = logging.getLogger(__name__)

#: Largest envelope accepted.  SQLite's own blob limit is 1e9 bytes; a task queue row of that
#: size would stall every other worker sharing the file, so ackwise refuses above 64 MiB.
MAX_MESSAGE_SIZE = 64 * 1024 * 1024

SCHEMA_VERSION = 2

READY, IN_FLIGHT, DEAD = 0, 1, 2

# Largest batch of (seq, token) pairs in one statement; bigger batches use several statements
# in the same transaction.
_CHUNK = 512

# Only rows of priority > 0 are in it: a queue that never uses priorities pays one empty
# range seek per receive.
_URGENT_INDEX = f"""CREATE INDEX IF NOT EXISTS ackwise_messages_urgent
    ON ackwise_messages (queue, priority, available_at) WHERE state < {DEAD} AND priority > 0"""
_SCHEMA = f"""
CREATE TABLE IF NOT EXISTS ackwise_messages (
    seq          INTEGER PRIMARY KEY,
    queue        TEXT    NOT NULL,
    id           TEXT    NOT NULL,
    body         BLOB    NOT NULL,
    state        INTEGER NOT NULL,
    available_at REAL    NOT NULL,
    deliveries   INTEGER NOT NULL DEFAULT 0,
    token        INTEGER,
    enqueued_at  REAL    NOT NULL,
    reason       TEXT,
    dead_at      REAL,
    priority     INTEGER NOT NULL DEFAULT 0
);
CREATE INDEX IF NOT EXISTS ackwise_messages_receivable
    ON ackwise_messages (queue, available_at) WHERE state < {DEAD};
CREATE INDEX IF NOT EXISTS ackwise_messages_dead
    ON ackwise_messages (queue, dead_at) WHERE state = {DEAD};
{_URGENT_INDEX};
CREATE TABLE IF NOT EXISTS ackwise_queues (
    name        TEXT PRIMARY KEY,
    declared_at REAL NOT NULL
) WITHOUT ROWID
"""
#: What turns each older schema version into the next one.
_UPGRADES = {
    1: [
        "ALTER TABLE ackwise_messages ADD COLUMN priority INTEGER NOT NULL DEFAULT 0",
        _URGENT_INDEX,
    ],
}


def _set_up_schema(db: sqlite3.Connection) -> None:
    """Create the tables of a new file, upgrade those of an older ackwise; refuse a file of a
    newer one.  The version is read again under the write lock: another process may have
    done it meanwhile."""
    if db.execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION:
        return
    db.execute("BEGIN IMMEDIATE")
    try:
        version = db.execute("PRAGMA user_version").fetchone()[0]
        if version > SCHEMA_VERSION:
            path = db.execute("PRAGMA database_list").fetchone()[2]
            raise PermanentAdapterError(
                f"SQLite database {path!r} has ackwise schema version {version}; this "
                f"ackwise knows version {SCHEMA_VERSION}: upgrade ackwise"
            )
        if version == 0:
            statements = [s for s in _SCHEMA.split(";") if s.strip()]
        else:
            statements = [s for v in range(version, SCHEMA_VERSION) for s in _UPGRADES[v]]
        for statement in statements:
            db.execute(statement)
        db.execute(f"PRAGMA user_version = {SCHEMA_VERSION}")
        db.execute("COMMIT")
    except BaseException:
        db.rollback()
        raise


# Every query that should use the partial index repeats its condition (``state < 2``)
# literally: SQLite only uses a partial index when the WHERE clause names its condition.
_SQL_RECEIVE = f"""
UPDATE ackwise_messages
   SET state = {IN_FLIGHT}, available_at = ?, token = ?, deliveries = deliveries + 1
 WHERE seq IN (SELECT seq FROM ackwise_messages
                WHERE queue = ? AND state < {DEAD} AND available_at <= ?
                ORDER BY available_at, seq LIMIT ?)
RETURNING seq, id, body, deliveries, reason, priority
"""
# Run first, when _SQL_ANY_URGENT finds one: rows of priority > 0, highest first (what it
# leaves, _SQL_RECEIVE takes).  The probe is a read of the partial index: about 4 us when it
# is empty, where an UPDATE that changes nothing costs about 15 us more.
_SQL_ANY_URGENT = f"""
SELECT 1 FROM ackwise_messages
 WHERE queue = ? AND state < {DEAD} AND priority > 0 AND available_at <= ? LIMIT 1
"""
_SQL_RECEIVE_URGENT = f"""
UPDATE ackwise_messages
   SET state = {IN_FLIGHT}, available_at = ?, token = ?, deliveries = deliveries + 1
 WHERE seq IN (SELECT seq FROM ackwise_messages
                WHERE queue = ? AND state < {DEAD} AND priority > 0 AND available_at <= ?
                ORDER BY priority DESC, available_at, seq LIMIT ?)
RETURNING seq, id, body, deliveries, reason, priority
"""
#: Due times past this (about 285 million years away) are no time at all: an infinity, or a
#: TEXT or BLOB value (SQLite sorts them after every number).  Such rows would never be due.
_NEVER = 9e15
# An index range seek: costs next to nothing when there is no such row.
_SQL_UNREACHABLE = f"""
UPDATE ackwise_messages
   SET available_at = ?,
       reason = 'available_at was ' || typeof(available_at) || ' ' || quote(available_at)
 WHERE seq IN (SELECT seq FROM ackwise_messages
                WHERE queue = ? AND state < {DEAD} AND available_at > {_NEVER} LIMIT 100)
"""
# A full scan of the queue's rows: run when a queue is declared (a worker starts).
_SQL_STRAY_STATES = f"""
UPDATE ackwise_messages
   SET state = {READY}, available_at = ?, reason = 'state was ' || quote(state)
 WHERE queue = ? AND state NOT IN ({READY}, {IN_FLIGHT}, {DEAD})
"""
_SQL_NEXT_DUE = f"SELECT min(available_at) FROM ackwise_messages WHERE queue = ? AND state < {DEAD}"
_SQL_PUBLISH = (
    "INSERT INTO ackwise_messages (queue, id, body, state, available_at, enqueued_at, priority) "
    f"VALUES (?, ?, ?, {READY}, ?, ?, ?)"
)
_SQL_PUBLISH_DEAD = (
    "INSERT INTO ackwise_messages "
    "(queue, id, body, state, available_at, enqueued_at, reason, dead_at, priority) "
    f"VALUES (?, ?, ?, {DEAD}, ?, ?, ?, ?, ?)"
)
_SQL_DECLARE = "INSERT OR IGNORE INTO ackwise_queues (name, declared_at) VALUES (?, ?)"
_SQL_NACK = f"""
UPDATE ackwise_messages SET state = {READY}, available_at = ?, token = NULL
 WHERE seq = ? AND token = ? AND state = {IN_FLIGHT}
RETURNING seq
"""
_SQL_DEAD_LETTER = f"""
UPDATE ackwise_messages
   SET state = {DEAD}, reason = ?, dead_at = ?, body = coalesce(?, body), token = NULL,
       id = coalesce(?, id)
 WHERE seq = ? AND token = ? AND state = {IN_FLIGHT}
RETURNING seq
"""
_SQL_STATS = f"""
SELECT count(*) FILTER (WHERE available_at <= :now),
       count(*) FILTER (WHERE state = {READY} AND available_at > :now),
       count(*) FILTER (WHERE state = {IN_FLIGHT} AND available_at > :now),
       min(enqueued_at) FILTER (WHERE available_at <= :now),
       (SELECT count(*) FROM ackwise_messages WHERE queue = :queue AND state = {DEAD})
  FROM ackwise_messages
 WHERE queue = :queue AND state < {DEAD}
"""
_SQL_DEAD_LETTERS = f"""
SELECT seq, id, body, reason, dead_at, deliveries FROM ackwise_messages
 WHERE queue = ? AND state = {DEAD}
 ORDER BY dead_at, seq LIMIT ?
"""
_SQL_PURGE = f"DELETE FROM ackwise_messages WHERE queue = ? AND state < {DEAD} AND state = {READY}"
_SQL_QUEUES = "SELECT name FROM ackwise_queues ORDER BY name"


def _pairs(n: int) -> str:
    return "(SELECT column1, column2 FROM (VALUES " + ",".join(["(?,?)"] * n) + "))"


# Batches are padded to a power of two with (0, 0) pairs that match no row (seq starts at 1,
# tokens are never 0), so only a handful of distinct statements are ever prepared.
_SIZES = tuple(1 << i for i in range(_CHUNK.bit_length()))
_SQL_ACK = {
    n: f"DELETE FROM ackwise_messages WHERE state = {IN_FLIGHT} AND (seq, token) IN {_pairs(n)} "
    "RETURNING seq, token"
    for n in _SIZES
}
_SQL_EXTEND = {
    n: f"UPDATE ackwise_messages SET available_at = ? "
    f"WHERE state = {IN_FLIGHT} AND (seq, token) IN {_pairs(n)} RETURNING seq, token"
    for n in _SIZES
}


def _padded(deliveries: Sequence[Delivery], size: int) -> list[int]:
    params: list[int] = []
    for d in deliveries:
        seq, token = d.receipt
        params.append(seq)
        params.append(token)
    params.extend([0] * (2 * (size - len(deliveries))))
    return params


def _size_for(n: int) -> int:
    return 1 << (n - 1).bit_length() if n > 1 else 1


def _chunks(deliveries: Sequence[Delivery]) -> Iterator[Sequence[Delivery]]:
    for i in range(0, len(deliveries), _CHUNK):
        yield deliveries[i : i + _CHUNK]


# -- rows ackwise did not write -------------------------------------------------------------
def _as_bytes(value: object) -> bytes:
    """A column's value as the bytes that stand for it (TEXT as UTF-8, a number as text)."""
    if isinstance(value, bytes):
        return value
    if isinstance(value, str):
        return value.encode("utf-8", "surrogateescape")
    return b"" if value is None else repr(value).encode()


def _corrupt(
    queue: str,
    seq: int,
    token: int,
    deadline: float,
    id_: object,
    body: object,
    deliveries: object,
    mark: object,
) -> Delivery:
    if mark is not None:
        problem = str(mark)
    elif type(body) is not bytes:
        problem = f"body is {_sql_type(body)}, not BLOB"
    elif type(id_) is not str:
        problem = f"id is {_sql_type(id_)}, not TEXT"
    else:
        problem = f"delivery count is {_sql_type(deliveries)} {deliveries!r}, not INTEGER"
    attempt = deliveries if type(deliveries) is int and deliveries >= 1 else 1
    return Delivery(
        queue,
        id_ if type(id_) is str else f"corrupt-{seq}",
        _as_bytes(body),
        (seq, token),
        attempt,
        deadline,
        corrupt=f"row {seq} of ackwise_messages: {problem}",
    )


def _sql_type(value: object) -> str:
    return {bytes: "BLOB", str: "TEXT", int: "INTEGER", float: "REAL"}.get(type(value), "NULL")


def _dead_letter_of(
    queue: str, seq: int, id_: object, body: object, reason: object, dead_at: object, n: object
) -> DeadLetter:
    """A dead row as a :class:`DeadLetter`, whatever its columns hold."""
    return DeadLetter(
        queue,
        id_ if isinstance(id_, str) else f"corrupt-{seq}",
        _as_bytes(body),
        reason if isinstance(reason, str) else "unknown",
        float(dead_at) if isinstance(dead_at, int | float) else 0.0,
        n if isinstance(n, int) else 0,
    )


# -- adapter -------------------------------------------------------------------------------
class SQLiteAdapter(Adapter):
    """Adapter for a SQLite database file shared by every worker process on one host.

    Durability: the database runs in WAL mode.  With ``synchronous=normal`` (the default)
    every committed operation survives a crash of any process, but not a power loss or an OS
    crash (the last commits may be rolled back); use ``synchronous=full`` for that.
    Do not put the file on a network file system: WAL needs shared memory on one host.
    """

    name = "sqlite"
    # Everything natively (the defaults: unbounded delays, per-message leases, exact counts),
    # but rows larger than MAX_MESSAGE_SIZE.
    capabilities = Capabilities(
        max_message_size=MAX_MESSAGE_SIZE, priorities=True, deep_prefetch=True
    )

    def __init__(self, url: BrokerURL) -> None:
        super().__init__(url)
        self._file = SQLiteFile(url, what="SQLite database", setup=_set_up_schema)
        self.path = self._file.path
        self._known_queues: set[str] = set()

    def __repr__(self) -> str:
        return f"<SQLiteAdapter {self.path}>"

    # -- lifecycle -------------------------------------------------------------------------
    def open(self) -> None:
        if self._file.is_open:
            return
        self._file.open()
        self._known_queues = set()

    def close(self) -> None:
        self._file.close()

    def _conn(self) -> sqlite3.Connection:
        if not self._file.is_open:
            self.open()
        return self._file.open()

    def _write(self) -> AbstractContextManager[sqlite3.Connection]:
        """One ``BEGIN IMMEDIATE`` transaction; errors mapped, rolled back on failure."""
        if not self._file.is_open:
            self.open()
        return self._file.write()

    # -- topology --------------------------------------------------------------------------
    def declare(self, queue: QueueSpec) -> None:
        with self._write() as db:
            now = time.time()
            db.execute(_SQL_DECLARE, (queue.name, now))
            stray = db.execute(_SQL_STRAY_STATES, (now, queue.name)).rowcount
        if stray:
            log.warning(
                "queue %s: %d row(s) with a state ackwise never writes; they are delivered as "
                "corrupt records (dead-lettered corrupt_record)",
                queue.name,
                stray,
            )
        self._known_queues.add(queue.name)

    def _remember_queue(self, db: sqlite3.Connection, queue: str, now: float) -> None:
        if queue not in self._known_queues:
            db.execute(_SQL_DECLARE, (queue, now))
            self._known_queues.add(queue)

    # -- producing -------------------------------------------------------------------------
    def publish(self, queue: str, messages: Sequence[Outgoing]) -> None:
        if not messages:
            return
        now = time.time()
        self.check_priorities(messages)
        rows: list[tuple[Any, ...]] = []
        for m in messages:
            if len(m.body) > MAX_MESSAGE_SIZE:
                raise MessageTooLarge(
                    f"message {m.id}: {len(m.body)} bytes exceeds the SQLite broker's limit of "
                    f"{MAX_MESSAGE_SIZE}; nothing was published"
                )
            delay = m.delay if m.delay > 0 else 0.0
            if delay:
                self.check_delay(delay)
            rows.append((queue, m.id, m.body, now + delay, now, m.priority))
        with self._write() as db:
            self._remember_queue(db, queue, now)
            db.executemany(_SQL_PUBLISH, rows)

    def publish_dead(self, queue: str, messages: Sequence[Outgoing], *, reason: str) -> None:
        if not messages:
            return
        now = time.time()
        self.check_priorities(messages)
        rows = [(queue, m.id, m.body, now, now, reason, now, m.priority) for m in messages]
        with self._write() as db:
            self._remember_queue(db, queue, now)
            db.executemany(_SQL_PUBLISH_DEAD, rows)

    # -- consuming -------------------------------------------------------------------------
    def _take(self, queue: str, max_messages: int, lease: float) -> list[Delivery]:
        token = secrets.randbits(63) or 1
        with self._write() as db:
            now = time.time()
            deadline = now + lease
            db.execute(_SQL_UNREACHABLE, (now, queue))
            params = [deadline, token, queue, now, max_messages]
            rows = []
            if db.execute(_SQL_ANY_URGENT, (queue, now)).fetchone() is not None:
                rows = db.execute(_SQL_RECEIVE_URGENT, params).fetchall()
            if len(rows) < max_messages:
                params[-1] = max_messages - len(rows)
                rows += db.execute(_SQL_RECEIVE, params).fetchall()
        # RETURNING order is unspecified: highest priority first, then seq (publication).
        rows.sort(key=lambda row: (-row[5] if type(row[5]) is int else 0, row[0]))
        out = []
        for seq, id_, body, deliveries, mark, _ in rows:
            if (
                mark is None
                and type(id_) is str
                and type(body) is bytes
                and type(deliveries) is int
            ):
                out.append(Delivery(queue, id_, body, (seq, token), deliveries, deadline))
            else:
                out.append(_corrupt(queue, seq, token, deadline, id_, body, deliveries, mark))
        return out

    def _next_due(self, queue: str) -> float | None:
        db = self._conn()
        with map_sqlite_errors(self.path):
            due: object = db.execute(_SQL_NEXT_DUE, (queue,)).fetchone()[0]
        if due is None or (isinstance(due, int | float) and due <= _NEVER):
            return due
        return 0.0  # a row that can never be due: take it now, as a corrupt record

    def receive(
        self, queue: str, *, max_messages: int, wait: float, lease: float
    ) -> Sequence[Delivery]:
        if max_messages < 1:
            return []
        out = self._take(queue, max_messages, lease)
        if out or wait <= 0:
            return out
        end = time.monotonic() + wait
        pause = 0.002
        while True:
            remaining = end - time.monotonic()
            if remaining <= 0:
                return []
            # Poll with a read (no write lock) and take only when something is due.
            due = self._next_due(queue)
            now = time.time()
            if due is not None and due <= now:
                out = self._take(queue, max_messages, lease)
                if out:
                    return out
            sleep = min(pause, remaining)
            if due is not None and due > now:
                sleep = min(sleep, due - now)
            time.sleep(max(sleep, 0.0005))
            pause = min(pause * 2, 0.05)

    def _settle_batch(
        self,
        statements: dict[int, str],
        deliveries: Sequence[Delivery],
        prefix: tuple[Any, ...],
        operation: str,
    ) -> None:
        if not deliveries:
            return
        done: set[tuple[int, int]] = set()
        with self._write() as db:
            for chunk in _chunks(deliveries):
                size = _size_for(len(chunk))
                params = [*prefix, *_padded(chunk, size)]
                done.update(db.execute(statements[size], params).fetchall())
        if len(done) < len(deliveries):
            stale = [d for d in deliveries if tuple(d.receipt) not in done]
            if stale:
                raise StaleReceipt(stale, operation)

    def ack(self, deliveries: Sequence[Delivery]) -> None:
        self._settle_batch(_SQL_ACK, deliveries, (), "ack")

    def extend(self, deliveries: Sequence[Delivery], *, lease: float) -> None:
        self._settle_batch(_SQL_EXTEND, deliveries, (time.time() + lease,), "extend")

    def nack(self, delivery: Delivery, *, delay: float = 0.0) -> None:
        delay = delay if delay > 0 else 0.0
        if delay:
            self.check_delay(delay)
        seq, token = delivery.receipt
        with self._write() as db:
            row = db.execute(_SQL_NACK, (time.time() + delay, seq, token)).fetchone()
        if row is None:
            raise StaleReceipt([delivery], "nack")

    def dead_letter(self, delivery: Delivery, *, reason: str, body: bytes | None = None) -> None:
        seq, token = delivery.receipt
        # A corrupt row keeps what it holds, but an id that is not TEXT becomes the stand-in
        # it was delivered under, so that `ackwise dlq` can name it.
        new_id = delivery.message_id if delivery.corrupt is not None else None
        with self._write() as db:
            row = db.execute(
                _SQL_DEAD_LETTER, (reason, time.time(), body, new_id, seq, token)
            ).fetchone()
        if row is None:
            raise StaleReceipt([delivery], "dead_letter")

    # -- inspection ------------------------------------------------------------------------
    def stats(self, queue: str) -> QueueStats:
        db = self._conn()
        now = time.time()
        with map_sqlite_errors(self.path):
            ready, delayed, in_flight, oldest, dead = db.execute(
                _SQL_STATS, {"now": now, "queue": queue}
            ).fetchone()
        if not isinstance(oldest, int | float):  # a row ackwise did not write
            oldest = None
        return QueueStats(
            queue,
            ready=ready,
            delayed=delayed,
            in_flight=in_flight,
            dead=dead,
            oldest_age=max(0.0, now - oldest) if oldest is not None else 0.0,
        )

    def dead_letters(self, queue: str, *, limit: int = 100) -> Sequence[DeadLetter]:
        db = self._conn()
        with map_sqlite_errors(self.path):
            rows = db.execute(_SQL_DEAD_LETTERS, (queue, limit)).fetchall()
        return [_dead_letter_of(queue, *row) for row in rows]

    def requeue_dead(self, queue: str, message_ids: Sequence[str]) -> int:
        if not message_ids:
            return 0
        now = time.time()
        moved = 0
        with self._write() as db:
            for start in range(0, len(message_ids), 500):
                chunk = list(message_ids[start : start + 500])
                marks = ",".join("?" * len(chunk))
                moved += db.execute(
                    f"UPDATE ackwise_messages SET state = {READY}, available_at = ?, "
                    "deliveries = 0, token = NULL, reason = NULL, dead_at = NULL, "
                    f"enqueued_at = ? WHERE queue = ? AND state = {DEAD} AND id IN ({marks})",
                    (now, now, queue, *chunk),
                ).rowcount
        return moved

    def delete_dead(self, queue: str, message_ids: Sequence[str] | None = None) -> int:
        deleted = 0
        with self._write() as db:
            if message_ids is None:
                return int(
                    db.execute(
                        f"DELETE FROM ackwise_messages WHERE queue = ? AND state = {DEAD}",
                        (queue,),
                    ).rowcount
                )
            ids = list(message_ids)
            for start in range(0, len(ids), 500):
                chunk = ids[start : start + 500]
                marks = ",".join("?" * len(chunk))
                deleted += db.execute(
                    f"DELETE FROM ackwise_messages WHERE queue = ? AND state = {DEAD} "
                    f"AND id IN ({marks})",
                    (queue, *chunk),
                ).rowcount
        return deleted

    def purge(self, queue: str) -> int:
        with self._write() as db:
            count: int = db.execute(_SQL_PURGE, (queue,)).rowcount
        return count

    def delete_queue(self, queue: str) -> None:
        with self._write() as db:
            db.execute("DELETE FROM ackwise_messages WHERE queue = ?", (queue,))
            db.execute("DELETE FROM ackwise_queues WHERE name = ?", (queue,))
        self._known_queues.discard(queue)

    def queues(self) -> Sequence[str]:
        db = self._conn()
        with map_sqlite_errors(self.path):
            return [name for (name,) in db.execute(_SQL_QUEUES)]
