"""Task results (docs/results.md): what a task returned, or why it did not, kept for a while.

A task with ``store_results`` has one record per message id in the app's result store:

``started``    it began (``track_started``); replaced by what follows;
``succeeded``  it returned (the value, JSON); written once: never replaced, so a redelivered
               execution (its first run's ack lost to a crash) cannot change a stored success;
``failed``     it raised and was dead-lettered ``failed``;
``dead``       it was dead-lettered for another reason (``max_deliveries``, ``worker_lost``…)
               or lost (``Ack.EARLY``); a later run (a replayed dead letter) replaces it.

The worker writes a success before its ack, so a crash in between runs the task again and
keeps the first value.  Records expire after the store's TTL.
"""

from __future__ import annotations

import abc
import contextlib
import enum
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from typing import Any, ClassVar

import msgspec

from ackwise.backends.postgresql._link import create_tables
from ackwise.backends.sqlite._file import SQLiteStore
from ackwise.contract._spi import BrokerURL
from ackwise.errors import (
    BrokerUnavailable,
    ConfigurationError,
    PermanentAdapterError,
    TransientAdapterError,
)

__all__ = [
    "FINAL",
    "RESULT_TTL",
    "MemoryResultStore",
    "PostgresResultStore",
    "ResultState",
    "ResultStore",
    "SQLiteResultStore",
    "TaskResult",
]

#: How long a record is kept (seconds) unless the app says otherwise (``result_ttl``).
RESULT_TTL = 24 * 3600.0


class ResultState(enum.Enum):
    """Where a task's result stands: ``PENDING`` (nothing recorded yet), ``STARTED`` (with
    ``track_started``), ``SUCCEEDED``, ``FAILED`` (raised) or ``DEAD`` (dead-lettered)."""

    PENDING = "pending"
    STARTED = "started"
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    DEAD = "dead"


#: States after which the message is settled (a dead one may still be replayed).
FINAL = frozenset({ResultState.SUCCEEDED, ResultState.FAILED, ResultState.DEAD})


class TaskResult(msgspec.Struct, frozen=True, omit_defaults=True, kw_only=True):
    """One message's record.  ``value`` is the return value as JSON text (``succeeded``)."""

    id: str
    state: str
    task: str | None = None
    value: str | None = None
    error: str | None = None
    traceback: str | None = None
    #: ``dead``: the dead-letter reason.
    reason: str | None = None
    attempt: int = 0
    at: float = 0.0

    @property
    def status(self) -> ResultState:
        return ResultState(self.state)

    @property
    def final(self) -> bool:
        """Succeeded, failed or dead."""
        return self.status in FINAL

    def replaces(self, old: TaskResult | None) -> bool:
        """Whether this record may overwrite ``old``: a success never; a final state not by
        ``started``."""
        if old is None:
            return True
        if old.status is ResultState.SUCCEEDED:
            return False
        return not (self.status is ResultState.STARTED and old.status in FINAL)

    def to_json(self) -> bytes:
        """The record as stored: JSON bytes."""
        return _ENCODER.encode(self)

    @classmethod
    def from_json(cls, raw: bytes | str) -> TaskResult:
        """A record from what :meth:`to_json` stored."""
        return _DECODER.decode(raw)


_ENCODER = msgspec.json.Encoder()
_DECODER = msgspec.json.Decoder(TaskResult)


