"""The leader lock of ``ackwise beat`` in PostgreSQL (``postgresql://``, ``postgres://``).

A lease in a row, not a PostgreSQL advisory lock.  A session advisory lock belongs to its
connection: a leader frozen by SIGSTOP, a GC pause or a stalled VM keeps its connection open,
so it would keep the lock for ever, and nobody could take over.  Here, as in the SQLite and
Redis stores, the holder's random token, a fencing number that rises with every acquisition
(and never goes back: a release empties the row, it does not delete it) and an expiry judged
by the database server's own clock (``clock_timestamp()``) live in a row of ``ackwise_locks``;
claimed fires, each with the fencing number of the holder that claimed it, in
``ackwise_fires`` (the two tables of the SQLite store, in the connection's schema, made on
first use, idempotently).

Every operation is **one statement**, so the row locks it takes live only while the server
runs it: a client frozen at any moment holds no lock of the database's.  Two acquirers of one
name are serialised by the row (``INSERT … ON CONFLICT DO UPDATE … WHERE`` the holder's expiry
passed: the second waits for the first's commit and sees its token), a claim holds the lock
row ``FOR SHARE`` while it records the fire, so no acquire can slip between its token check
and its insert.  The one advisory lock is transaction-scoped (``pg_advisory_xact_lock``,
released at commit): it serialises the tables' creation by processes starting together, sent
with it in one round trip.

:attr:`LeaderLock.timeout` (the beat sets a third of the TTL) bounds every statement on both
sides: the server's ``statement_timeout``, and on the client a watchdog that shuts the socket
down when no answer came in time, so a leader cut off from the database learns it that fast
(a connection attempt is bounded by libpq's ``connect_timeout``, at least 2 s).
"""

from __future__ import annotations

import contextlib
import math
import os
import socket
import threading
import time
from collections.abc import Mapping
from typing import Any

import psycopg

from ackwise.errors import (
    AdapterError,
    BrokerUnavailable,
    InvalidBrokerURL,
    TransientAdapterError,
)
from ackwise.spi import BrokerURL, Claim, LeaderLock, LockInfo, from_table
from ackwise_postgresql._link import ERRORS, detail
from ackwise_postgresql._sql import SCHEMA_LOCK

__all__ = ["KEEP_FIRES", "PostgresLeaderLock"]

#: How many claimed fires per schedule the store keeps (the newest), as ackwise's own stores.
KEEP_FIRES = 64

#: Sent as one simple query: one implicit transaction, under the schema lock, in one round trip.
_SCHEMA = f"""
SELECT pg_advisory_xact_lock({SCHEMA_LOCK});
CREATE TABLE IF NOT EXISTS ackwise_locks (
    name       text        PRIMARY KEY,
    token      text,
    fence      bigint      NOT NULL,
    expires_at timestamptz NOT NULL,
    owner      text
);
CREATE TABLE IF NOT EXISTS ackwise_fires (
    lock       text        NOT NULL,
    schedule   text        NOT NULL,
    fire_time  bigint      NOT NULL,
    fence      bigint      NOT NULL,
    claimed_at timestamptz NOT NULL,
    PRIMARY KEY (lock, schedule, fire_time)
);
"""

_EXPIRES = "clock_timestamp() + make_interval(secs => %(ttl)s)"

# A follower's usual answer (the lock is held) comes from the NOT EXISTS, without touching
# the row; when it looks free, ON CONFLICT locks the row and judges the newest version.
_ACQUIRE = f"""
INSERT INTO ackwise_locks AS l (name, token, fence, expires_at, owner)
SELECT %(name)s, %(token)s, 1, {_EXPIRES}, %(owner)s
 WHERE NOT EXISTS (SELECT FROM ackwise_locks
                    WHERE name = %(name)s AND token IS NOT NULL
                      AND expires_at > clock_timestamp())
ON CONFLICT (name) DO UPDATE
   SET token = excluded.token, fence = l.fence + 1, expires_at = {_EXPIRES},
       owner = excluded.owner
 WHERE l.token IS NULL OR l.expires_at <= clock_timestamp()
RETURNING fence
"""

_RENEW = f"""
UPDATE ackwise_locks SET expires_at = {_EXPIRES}
 WHERE name = %(name)s AND token = %(token)s AND expires_at > clock_timestamp()
"""

_RELEASE = """
UPDATE ackwise_locks SET token = NULL, expires_at = '-infinity', owner = NULL
 WHERE name = %(name)s AND token = %(token)s
"""

