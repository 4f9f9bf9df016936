"""This package's connections, and psycopg's errors mapped to ackwise's in one table.

:class:`Link` is the adapter's: opened on first use and again after it broke, with the channels
it LISTENs on.  :class:`StoreLink` is a store's (results, idempotency keys, worker records):
one connection shared by the store's threads.  The leader lock (:mod:`ackwise_postgresql._lock`)
keeps its own, watched, but maps its errors with the same table.
"""

from __future__ import annotations

import contextlib
import hashlib
import select
import threading
from collections.abc import Iterator, Sequence
from typing import Any

import psycopg
import psycopg.errors as pe

from ackwise.errors import (
    AdapterError,
    AuthenticationFailed,
    BrokerUnavailable,
    PermanentAdapterError,
    TransientAdapterError,
)
from ackwise.spi import BrokerURL, ErrorTable, from_table, mapping_errors, redact
from ackwise_postgresql import _sql

#: The nearest listed base class wins; anything unlisted is permanent.
ERRORS: ErrorTable = {
    pe.InvalidPassword: (AuthenticationFailed, "the database refused the credentials"),
    pe.InvalidAuthorizationSpecification: (
        AuthenticationFailed,
        "the database refused the credentials",
    ),
    pe.InsufficientPrivilege: (PermanentAdapterError, "permission denied"),
    pe.InvalidCatalogName: (PermanentAdapterError, "no such database"),
    pe.SerializationFailure: (TransientAdapterError, "a concurrent transaction won; retry"),
    pe.DeadlockDetected: (TransientAdapterError, "deadlock detected; retry"),
    pe.LockNotAvailable: (TransientAdapterError, "a lock was busy; retry"),
    pe.QueryCanceled: (TransientAdapterError, "the statement was cancelled"),
    pe.AdminShutdown: (BrokerUnavailable, "the database is shutting down or restarting"),
    pe.CannotConnectNow: (BrokerUnavailable, "the database is starting up"),
    psycopg.OperationalError: (TransientAdapterError, "the connection failed"),
    psycopg.InterfaceError: (TransientAdapterError, "the connection is closed"),
    psycopg.Error: (PermanentAdapterError, "the database refused the statement"),
    OSError: (TransientAdapterError, "socket error"),
}
#: What a failed connection attempt is: psycopg raises OperationalError for all of them.
_CONNECT_ERRORS: ErrorTable = {
    psycopg.OperationalError: (BrokerUnavailable, "cannot connect"),
    OSError: (BrokerUnavailable, "cannot connect"),
}
#: What the table maps: every psycopg error.
_CAUGHT = (psycopg.Error,)


def detail(exc: BaseException, secret: str | None) -> str:
    """The first line of ``exc``'s message, ``secret`` (the URL's password) masked."""
    text = str(exc).strip()
    return redact(text.splitlines()[0] if text else "", secret)


def translate(exc: BaseException, where: str, secret: str | None) -> AdapterError:
    """ackwise's error for psycopg's ``exc`` (the translation of :func:`mapping_errors`): by
    :data:`ERRORS`, but a failed connection attempt (``where`` ends ``: connect``) is refused
    credentials or an unavailable database."""
    text = detail(exc, secret)
    if where.endswith(": connect") and type(exc) is psycopg.OperationalError:
        if "authentication failed" in text or ("role" in text and "does not" in text):
            return AuthenticationFailed(f"{where}: the database refused the credentials")
        return from_table(exc, _CONNECT_ERRORS, where, text)
    return from_table(exc, ERRORS, where, text)


def create_tables(conn: psycopg.Connection[Any], statements: Sequence[str]) -> None:
    """Run ``statements`` (``CREATE … IF NOT EXISTS``) in one transaction, under the advisory
    lock :data:`~ackwise_postgresql._sql.SCHEMA_LOCK`, on an autocommit connection: processes
    starting together on a new database do not collide in the catalogue."""
    with conn.transaction():
        conn.execute("SELECT pg_advisory_xact_lock(%s)", (_sql.SCHEMA_LOCK,))
        for statement in statements:
            conn.execute(statement)


def channel(queue: str) -> str:
    """The NOTIFY channel of a queue: an identifier of fixed length, whatever its name."""
    return "ackwise_" + hashlib.sha1(queue.encode()).hexdigest()[:24]