class ResultStore(abc.ABC):
    """Where task results live.  The worker writes from its loop thread; handles read from
    any thread of the producer (an implementation guards its connection)."""

    scheme: ClassVar[str] = "?"

    def __init__(self, url: BrokerURL, *, ttl: float = RESULT_TTL) -> None:
        self.url = url
        self.ttl = ttl

    @classmethod
    def namespace_options(cls, url: BrokerURL, namespace: str) -> dict[str, str]:
        """URL options under which this store keeps its records apart, under ``namespace``,
        from those of the store at ``url`` (default: none, the store has no namespaces).

        The conformance suite adds them to the URL of a run's result store, so that the run's
        records are named with its prefix (Redis: the key prefix).
        """
        return {}

    @abc.abstractmethod
    def open(self) -> None:
        """Connect to the store (called once, before any other method)."""

    @abc.abstractmethod
    def close(self) -> None:
        """Release the store's connections; safe to call twice."""

    @abc.abstractmethod
    def put(self, records: Sequence[TaskResult]) -> None:
        """Store each record where :meth:`TaskResult.replaces` lets it, atomically per record."""

    @abc.abstractmethod
    def get(self, message_id: str) -> TaskResult | None:
        """The record of ``message_id``, or ``None`` (none yet, or expired)."""

    @abc.abstractmethod
    def forget(self, message_ids: Sequence[str]) -> None:
        """Delete these records (and chord counts of these ids) now."""

    @abc.abstractmethod
    def join(self, chord_id: str, member: int) -> int:
        """Count ``member`` as finished in the chord ``chord_id`` (once, however often it is
        said); return how many distinct members have finished.  Kept for the store's TTL."""

    def wait(self, message_id: str, timeout: float | None) -> TaskResult | None:
        """Wait until the record is final, at most ``timeout`` seconds (``None``: for ever);
        return it, or the latest record (``None`` if there is none) at the timeout.

        Reads, then pauses as :meth:`_listening` says, until then.
        """
        deadline = None if timeout is None else time.monotonic() + timeout
        with self._listening(message_id) as pause:
            while True:
                record = self.get(message_id)
                if record is not None and record.final:
                    return record
                left = None if deadline is None else deadline - time.monotonic()
                if left is not None and left <= 0:
                    return record
                pause(left)

    @contextlib.contextmanager
    def _listening(self, message_id: str) -> Iterator[Callable[[float | None], None]]:
        """Entered before :meth:`wait`'s first read; yields how to pause until the record
        may have changed (at most the time left, ``None``: no limit).

        This default polls, from every 5 ms up to every 0.2 s; stores that can be told of a
        write (Redis pub/sub, PostgreSQL LISTEN) subscribe here and wait for it instead.
        """
        step = 0.005

        def pause(left: float | None) -> None:
            nonlocal step
            time.sleep(step if left is None else min(step, left))
            step = min(step * 2, 0.2)

        yield pause


# -- in-process ----------------------------------------------------------------------------
class _MemoryState:
    def __init__(self) -> None:
        self.changed = threading.Condition()
        self.records: dict[str, tuple[TaskResult, float]] = {}  # id -> (record, expires)
        self.chords: dict[str, set[int]] = {}


_memory: dict[str, _MemoryState] = {}
_memory_lock = threading.Lock()


class MemoryResultStore(ResultStore):
    """In-process store for ``memory://`` apps (shared by every store of the same name)."""

    scheme = "memory"

    def open(self) -> None:
        name = self.url.in_process_name
        with _memory_lock:
            self._state = _memory.setdefault(name, _MemoryState())

    def close(self) -> None:
        pass

    def put(self, records: Sequence[TaskResult]) -> None:
        expires = time.time() + self.ttl
        with self._state.changed:
            for r in records:
                if r.replaces(self._current(r.id)):
                    self._state.records[r.id] = (r, expires)
            self._state.changed.notify_all()

    def get(self, message_id: str) -> TaskResult | None:
        with self._state.changed:
            return self._current(message_id)

    def forget(self, message_ids: Sequence[str]) -> None:
        with self._state.changed:
            for mid in message_ids:
                self._state.records.pop(mid, None)
                self._state.chords.pop(mid, None)

    def join(self, chord_id: str, member: int) -> int:
        with self._state.changed:
            members = self._state.chords.setdefault(chord_id, set())
            members.add(member)
            return len(members)

    def _current(self, message_id: str) -> TaskResult | None:
        found = self._state.records.get(message_id)
        if found is None or found[1] <= time.time():
            return None
        return found[0]

    def wait(self, message_id: str, timeout: float | None) -> TaskResult | None:
        deadline = None if timeout is None else time.monotonic() + timeout
        with self._state.changed:
            while True:
                record = self._current(message_id)
                if record is not None and record.final:
                    return record
                left = None if deadline is None else deadline - time.monotonic()
                if left is not None and left <= 0:
                    return record
                self._state.changed.wait(left)


# -- SQLite --------------------------------------------------------------------------------
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


