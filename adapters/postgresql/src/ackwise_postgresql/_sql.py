"""The tables and every statement of the adapter.  Each operation is one statement (the
database keeps it atomic), except the schema's creation.

Times are the database server's clock (``clock_timestamp()``, seconds since the epoch), the one
clock every worker shares: lease deadlines and due times never depend on a host's clock.
"""

from __future__ import annotations

#: Rows: ready (``state`` 0; ``available_at``: when it becomes due, the native delay), in
#: flight (1; ``available_at``: the lease deadline; ``token``: the delivery's) or dead (2).
#: The CHECKs keep out what ackwise never writes, so every stored row can be delivered.
SCHEMA = [
    """
CREATE TABLE IF NOT EXISTS ackwise_messages (
    seq          BIGINT GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    queue        TEXT NOT NULL,
    id           TEXT NOT NULL CHECK (id <> ''),
    body         BYTEA NOT NULL,
    state        SMALLINT NOT NULL CHECK (state IN (0, 1, 2)),
    available_at DOUBLE PRECISION NOT NULL
                 CHECK (available_at > '-Infinity' AND available_at < 'Infinity'),
    deliveries   INTEGER NOT NULL DEFAULT 0 CHECK (deliveries >= 0),
    token        BIGINT,
    enqueued_at  DOUBLE PRECISION NOT NULL,
    priority     SMALLINT NOT NULL DEFAULT 0 CHECK (priority BETWEEN 0 AND 9),
    reason       TEXT,
    dead_at      DOUBLE PRECISION
)""",
    # Receive walks it in delivery order; due rows of a priority come before its delayed ones.
    """
CREATE INDEX IF NOT EXISTS ackwise_messages_receivable
    ON ackwise_messages (queue, priority DESC, available_at, seq) WHERE state < 2""",
    """
CREATE INDEX IF NOT EXISTS ackwise_messages_dead
    ON ackwise_messages (queue, dead_at, seq) WHERE state = 2""",
    """
CREATE TABLE IF NOT EXISTS ackwise_queues (
    name        TEXT PRIMARY KEY,
    declared_at DOUBLE PRECISION NOT NULL
)""",
]
#: Whether every table and index exists already: then no DDL runs (CREATE INDEX IF NOT
#: EXISTS would still wait for a lock that an open transaction writing messages holds).
SCHEMA_READY = """
SELECT to_regclass('ackwise_messages') IS NOT NULL AND to_regclass('ackwise_queues') IS NOT NULL
   AND to_regclass('ackwise_messages_receivable') IS NOT NULL
   AND to_regclass('ackwise_messages_dead') IS NOT NULL
"""
#: Held while the schema is created: two processes creating the same table at once would
#: otherwise collide in the catalogue (a unique violation on pg_type).
SCHEMA_LOCK = 0x61636B77  # "ackw"

# No "::" casts in what may run on a caller's connection (SQLAlchemy's text() reads ":name").
_NOW = "CAST(extract(epoch FROM clock_timestamp()) AS float8)"

DECLARE = (
    "INSERT INTO ackwise_queues (name, declared_at) VALUES (%s, " + _NOW + ") "
    "ON CONFLICT (name) DO NOTHING"
)

# Messages go in as arrays (one statement for a batch), in order: seq follows it.  The
# notification is sent at commit, with the rows.  Also run on a caller's own connection, in
# its transaction (app.transaction()).
PUBLISH = f"""
WITH t AS (SELECT {_NOW} AS now),
ins AS (
    INSERT INTO ackwise_messages (queue, id, body, state, available_at, enqueued_at, priority)
    SELECT %(queue)s, u.id, u.body, 0, t.now + u.delay, t.now, u.priority
      FROM t, unnest(CAST(%(ids)s AS text[]), CAST(%(bodies)s AS bytea[]),
                     CAST(%(delays)s AS float8[]), CAST(%(priorities)s AS int2[]))
           WITH ORDINALITY AS u(id, body, delay, priority, n)
     ORDER BY u.n
    RETURNING 1)
SELECT (SELECT count(*) FROM ins), pg_notify(%(channel)s, '')
"""

PUBLISH_DEAD = f"""
WITH t AS (SELECT {_NOW} AS now)
INSERT INTO ackwise_messages
    (queue, id, body, state, available_at, enqueued_at, priority, reason, dead_at)
SELECT %(queue)s, u.id, u.body, 2, t.now, t.now, u.priority, %(reason)s, t.now + u.n * 1e-6
  FROM t, unnest(%(ids)s::text[], %(bodies)s::bytea[], %(priorities)s::int2[])
       WITH ORDINALITY AS u(id, body, priority, n)
 ORDER BY u.n
"""

