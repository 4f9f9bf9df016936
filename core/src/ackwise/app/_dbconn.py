"""Statements run on the caller's own database connection, whatever holds it: a psycopg 3
connection, a SQLAlchemy ``Session`` or ``Connection``, or a Django database connection.

Each becomes an :data:`~ackwise.contract._spi.Execute`: ``execute(sql, params)`` with ``%(name)s``
parameters, run in the transaction open on that connection, returning the rows (empty for a
statement that returns none).  None of the three libraries is imported here: a connection is
recognised by its type's module, and the library it came from is already loaded.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ackwise.contract._spi import Execute
from ackwise.errors import ConfigurationError

__all__ = ["executor_for"]

_EXPECTED = (
    "a psycopg 3 connection, a SQLAlchemy Session or Connection (postgresql+psycopg://), or a "
    "Django connection (django.db.connection) to PostgreSQL"
)


def executor_for(conn: Any) -> Execute:
    """A statement runner in the transaction open on ``conn``.

    :raises ConfigurationError: ``conn`` is none of the kinds above, is not on PostgreSQL
        through psycopg 3, or has no transaction open (each statement would commit by itself,
        so a send would not be part of the caller's transaction).
    """
    module = type(conn).__module__
    if module.startswith("psycopg.") or module == "psycopg":
        return _psycopg(conn)
    if module.startswith("sqlalchemy."):
        return _sqlalchemy(conn)
    if module.startswith("django."):
        return _django(conn)
    raise ConfigurationError(
        f"app.transaction() got {module}.{type(conn).__name__}; expected {_EXPECTED}"
    )


def _psycopg(conn: Any) -> Execute:
    if type(conn).__name__ == "AsyncConnection":
        raise ConfigurationError(
            "app.transaction() got a psycopg AsyncConnection; it takes a synchronous "
            "psycopg.Connection (sends are synchronous calls)"
        )
    if not callable(getattr(conn, "execute", None)):
        raise ConfigurationError(
            f"app.transaction() got {type(conn).__name__} from psycopg; expected {_EXPECTED}"
        )
    # IDLE (0): no transaction open.  Outside autocommit the first statement opens one; in
    # autocommit mode only ``with conn.transaction():`` does.
    if conn.autocommit and int(conn.info.transaction_status) == 0:
        raise ConfigurationError(
            "app.transaction(): the psycopg connection is in autocommit mode with no "
            "transaction open, so each statement would commit by itself; open one with "
            "`with conn.transaction():` around the block, or use a connection without autocommit"
        )

    def run(sql: str, params: Mapping[str, Any]) -> list[tuple[Any, ...]]:
        cur = conn.execute(sql, params)
        return list(cur.fetchall()) if cur.description is not None else []

    return run


def _sqlalchemy(conn: Any) -> Execute:
    name = type(conn).__name__
    if name in ("AsyncSession", "AsyncConnection"):
        raise ConfigurationError(
            f"app.transaction() got a SQLAlchemy {name}; it takes the synchronous Session or "
            "Connection (with an AsyncSession: `await session.run_sync(...)` around the sends)"
        )
    connection = conn.connection() if callable(getattr(conn, "connection", None)) else conn
    if not callable(getattr(connection, "exec_driver_sql", None)):
        raise ConfigurationError(f"app.transaction() got SQLAlchemy {name}; expected {_EXPECTED}")
    dialect = connection.dialect
    if dialect.name != "postgresql" or dialect.driver != "psycopg":
        raise ConfigurationError(
            f"app.transaction() got a SQLAlchemy connection to {dialect.name}+{dialect.driver}; "
            "it needs PostgreSQL through psycopg 3 (a URL postgresql+psycopg://…)"
        )
    if connection.connection.driver_connection.autocommit:
        raise ConfigurationError(
            "app.transaction(): the SQLAlchemy connection runs with isolation_level AUTOCOMMIT, "
            "so each statement would commit by itself; use one with transactions"
        )

    def run(sql: str, params: Mapping[str, Any]) -> list[tuple[Any, ...]]:
        result = connection.exec_driver_sql(sql, dict(params))
        return [tuple(row) for row in result.fetchall()] if result.returns_rows else []

    return run


def _django(conn: Any) -> Execute:
    vendor = getattr(conn, "vendor", "?")
    driver = ""
    if vendor == "postgresql":
        conn.ensure_connection()
        driver = type(conn.connection).__module__.split(".")[0]
    if driver != "psycopg":
        raise ConfigurationError(
            f"app.transaction() got a Django connection to {vendor}"
            f"{f' through {driver}' if driver else ''}; it needs PostgreSQL through psycopg 3 "
            "(pip install 'psycopg[binary]')"
        )
    if not conn.in_atomic_block:
        raise ConfigurationError(
            "app.transaction(): the Django connection has no transaction open (autocommit), so "
            "each statement would commit by itself; put the block inside "
            "`with transaction.atomic():` (or use ATOMIC_REQUESTS)"
        )

    def run(sql: str, params: Mapping[str, Any]) -> list[tuple[Any, ...]]:
        with conn.cursor() as cur:
            cur.execute(sql, dict(params))
            return list(cur.fetchall()) if cur.description is not None else []

    return run
