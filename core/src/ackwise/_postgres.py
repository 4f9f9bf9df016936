"""What core's PostgreSQL stores share: creating their tables when several processes start
at once."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

__all__ = ["create_tables"]

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