class Link:
    """One autocommit connection to the database of ``url``.

    :attr:`where` names it in every error (no password).  A statement that fails on the
    connection (not on its data) drops it; the next call connects again and LISTENs again.
    """

    def __init__(self, url: BrokerURL, connect_timeout: float) -> None:
        self.url = url
        self.where = f"PostgreSQL {url}"
        self._timeout = connect_timeout
        self._conn: psycopg.Connection[Any] | None = None
        self._listening: set[str] = set()
        self._schema_ready = False

    @property
    def is_open(self) -> bool:
        return self._conn is not None

    def connection(self) -> psycopg.Connection[Any]:
        """The open connection (connecting, and creating the tables once, when there is none)."""
        if self._conn is not None and not self._alive(self._conn):
            self.close()
        if self._conn is None:
            with self.errors("connect"):
                conn = psycopg.connect(
                    self.url.raw, autocommit=True, connect_timeout=max(1, round(self._timeout))
                )
            self._conn, self._listening = conn, set()
            if not self._schema_ready:
                with self.errors("look for the tables"):
                    row = conn.execute(_sql.SCHEMA_READY).fetchone()
                    self._schema_ready = bool(row and row[0])
            if not self._schema_ready:
                with self.errors("create the tables"):
                    create_tables(conn, _sql.SCHEMA)
                self._schema_ready = True
        return self._conn

    @staticmethod
    def _alive(conn: psycopg.Connection[Any]) -> bool:
        """False for a connection the server ended while it sat between statements.

        After a restart (or a proxy reset) the server's goodbye, or the end of the stream,
        waits on the socket: seen here, the next statement goes out on a new connection instead
        of failing (a failed statement could not always be sent again safely: it may have
        run).  Readable with no statement outstanding is that, or a notification: a probe
        tells which.
        """
        if conn.closed or conn.broken:
            return False
        poller = select.poll()
        poller.register(conn.fileno(), select.POLLIN | select.POLLERR | select.POLLHUP)
        if not poller.poll(0):
            return True
        try:  # a probe that may fail: it changes nothing
            conn.execute("SELECT 1")
        except psycopg.Error:
            return False
        return True

    def close(self) -> None:
        conn, self._conn = self._conn, None
        if conn is not None:
            with contextlib.suppress(Exception):
                conn.close()

    @contextlib.contextmanager
    def errors(self, operation: str) -> Iterator[None]:
        """Map psycopg's errors; drop the connection when it, not the statement, failed."""
        try:
            with mapping_errors(
                translate, _CAUGHT, f"{self.where}: {operation}", self.url.password
            ):
                yield
        except (TransientAdapterError, PermanentAdapterError):
            conn = self._conn
            if conn is not None and (conn.closed or conn.broken):
                self.close()
            raise

    def execute(self, operation: str, sql: str, params: Any = None) -> list[tuple[Any, ...]]:
        """Run one statement; its rows (none for a statement that returns none)."""
        with self.errors(operation):
            cur = self.connection().execute(sql, params)
            return cur.fetchall() if cur.description is not None else []

    def rowcount(self, operation: str, sql: str, params: Any = None) -> int:
        with self.errors(operation):
            return self.connection().execute(sql, params).rowcount

    # -- waiting for a publish ---------------------------------------------------------------
    def listen(self, name: str) -> None:
        """LISTEN on ``name`` (once per connection)."""
        if name not in self._listening:
            with self.errors("listen"):
                self.connection().execute(f'LISTEN "{name}"')
            self._listening.add(name)

    def drain(self) -> None:
        """Drop the notifications received so far (a busy consumer reads none)."""
        if self._listening and self._conn is not None:
            with self.errors("read notifications"):
                for _ in self._conn.notifies(timeout=0):
                    pass

    def wait(self, timeout: float) -> None:
        """Return at the first notification on a channel listened to, or after ``timeout``."""
        with self.errors("wait for a notification"):
            for _ in self.connection().notifies(timeout=max(0.0, timeout), stop_after=1):
                break


class StoreLink:
    """The one connection of a store (results, idempotency keys, worker records): autocommit,
    one statement at a time for all the store's threads, its tables made when it opens.

    :param what: the store, for messages (``"idempotency store"``).
    :param schema: the statements that create its tables (``CREATE TABLE IF NOT EXISTS``).
    """

    def __init__(self, url: BrokerURL, what: str, schema: Sequence[str]) -> None:
        self.url = url
        self.where = f"PostgreSQL {what} {url}"
        self.schema = schema
        self._conn: psycopg.Connection[Any] | None = None
        self._lock = threading.Lock()

    def errors(self, operation: str) -> contextlib.AbstractContextManager[None]:
        """Map psycopg's errors raised inside to ackwise's (:func:`translate`)."""
        return mapping_errors(translate, _CAUGHT, f"{self.where}: {operation}", self.url.password)

    def connect(self) -> psycopg.Connection[Any]:
        """A new autocommit connection to the store's database."""
        with self.errors("connect"):
            return psycopg.connect(self.url.raw, autocommit=True)

    def open(self) -> None:
        """Connect, and create the store's tables if they are missing."""
        self._conn = self.connect()
        with self.errors("create the tables"):
            create_tables(self._conn, self.schema)

    def close(self) -> None:
        conn, self._conn = self._conn, None
        if conn is not None:
            conn.close()

    def execute(self, sql: str, params: Sequence[Any] = ()) -> psycopg.Cursor[Any]:
        """Run one statement on the store's connection; its cursor."""
        with self._lock, self.errors("execute"):
            if self._conn is None:
                raise psycopg.InterfaceError("the store is not open")
            return self._conn.execute(sql, params)
