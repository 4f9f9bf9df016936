"""What core's PostgreSQL stores share: creating their tables when several processes start
at once."""

from __future__ import annotations

import threading
from collections.abc import Sequence
from typing import Any

from ackwise.contract._spi import BrokerURL
from ackwise.errors import (
    BrokerUnavailable,
    ConfigurationError,
    PermanentAdapterError,
    TransientAdapterError,
)

__all__ = ["PgStoreLink", "create_tables"]

#: The advisory lock held while tables are created ("ackw"; the PostgreSQL adapter holds the
#: same one for its own): two ``CREATE TABLE IF NOT EXISTS`` of one table racing would
#: otherwise collide in the catalogue (a unique violation on ``pg_type``).
SCHEMA_LOCK = 0x61636B77


def create_tables(conn: Any, statements: Sequence[str]) -> None:
    """Run ``statements`` (``CREATE … IF NOT EXISTS``) in one transaction, under the lock.

    ``conn`` is a psycopg connection in autocommit mode.
    """
    with conn.transaction():
        conn.execute("SELECT pg_advisory_xact_lock(%s)", (SCHEMA_LOCK,))
        for statement in statements:
            conn.execute(statement)


class PgStoreLink:
    """The one connection of a core PostgreSQL store (psycopg 3, autocommit), shared by its
    threads, with psycopg's errors as ackwise's: unreachable → ``BrokerUnavailable`` (open)
    or ``TransientAdapterError``; anything the database refuses → ``PermanentAdapterError``.

    :param what: the store, for messages (``"idempotency store"``).
    """

    def __init__(self, url: BrokerURL, what: str, schema: Sequence[str]) -> None:
        self.url = url
        self.what = what
        self.schema = schema
        self._conn: Any = None
        self._lock = threading.Lock()

    def open(self) -> None:
        try:
            import psycopg
        except ImportError as exc:
            raise ConfigurationError(
                f"the PostgreSQL {self.what} needs psycopg: pip install 'ackwise[postgresql]'"
            ) from exc
        self._psycopg: Any = psycopg
        try:
            self._conn = psycopg.connect(self.url.raw, autocommit=True)
            create_tables(self._conn, self.schema)
        except psycopg.Error as exc:
            raise BrokerUnavailable(f"{self.what} {self.url}: {exc}") from exc

    def close(self) -> None:
        conn, self._conn = self._conn, None
        if conn is not None:
            conn.close()

    def execute(self, sql: str, params: Sequence[Any] = ()) -> Any:
        """Run one statement; its cursor."""
        with self._lock:
            try:
                return self._conn.execute(sql, params)
            except self._psycopg.OperationalError as exc:
                raise TransientAdapterError(f"{self.what} {self.url}: {exc}") from exc
            except self._psycopg.Error as exc:
                raise PermanentAdapterError(f"{self.what} {self.url}: {exc}") from exc