# The statement's snapshot does not see the row it inserts: the newest KEEP_FIRES are those
# of the table and the new one together.
_CLAIM = """
WITH holder AS (
    SELECT fence FROM ackwise_locks
     WHERE name = %(name)s AND token = %(token)s AND expires_at > clock_timestamp()
       FOR SHARE
), claimed AS (
    INSERT INTO ackwise_fires (lock, schedule, fire_time, fence, claimed_at)
    SELECT %(name)s, %(schedule)s, %(fire)s, fence, clock_timestamp() FROM holder
    ON CONFLICT DO NOTHING
    RETURNING fire_time
), pruned AS (
    DELETE FROM ackwise_fires
     WHERE lock = %(name)s AND schedule = %(schedule)s AND EXISTS (SELECT FROM claimed)
       AND fire_time < (SELECT min(fire_time) FROM (
               SELECT fire_time FROM ackwise_fires
                WHERE lock = %(name)s AND schedule = %(schedule)s
               UNION ALL SELECT fire_time FROM claimed
               ORDER BY fire_time DESC LIMIT %(keep)s) AS newest)
)
SELECT EXISTS (SELECT FROM holder), EXISTS (SELECT FROM claimed)
"""

_LAST_FIRES = """
SELECT schedule, max(fire_time) FROM ackwise_fires WHERE lock = %(name)s GROUP BY schedule
"""

_CLAIMED_BY = """
SELECT fence FROM ackwise_fires
 WHERE lock = %(name)s AND schedule = %(schedule)s AND fire_time = %(fire)s
"""

_INFO = """
SELECT owner, fence, extract(epoch FROM expires_at - clock_timestamp())::float8
  FROM ackwise_locks
 WHERE name = %(name)s AND token IS NOT NULL AND expires_at > clock_timestamp()
"""

_DELETE = """
WITH fires AS (DELETE FROM ackwise_fires WHERE lock = %(name)s)
DELETE FROM ackwise_locks WHERE name = %(name)s
"""


class _Watchdog:
    """Shut a connection's socket down when a statement overruns its time (one thread).

    The thread is started once and armed and disarmed around each statement, so a statement
    pays for no thread start (which waits for the scheduler on a busy host).  Firing and
    disarming take the same lock: once :meth:`disarm` returns, the socket is left alone.
    """

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._thread: threading.Thread | None = None
        self._fd: int | None = None
        self._deadline = 0.0
        self._fired = False
        self._closed = False

    def arm(self, fd: int, timeout: float) -> None:
        with self._cond:
            self._closed = False  # a thread told to stop but not yet gone goes on watching
            if self._thread is None:
                self._thread = threading.Thread(
                    target=self._watch, name="ackwise-pglock-watchdog", daemon=True
                )
                self._thread.start()
            self._fd, self._deadline, self._fired = fd, time.monotonic() + timeout, False
            self._cond.notify()

    def disarm(self) -> bool:
        """Stop watching; return whether the socket was shut down."""
        with self._cond:
            self._fd = None
            return self._fired

    def close(self) -> None:
        with self._cond:
            self._closed, self._fd = True, None
            self._cond.notify()

    def _watch(self) -> None:
        with self._cond:
            while not self._closed:
                if self._fd is None:
                    self._cond.wait()
                    continue
                left = self._deadline - time.monotonic()
                if left > 0:
                    self._cond.wait(left)
                    continue
                # On a duplicate of the descriptor: the connection's own stays open for its
                # owner to close.  A blocked call on it returns at once with an error.
                with contextlib.suppress(OSError), socket.socket(fileno=os.dup(self._fd)) as s:
                    s.shutdown(socket.SHUT_RDWR)
                self._fd, self._fired = None, True
            self._thread = None


