"""One process's connection to an ackwise SQLite file: URL options, fork rule, transactions.

The embedded broker, its leader-lock store and its idempotency store share a database file
and this module, so they open it, survive ``fork()`` and map driver errors the same way:

- the file is opened in autocommit mode with WAL journaling (several processes share it),
  the URL's ``synchronous`` and ``busy_timeout``, and the caller's schema set up once;
- a connection inherited through ``fork()`` is never used nor closed by the child (SQLite
  forbids both): the child opens its own;
- every write is one ``BEGIN IMMEDIATE`` transaction, so writers queue on the database lock
  instead of failing on a lock upgrade; every driver error leaves as an
  :mod:`ackwise.errors` one.
"""

from __future__ import annotations

import contextlib
import os
import sqlite3
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from typing import ClassVar

from ackwise.contract._spi import BrokerURL
from ackwise.errors import (
    AdapterError,
    BrokerUnavailable,
    InvalidBrokerURL,
    PermanentAdapterError,
    TransientAdapterError,
)

__all__ = [
    "SQLiteFile",
    "SQLiteStore",
    "map_sqlite_errors",
    "parse_sqlite_url",
    "run_schema",
    "translate_sqlite_error",
]

_OPTIONS = ("busy_timeout", "synchronous")
_SYNCHRONOUS = {"normal": "NORMAL", "full": "FULL"}

# Connections inherited through fork() are never used nor closed by the child (SQLite forbids
# both); they are kept here so that garbage collection does not close them either.
_inherited: list[sqlite3.Connection] = []


# -- error mapping -------------------------------------------------------------------------
_TRANSIENT_CODES = {
    5,  # SQLITE_BUSY
    6,  # SQLITE_LOCKED
    13,  # SQLITE_FULL: disk full; may succeed once space is freed
    15,  # SQLITE_PROTOCOL
}
_UNAVAILABLE_CODES = {
    10,  # SQLITE_IOERR
    14,  # SQLITE_CANTOPEN
}


def _describe_path(path: str) -> str:
    if not path:
        return ""
    directory = os.path.dirname(path) or "."
    if not os.path.isdir(directory):
        return f" (database {path!r}: directory {directory!r} does not exist)"
    return f" (database {path!r})"


def translate_sqlite_error(exc: sqlite3.Error, path: str = "") -> AdapterError:
    """Return the :mod:`ackwise.errors` exception for a driver error (not raised)."""
    code = getattr(exc, "sqlite_errorcode", None)
    primary = code & 0xFF if isinstance(code, int) else None
    text = str(exc)
    lowered = text.lower()
    where = _describe_path(path)
    if primary in _UNAVAILABLE_CODES or (
        primary is None and ("unable to open" in lowered or "disk i/o" in lowered)
    ):
        return BrokerUnavailable(f"SQLite broker unavailable: {text}{where}")
    if primary in _TRANSIENT_CODES or (
        primary is None and ("locked" in lowered or "busy" in lowered)
    ):
        return TransientAdapterError(
            f"SQLite database busy: {text}{where}; another process held the write lock "
            "longer than busy_timeout"
        )
    return PermanentAdapterError(f"SQLite error: {text}{where}")


@contextmanager
def map_sqlite_errors(path: str = "") -> Iterator[None]:
    """Re-raise every :class:`sqlite3.Error` as an :mod:`ackwise.errors` one, ``from`` it.

    ``database is locked`` / busy → :class:`TransientAdapterError`; I/O errors and a database
    that cannot be opened → :class:`BrokerUnavailable` (naming the path, and the directory when
    it is missing); corruption and everything else → :class:`PermanentAdapterError`.
    """
    try:
        yield
    except sqlite3.Error as exc:
        raise translate_sqlite_error(exc, path) from exc


# -- URL -----------------------------------------------------------------------------------
def parse_sqlite_url(url: BrokerURL) -> tuple[str, str, float]:
    """Return ``(absolute path, synchronous pragma value, busy timeout)`` for ``url``."""
    if url.host or url.port is not None or url.username or url.password:
        raise InvalidBrokerURL(
            f"broker URL {url}: a sqlite URL names a file, not a host; use "
            "'sqlite:///relative/path.db' or 'sqlite:////absolute/path.db'"
        )
    unknown = sorted(set(url.query) - set(_OPTIONS))
    if unknown:
        raise InvalidBrokerURL(
            f"broker URL {url}: unknown sqlite option(s) {', '.join(map(repr, unknown))}; "
            f"accepted options: {', '.join(_OPTIONS)}"
        )
    sync_raw = url.query.get("synchronous", "normal")
    synchronous = _SYNCHRONOUS.get(sync_raw.lower())
    if synchronous is None:
        raise InvalidBrokerURL(
            f"broker URL {url}: synchronous={sync_raw!r} is not accepted; "
            f"use one of: {', '.join(_SYNCHRONOUS)}"
        )
    timeout_raw = url.query.get("busy_timeout", "10")
    try:
        busy_timeout = float(timeout_raw)
    except ValueError:
        busy_timeout = -1.0
    if not (0 <= busy_timeout < 86_400):
        raise InvalidBrokerURL(
            f"broker URL {url}: busy_timeout={timeout_raw!r} must be a number of seconds "
            "between 0 and 86400"
        )
    raw_path = url.path[1:] if url.path.startswith("/") else url.path
    if not raw_path or raw_path in (":memory:",) or raw_path.endswith("/"):
        raise InvalidBrokerURL(
            f"broker URL {url}: no database file; use 'sqlite:///relative/path.db' or "
            "'sqlite:////absolute/path.db' (for an in-process broker use 'memory://')"
        )
    return os.path.abspath(raw_path), synchronous, busy_timeout


