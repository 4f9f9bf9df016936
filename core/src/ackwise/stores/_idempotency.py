"""Idempotency keys (docs/idempotency.md): a redelivered or duplicated message has one effect.

A task declared with ``idempotency_key=callable`` (or a message carrying the header
``idempotency_key``, as beat's fenced fires do) is claimed in a store before it runs:

``DONE``  the key completed before: the message is acked without running;
``BUSY``  a live execution holds it: the message is offered again after the holder's lease;
``RUN``   new, or its holder died (the lease ran out): this execution takes it.

Claims are held with a lease that the worker renews with the delivery's own lease, so a key
whose holder crashed is taken over after one lease, and a long task keeps its key.
"""

from __future__ import annotations

import abc
import enum
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import ClassVar

from ackwise.backends.postgresql._link import PgStoreLink
from ackwise.backends.sqlite._file import SQLiteStore
from ackwise.contract._spi import BrokerURL

__all__ = [
    "ClaimResult",
    "IdempotencyStore",
    "KeyState",
    "MemoryIdempotencyStore",
    "PostgresIdempotencyStore",
    "SQLiteIdempotencyStore",
]

#: How long a completed key is remembered (seconds) unless the store is told otherwise.
DONE_TTL = 7 * 24 * 3600.0


class KeyState(enum.Enum):
    """What a claim of an idempotency key found: ``RUN`` (the caller holds it now: run the
    task), ``DONE`` (an earlier run finished: skip it) or ``BUSY`` (another holder's lease
    is live: try again later)."""

    RUN = "run"
    DONE = "done"
    BUSY = "busy"


@dataclass(frozen=True, slots=True)
class ClaimResult:
    """The answer to :meth:`IdempotencyStore.claim`."""

    state: KeyState
    #: For BUSY: seconds until the holder's lease runs out.
    retry_after: float = 0.0


class IdempotencyStore(abc.ABC):
    """Where idempotency keys live.  Called from the worker's consumer thread only."""

    scheme: ClassVar[str] = "?"

    def __init__(self, url: BrokerURL, *, done_ttl: float = DONE_TTL) -> None:
        self.url = url
        self.done_ttl = done_ttl

    @abc.abstractmethod
    def open(self) -> None:
        """Connect to the store (called once, before any other method)."""

    @abc.abstractmethod
    def close(self) -> None:
        """Release the store's connections; safe to call twice."""

    @abc.abstractmethod
    def claim(self, key: str, holder: str, lease: float) -> ClaimResult:
        """Atomically: take ``key`` for ``holder`` for ``lease`` seconds, or say why not."""

    @abc.abstractmethod
    def extend(self, claims: Sequence[tuple[str, str]], lease: float) -> None:
        """Move the lease of each (key, holder) that still holds its key."""

    @abc.abstractmethod
    def complete(self, key: str, holder: str) -> None:
        """Mark ``key`` done: later claims answer DONE (for ``done_ttl`` seconds)."""

    @abc.abstractmethod
    def release(self, key: str, holder: str) -> None:
        """Give ``key`` up (the execution failed): the next claim may run it."""

    def forget(self, keys: Sequence[str]) -> None:  # noqa: B027 - optional, see below
        """Delete ``keys`` whatever their state (a test run cleaning up after itself).

        Optional: a store that cannot delete keys leaves them to expire (``done_ttl``).
        """


# -- memory -------------------------------------------------------------------------------------
class _MemoryState:
    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.keys: dict[str, tuple[str, str | None, float]] = {}  # key -> (status, holder, until)


_memory: dict[str, _MemoryState] = {}
_memory_lock = threading.Lock()


