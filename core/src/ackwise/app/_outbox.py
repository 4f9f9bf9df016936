"""The transactional outbox: messages written into the caller's own PostgreSQL database, in
the caller's transaction, and published afterwards by ``ackwise relay`` (docs/outbox.md).

Statements use ``%(name)s`` parameters and ``CAST(… AS …)`` (no ``::``), so that every driver
that runs them (psycopg, SQLAlchemy's ``text()``, Django's cursor) reads them alike.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from ackwise.contract._spi import Outgoing

__all__ = ["CHANNEL", "CLAIM", "DELETE", "SCHEMA", "SCHEMA_LOCK", "create_tables", "insert_params"]

#: The advisory lock held while the table is created ("ackw"; the PostgreSQL adapter holds the
#: same one for its own tables): two ``CREATE TABLE IF NOT EXISTS`` of one table racing would
#: otherwise collide in the catalogue (a unique violation on ``pg_type``).
SCHEMA_LOCK = 0x61636B77

SCHEMA = [
    """
CREATE TABLE IF NOT EXISTS ackwise_outbox (
    id          BIGINT GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    queue       TEXT NOT NULL,
    message_id  TEXT NOT NULL,
    body        BYTEA NOT NULL,
    delay       DOUBLE PRECISION NOT NULL DEFAULT 0,
    priority    SMALLINT NOT NULL DEFAULT 0,
    created_at  TIMESTAMPTZ NOT NULL DEFAULT clock_timestamp()
)""",
]

EXISTS = "SELECT to_regclass('ackwise_outbox')"

#: The relays LISTEN here; an enqueue NOTIFYs it, delivered when the caller commits.
CHANNEL = "ackwise_outbox"

INSERT = """
INSERT INTO ackwise_outbox (queue, message_id, body, delay, priority)
SELECT %(queue)s, u.m, u.b, u.d, u.p
  FROM unnest(CAST(%(ids)s AS text[]), CAST(%(bodies)s AS bytea[]),
              CAST(%(delays)s AS float8[]), CAST(%(priorities)s AS int2[])) AS u(m, b, d, p)
"""
NOTIFY = "SELECT pg_notify('" + CHANNEL + "', '')"


def create_tables(conn: Any) -> None:
    """Create the outbox table (``CREATE … IF NOT EXISTS``) in one transaction, under
    :data:`SCHEMA_LOCK`.

    ``conn`` is a psycopg connection in autocommit mode (``ackwise relay``'s).
    """
    with conn.transaction():
        conn.execute("SELECT pg_advisory_xact_lock(%s)", (SCHEMA_LOCK,))
        for statement in SCHEMA:
            conn.execute(statement)


# The oldest rows no other relay holds; the delay is what is left of it now.
CLAIM = """
SELECT id, queue, message_id, body,
       greatest(0, delay - extract(epoch FROM clock_timestamp() - created_at)), priority
  FROM ackwise_outbox
 ORDER BY id
 LIMIT %(n)s
   FOR UPDATE SKIP LOCKED
"""
DELETE = "DELETE FROM ackwise_outbox WHERE id = ANY(CAST(%(ids)s AS bigint[]))"


def insert_params(queue: str, messages: Sequence[Outgoing]) -> dict[str, Any]:
    """The parameters of :data:`INSERT` for ``messages``."""
    return {
        "queue": queue,
        "ids": [m.id for m in messages],
        "bodies": [m.body for m in messages],
        "delays": [max(m.delay, 0.0) for m in messages],
        "priorities": [m.priority for m in messages],
    }