# Takes and records in flight in one statement: no crash falls between the two.  SKIP LOCKED
# lets concurrent receivers take different rows instead of queueing on the same ones.
RECEIVE = f"""
WITH t AS (SELECT {_NOW} AS now),
picked AS (
    SELECT m.seq FROM ackwise_messages m, t
     WHERE m.queue = %(queue)s AND m.state < 2 AND m.available_at <= t.now
     ORDER BY m.priority DESC, m.available_at, m.seq
     LIMIT %(n)s
       FOR UPDATE OF m SKIP LOCKED)
UPDATE ackwise_messages m
   SET state = 1, available_at = t.now + %(lease)s, token = %(token)s,
       deliveries = m.deliveries + 1
  FROM picked, t
 WHERE m.seq = picked.seq
RETURNING m.seq, m.id, m.body, m.deliveries, m.available_at, m.priority
"""

# When the next row of the queue is due (one index seek per priority), and the time now.
NEXT_DUE = f"""
SELECT {_NOW}, min(m.available_at)
  FROM generate_series(0, 9) AS p,
       LATERAL (SELECT available_at FROM ackwise_messages
                 WHERE queue = %s AND state < 2 AND priority = p::int2
                 ORDER BY available_at LIMIT 1) AS m
"""

_RECEIPTS = "unnest(%(seqs)s::bigint[], %(tokens)s::bigint[]) AS r(seq, token)"

ACK = f"""
DELETE FROM ackwise_messages m USING {_RECEIPTS}
 WHERE m.seq = r.seq AND m.token = r.token AND m.state = 1
RETURNING m.seq
"""

EXTEND = f"""
UPDATE ackwise_messages m SET available_at = {_NOW} + %(lease)s FROM {_RECEIPTS}
 WHERE m.seq = r.seq AND m.token = r.token AND m.state = 1
RETURNING m.seq
"""

NACK = f"""
WITH u AS (
    UPDATE ackwise_messages SET state = 0, available_at = {_NOW} + %(delay)s, token = NULL
     WHERE seq = %(seq)s AND token = %(token)s AND state = 1
    RETURNING seq)
SELECT (SELECT count(*) FROM u), pg_notify(%(channel)s, '')
"""

DEAD_LETTER = f"""
UPDATE ackwise_messages
   SET state = 2, reason = %(reason)s, dead_at = {_NOW}, body = coalesce(%(body)s, body),
       token = NULL
 WHERE seq = %(seq)s AND token = %(token)s AND state = 1
RETURNING seq
"""

STATS = f"""
WITH t AS (SELECT {_NOW} AS now)
SELECT count(*) FILTER (WHERE m.available_at <= t.now),
       count(*) FILTER (WHERE m.state = 0 AND m.available_at > t.now),
       count(*) FILTER (WHERE m.state = 1 AND m.available_at > t.now),
       min(m.enqueued_at) FILTER (WHERE m.available_at <= t.now),
       (SELECT count(*) FROM ackwise_messages WHERE queue = %(queue)s AND state = 2),
       t.now
  FROM t LEFT JOIN ackwise_messages m ON m.queue = %(queue)s AND m.state < 2
 GROUP BY t.now
"""

DEAD_LETTERS = """
SELECT id, body, reason, dead_at, deliveries FROM ackwise_messages
 WHERE queue = %s AND state = 2
 ORDER BY dead_at, seq LIMIT %s
"""

# A replay is a new delivery: count and enqueue time start again, the priority stays.
REQUEUE_DEAD = f"""
WITH u AS (
    UPDATE ackwise_messages
       SET state = 0, available_at = {_NOW}, enqueued_at = {_NOW}, deliveries = 0,
           token = NULL, reason = NULL, dead_at = NULL
     WHERE queue = %(queue)s AND state = 2 AND id = ANY(%(ids)s::text[])
    RETURNING seq)
SELECT (SELECT count(*) FROM u), pg_notify(%(channel)s, '')
"""

DELETE_DEAD = "DELETE FROM ackwise_messages WHERE queue = %s AND state = 2"
DELETE_DEAD_IDS = DELETE_DEAD + " AND id = ANY(%s::text[])"
PURGE = "DELETE FROM ackwise_messages WHERE queue = %s AND state = 0"
DELETE_QUEUE = "DELETE FROM ackwise_messages WHERE queue = %s"
FORGET_QUEUE = "DELETE FROM ackwise_queues WHERE name = %s"
QUEUES = "SELECT name FROM ackwise_queues ORDER BY name"

#: Which database, and which ackwise_messages table in it, a connection reaches: equal on two
#: connections when they reach the same table of the same server (its start time tells it
#: from another server's).
IDENTITY = """
SELECT current_database(), CAST(to_regclass('ackwise_messages') AS oid), pg_postmaster_start_time()
"""