class MemoryIdempotencyStore(IdempotencyStore):
    """In-process store for ``memory://`` apps (shared by every store of the same name)."""

    scheme = "memory"

    def open(self) -> None:
        name = self.url.in_process_name
        with _memory_lock:
            self._state = _memory.setdefault(name, _MemoryState())

    def close(self) -> None:
        pass

    def claim(self, key: str, holder: str, lease: float) -> ClaimResult:
        now = time.time()
        with self._state.lock:
            current = self._state.keys.get(key)
            if current is not None:
                status, _, until = current
                if status == "done" and until > now:
                    return ClaimResult(KeyState.DONE)
                if status == "running" and until > now:
                    return ClaimResult(KeyState.BUSY, until - now)
            self._state.keys[key] = ("running", holder, now + lease)
            return ClaimResult(KeyState.RUN)

    def extend(self, claims: Sequence[tuple[str, str]], lease: float) -> None:
        until = time.time() + lease
        with self._state.lock:
            for key, holder in claims:
                current = self._state.keys.get(key)
                if current and current[0] == "running" and current[1] == holder:
                    self._state.keys[key] = ("running", holder, until)

    def complete(self, key: str, holder: str) -> None:
        with self._state.lock:
            self._state.keys[key] = ("done", None, time.time() + self.done_ttl)

    def release(self, key: str, holder: str) -> None:
        with self._state.lock:
            current = self._state.keys.get(key)
            if current and current[0] == "running" and current[1] == holder:
                del self._state.keys[key]

    def forget(self, keys: Sequence[str]) -> None:
        with self._state.lock:
            for key in keys:
                self._state.keys.pop(key, None)


# -- SQLite -------------------------------------------------------------------------------------
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


# -- PostgreSQL ---------------------------------------------------------------------------------
_PG_SCHEMA = """
CREATE TABLE IF NOT EXISTS ackwise_idempotency (
    key    text PRIMARY KEY,
    status text NOT NULL CHECK (status IN ('running', 'done')),
    holder text,
    until  double precision NOT NULL
)
"""


class PostgresIdempotencyStore(IdempotencyStore):
    """Keys in PostgreSQL (``postgresql://user@host/db``; needs ``psycopg``).

    The claim is one statement: ``INSERT … ON CONFLICT (key) DO UPDATE … WHERE`` the old
    claim's lease ran out, ``RETURNING`` the holder — the database serializes racing claims.
    """

    scheme = "postgresql"

    def __init__(self, url: BrokerURL, *, done_ttl: float = DONE_TTL) -> None:
        super().__init__(url, done_ttl=done_ttl)
        self._link = PgStoreLink(url, "idempotency store", [_PG_SCHEMA])
        self._exec = self._link.execute

    def open(self) -> None:
        self._link.open()

    def close(self) -> None:
        self._link.close()

    def claim(self, key: str, holder: str, lease: float) -> ClaimResult:
        now = time.time()
        row = self._exec(
            "INSERT INTO ackwise_idempotency AS k (key, status, holder, until) "
            "VALUES (%s, 'running', %s, %s) ON CONFLICT (key) DO UPDATE SET "
            "status = 'running', holder = excluded.holder, until = excluded.until "
            "WHERE k.until <= %s RETURNING holder",
            (key, holder, now + lease, now),
        ).fetchone()
        if row is not None and row[0] == holder:
            return ClaimResult(KeyState.RUN)
        row = self._exec(
            "SELECT status, until FROM ackwise_idempotency WHERE key = %s", (key,)
        ).fetchone()
        if row is None:  # deleted between the two statements: try again once
            return self.claim(key, holder, lease)
        if row[0] == "done":
            return ClaimResult(KeyState.DONE)
        return ClaimResult(KeyState.BUSY, max(0.0, row[1] - now))

    def extend(self, claims: Sequence[tuple[str, str]], lease: float) -> None:
        until = time.time() + lease
        for key, holder in claims:
            self._exec(
                "UPDATE ackwise_idempotency SET until = %s "
                "WHERE key = %s AND holder = %s AND status = 'running'",
                (until, key, holder),
            )

    def complete(self, key: str, holder: str) -> None:
        self._exec(
            "UPDATE ackwise_idempotency SET status = 'done', holder = NULL, until = %s "
            "WHERE key = %s",
            (time.time() + self.done_ttl, key),
        )

    def release(self, key: str, holder: str) -> None:
        self._exec(
            "DELETE FROM ackwise_idempotency WHERE key = %s AND holder = %s AND status = 'running'",
            (key, holder),
        )

    def forget(self, keys: Sequence[str]) -> None:
        for key in keys:
            self._exec("DELETE FROM ackwise_idempotency WHERE key = %s", (key,))