class PostgresLeaderLock(LeaderLock):
    """A :class:`ackwise.LeaderLock` in PostgreSQL; see the module documentation.

    The URL is a libpq connection URI, as the PostgreSQL broker's: ``options=-csearch_path%3D
    myschema`` puts the tables in that schema, ``connect_timeout`` bounds a connection attempt
    (default: the lock's timeout, at least libpq's 2 s; else 10 s).  One connection per lock
    object, opened on first use and again after it broke.
    """

    def __init__(self, url: BrokerURL) -> None:
        super().__init__(url)
        if url.scheme not in ("postgresql", "postgres"):
            raise InvalidBrokerURL(f"lock URL {url}: scheme must be postgresql or postgres")
        self.where = f"PostgreSQL lock store {url}"
        self._conn: Any = None
        self._schema_ready = False
        self._mutex = threading.Lock()  # one connection: one statement at a time
        self._watchdog = _Watchdog()

    def __repr__(self) -> str:
        return f"<PostgresLeaderLock {self.url}>"

    # -- the connection ----------------------------------------------------------------------
    def _connect(self) -> Any:
        options: dict[str, Any] = {"autocommit": True}
        if "connect_timeout" not in self.url.query:
            timeout = self.timeout
            options["connect_timeout"] = 10 if timeout is None else max(2, math.ceil(timeout))
        try:
            conn = psycopg.connect(self.url.raw, **options)
        except psycopg.Error as exc:
            raise BrokerUnavailable(f"{self.where}: cannot connect: {self._detail(exc)}") from exc
        self._conn = conn
        try:
            if self.timeout is not None:
                # The server gives up too, so a statement the client abandoned ends soon after.
                ms = max(1, math.ceil(self.timeout * 1000))
                self._run_locked(f"SET statement_timeout = {ms}", None)
            if not self._schema_ready:
                self._run_locked(_SCHEMA, None)
                self._schema_ready = True
        except BaseException:
            self._drop()  # half set up: the next call starts again from the connection
            raise
        return conn

    def _detail(self, exc: BaseException) -> str:
        return detail(exc, self.url.password) or type(exc).__name__

    def open(self) -> None:
        with self._mutex:
            if self._conn is None:
                self._connect()

    def close(self) -> None:
        with self._mutex:
            self._drop()
            self._watchdog.close()

    def _drop(self) -> None:
        conn, self._conn = self._conn, None
        if conn is not None:
            with contextlib.suppress(Exception):
                conn.close()

    def _run(self, sql: str, params: Mapping[str, Any]) -> Any:
        """Run one statement and return its cursor; connect first when there is no connection."""
        with self._mutex:
            if self._conn is None:
                self._connect()
            return self._run_locked(sql, params)

    def _run_locked(self, sql: str, params: Mapping[str, Any] | None) -> Any:
        conn, timeout = self._conn, self.timeout
        if timeout is not None:
            self._watchdog.arm(conn.fileno(), timeout)
        cursor: Any = None
        failure: BaseException | None = None
        try:
            cursor = conn.execute(sql, params)
        except Exception as exc:  # mapped below, once the watchdog is done with the socket
            failure = exc
        finally:
            cut = timeout is not None and self._watchdog.disarm()
        if failure is None and not cut:
            return cursor
        # A connection that failed, or that the watchdog shut, is not used again: its next
        # answer could be the late one of this statement.
        if failure is None or conn.broken or isinstance(failure, psycopg.OperationalError):
            self._drop()
        if cut:
            if failure is None:
                return cursor  # the answer came in just before the socket was shut
            raise TransientAdapterError(
                f"{self.where}: no answer within {timeout:g}s (the lock's timeout); "
                "the connection was closed"
            ) from failure
        assert failure is not None
        if not isinstance(failure, psycopg.Error):
            raise failure
        error: AdapterError = from_table(failure, ERRORS, self.where, self._detail(failure))
        raise error from failure

    # -- the contract --------------------------------------------------------------------------
    def acquire(self, name: str, token: str, ttl: float, owner: str) -> int | None:
        row = self._run(
            _ACQUIRE, {"name": name, "token": token, "ttl": float(ttl), "owner": owner}
        ).fetchone()
        return None if row is None else int(row[0])

    def renew(self, name: str, token: str, ttl: float) -> bool:
        cursor = self._run(_RENEW, {"name": name, "token": token, "ttl": float(ttl)})
        return bool(cursor.rowcount == 1)

    def release(self, name: str, token: str) -> bool:
        cursor = self._run(_RELEASE, {"name": name, "token": token})
        return bool(cursor.rowcount == 1)

    def claim(self, name: str, token: str, schedule: str, fire_time: int) -> Claim:
        params = {
            "name": name,
            "token": token,
            "schedule": schedule,
            "fire": int(fire_time),
            "keep": KEEP_FIRES,
        }
        holds, claimed = self._run(_CLAIM, params).fetchone()
        if not holds:
            return Claim.NOT_HOLDER
        return Claim.CLAIMED if claimed else Claim.TAKEN

    def last_fires(self, name: str) -> dict[str, int]:
        rows = self._run(_LAST_FIRES, {"name": name}).fetchall()
        return {str(schedule): int(t) for schedule, t in rows}

    def claimed_by(self, name: str, schedule: str, fire_time: int) -> int | None:
        params = {"name": name, "schedule": schedule, "fire": int(fire_time)}
        row = self._run(_CLAIMED_BY, params).fetchone()
        return None if row is None or row[0] is None else int(row[0])

    def info(self, name: str) -> LockInfo | None:
        row = self._run(_INFO, {"name": name}).fetchone()
        if row is None:
            return None
        owner, fence, expires_in = row
        return LockInfo(name, owner or "?", int(fence), max(0.0, float(expires_in)))

    def delete(self, name: str) -> None:
        self._run(_DELETE, {"name": name})