# -- the connection ------------------------------------------------------------------------
class SQLiteFile:
    """This process's connection to the database file of a ``sqlite://`` URL.

    :param what: what the file is to the caller, for error messages ("SQLite database",
        "SQLite lock store", …).
    :param setup: run once per new connection, inside the open (creates the caller's
        schema; the connection is in autocommit mode).
    :param timeout: wait at most this long for another process's write lock, when shorter
        than the URL's ``busy_timeout``.
    """

    def __init__(
        self,
        url: BrokerURL,
        *,
        what: str,
        setup: Callable[[sqlite3.Connection], None],
        timeout: float | None = None,
    ) -> None:
        self.path, self.synchronous, self._busy = parse_sqlite_url(url)
        #: A shorter wait than the URL's ``busy_timeout``, applied at the next open.
        self.timeout = timeout
        self._what = what
        self._setup = setup
        self._db: sqlite3.Connection | None = None
        self._pid = 0

    @property
    def busy_timeout(self) -> float:
        return self._busy if self.timeout is None else min(self._busy, self.timeout)

    @property
    def is_open(self) -> bool:
        """Whether this process holds a connection of its own (not one inherited by fork)."""
        return self._db is not None and self._pid == os.getpid()

    def open(self) -> sqlite3.Connection:
        """This process's connection, opened (and set up) when it has none yet."""
        if self._db is not None and self._pid == os.getpid():
            return self._db
        if self._db is not None:  # inherited through fork(): never touch the parent's handle
            _inherited.append(self._db)
            self._db = None
        directory = os.path.dirname(self.path)
        if not os.path.isdir(directory):
            raise BrokerUnavailable(
                f"cannot open {self._what} {self.path!r}: directory {directory!r} does not "
                "exist (ackwise does not create it)"
            )
        with map_sqlite_errors(self.path):
            db = sqlite3.connect(
                self.path,
                timeout=self.busy_timeout,
                isolation_level=None,
                check_same_thread=False,
                cached_statements=64,
            )
            try:
                db.execute(f"PRAGMA busy_timeout = {int(self.busy_timeout * 1000)}")
                mode = self._journal_wal(db)
                if str(mode).lower() != "wal":
                    raise PermanentAdapterError(
                        f"{self._what} {self.path!r} cannot use WAL journal mode (got "
                        f"{mode!r}); several processes share it: use a local file system"
                    )
                db.execute(f"PRAGMA synchronous = {self.synchronous}")
                self._setup(db)
            except BaseException:
                db.close()
                raise
        self._db, self._pid = db, os.getpid()
        return db

    def _journal_wal(self, db: sqlite3.Connection) -> str:
        """``PRAGMA journal_mode = WAL``, waiting up to ``busy_timeout`` for a writer.

        On a file still in rollback mode (a new one that another process is setting up), the
        change needs an exclusive lock, and SQLite answers "database is locked" at once
        rather than calling the busy handler; it is asked again until the writer is done.
        """
        deadline = time.monotonic() + self.busy_timeout
        while True:
            try:
                return str(db.execute("PRAGMA journal_mode = WAL").fetchone()[0])
            except sqlite3.OperationalError as exc:
                busy = getattr(exc, "sqlite_errorcode", None) == sqlite3.SQLITE_BUSY
                if not busy or time.monotonic() >= deadline:
                    raise
                time.sleep(0.01)

    def close(self) -> None:
        db, self._db = self._db, None
        if db is None:
            return
        if self._pid != os.getpid():
            _inherited.append(db)
            return
        with map_sqlite_errors(self.path):
            db.close()

    @contextmanager
    def write(self) -> Iterator[sqlite3.Connection]:
        """One ``BEGIN IMMEDIATE`` transaction; errors mapped, rolled back on failure."""
        db = self.open()
        with map_sqlite_errors(self.path):
            db.execute("BEGIN IMMEDIATE")
            try:
                yield db
                db.execute("COMMIT")
            except BaseException:
                if db.in_transaction:
                    try:
                        db.rollback()
                    except sqlite3.Error:
                        pass
                raise

    @contextmanager
    def read(self) -> Iterator[sqlite3.Connection]:
        """A plain read: in WAL mode a consistent snapshot that takes no write lock."""
        db = self.open()
        with map_sqlite_errors(self.path):
            yield db


def run_schema(db: sqlite3.Connection, statements: Sequence[str]) -> None:
    """Run ``statements`` (DDL) in one write transaction."""
    db.execute("BEGIN IMMEDIATE")
    try:
        for statement in statements:
            db.execute(statement)
        db.execute("COMMIT")
    except BaseException:
        db.rollback()
        raise


class SQLiteStore:
    """What the stores kept in a broker's SQLite file share (idempotency keys, results, rate
    limits): one :class:`SQLiteFile` whose tables ``schema`` creates.  Mixed in before the
    store's ABC: ``class S(SQLiteStore, ResultStore)``."""

    #: What the store is, for messages ("SQLite result store").
    what: ClassVar[str]
    #: The statements that create its tables (``CREATE TABLE IF NOT EXISTS``).
    schema: ClassVar[Sequence[str]]
    url: BrokerURL
    _file: SQLiteFile | None = None

    def open(self) -> None:
        self._file = SQLiteFile(
            self.url, what=self.what, setup=lambda db: run_schema(db, self.schema)
        )
        self._file.open()

    def close(self) -> None:
        file, self._file = self._file, None
        if file is not None:
            file.close()

    def _open_file(self) -> SQLiteFile:
        if self._file is None:
            raise TransientAdapterError(f"{self.what} {self.url}: not open")
        return self._file

    def _tx(self) -> contextlib.AbstractContextManager[sqlite3.Connection]:
        """One write transaction (``BEGIN IMMEDIATE``)."""
        return self._open_file().write()