# -- PostgreSQL ----------------------------------------------------------------------------
_PG_SCHEMA = """
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
_PG_CHANNEL = "ackwise_results"

# The write-once rule of TaskResult.replaces, in one statement: the database serializes
# racing writers.
_PG_PUT = (
    "INSERT INTO ackwise_results AS r (id, state, record, expires) VALUES (%s, %s, %s, %s) "
    "ON CONFLICT (id) DO UPDATE SET state = excluded.state, record = excluded.record, "
    "expires = excluded.expires WHERE r.expires <= %s OR (r.state <> 'succeeded' AND NOT "
    "(excluded.state = 'started' AND r.state IN ('failed', 'dead'))) RETURNING id"
)


class PostgresResultStore(ResultStore):
    """Results in PostgreSQL (``postgresql://user@host/db``; needs ``psycopg``).

    ``wait`` LISTENs on a connection of its own and wakes on the write's NOTIFY.
    """

    scheme = "postgresql"

    def __init__(self, url: BrokerURL, *, ttl: float = RESULT_TTL) -> None:
        super().__init__(url, ttl=ttl)
        #: What psycopg connects with (a subclass may show another ``url``).
        self.conninfo = url.raw

    def open(self) -> None:
        try:
            import psycopg
        except ImportError as exc:
            raise ConfigurationError(
                "the PostgreSQL result store needs psycopg: pip install 'ackwise[postgresql]'"
            ) from exc
        self._psycopg: Any = psycopg
        self._lock = threading.Lock()  # one connection: one statement at a time
        self._conn: Any = self._connect()
        with self._lock:
            try:
                create_tables(self._conn, [s for s in _PG_SCHEMA.split(";") if s.strip()])
            except psycopg.Error as exc:
                raise BrokerUnavailable(f"result store {self.url}: {exc}") from exc

    def _connect(self) -> Any:
        try:
            return self._psycopg.connect(self.conninfo, autocommit=True)
        except self._psycopg.Error as exc:
            raise BrokerUnavailable(f"result store {self.url}: {exc}") from exc

    def close(self) -> None:
        conn, self._conn = getattr(self, "_conn", None), None
        if conn is not None:
            conn.close()

    def _exec(self, sql: str, params: Sequence[Any] | None, conn: Any = None) -> Any:
        try:
            return (conn or self._conn).execute(sql, params)
        except self._psycopg.OperationalError as exc:
            raise TransientAdapterError(f"result store {self.url}: {exc}") from exc
        except self._psycopg.Error as exc:
            raise PermanentAdapterError(f"result store {self.url}: {exc}") from exc

    def put(self, records: Sequence[TaskResult]) -> None:
        now = time.time()
        with self._lock:
            for r in records:
                row = self._exec(
                    _PG_PUT, (r.id, r.state, r.to_json().decode(), now + self.ttl, now)
                ).fetchone()
                if row is not None:
                    self._exec("SELECT pg_notify(%s, %s)", (_PG_CHANNEL, r.id))
            if now - getattr(self, "_swept", 0.0) >= _SWEEP_EVERY:
                self._swept = now
                self._exec("DELETE FROM ackwise_results WHERE expires <= %s", (now,))
                self._exec("DELETE FROM ackwise_chord_members WHERE expires <= %s", (now,))

    def get(self, message_id: str) -> TaskResult | None:
        with self._lock:
            row = self._exec(
                "SELECT record FROM ackwise_results WHERE id = %s AND expires > %s",
                (message_id, time.time()),
            ).fetchone()
        return TaskResult.from_json(row[0]) if row is not None else None

    def forget(self, message_ids: Sequence[str]) -> None:
        with self._lock:
            for mid in message_ids:
                self._exec("DELETE FROM ackwise_results WHERE id = %s", (mid,))
                self._exec("DELETE FROM ackwise_chord_members WHERE chord = %s", (mid,))

    def join(self, chord_id: str, member: int) -> int:
        with self._lock:
            self._exec(
                "INSERT INTO ackwise_chord_members (chord, member, expires) "
                "VALUES (%s, %s, %s) ON CONFLICT (chord, member) DO NOTHING",
                (chord_id, member, time.time() + self.ttl),
            )
            row = self._exec(
                "SELECT count(*) FROM ackwise_chord_members WHERE chord = %s", (chord_id,)
            ).fetchone()
        return int(row[0])

    @contextlib.contextmanager
    def _listening(self, message_id: str) -> Iterator[Callable[[float | None], None]]:
        listener = self._connect()
        try:
            self._exec(f"LISTEN {_PG_CHANNEL}", None, listener)

            def pause(left: float | None) -> None:
                # At most 1 s at a time: a missed notification costs a second, not the wait.
                step = 1.0 if left is None else min(left, 1.0)
                for note in listener.notifies(timeout=step, stop_after=1):
                    if note.payload == message_id:
                        break

            yield pause
        finally:
            listener.close()


def value_of(record: TaskResult) -> Any:
    """The return value of a ``succeeded`` record, decoded."""
    return msgspec.json.decode(record.value) if record.value is not None else None
