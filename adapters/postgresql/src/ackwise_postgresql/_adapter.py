"""``postgresql://`` (or ``postgres://``): the PostgreSQL adapter.

``postgresql://user:password@host:port/database?option=value`` — a libpq URL: every libpq
parameter (``sslmode``, ``application_name``, ``options=-csearch_path%3Dmyschema`` …) goes to
the connection as it is; ``connect_timeout`` (seconds, default 10) bounds a connection attempt.

Storage: one table, ``ackwise_messages`` (plus ``ackwise_queues``), created on first connect in
the connection's schema; see :mod:`ackwise_postgresql._sql`.  Each operation is one statement:

- **receive** takes the queue's due rows, highest priority first, with ``FOR UPDATE SKIP
  LOCKED`` and marks them in flight with a lease deadline and a fresh token in the same
  statement; expired leases are due rows too, which is how a dead worker's messages come back,
  with the delivery count one higher.  A receipt is ``(seq, token)``: a settlement with a token
  that moved on matches no row and raises :class:`~ackwise.errors.StaleReceipt`.
- **an idle receiver** LISTENs on its queue's channel and sleeps until a publish, nack or replay
  NOTIFYs it, or until the next delayed row or lease is due: it wakes about a millisecond after
  the commit, without polling.
- **delays** are ``available_at`` in the future; **dead letters** are rows in state 2 with their
  reason, kept until replayed or deleted.

Durability is the database's: a publish or an ack has returned only once committed.
"""

from __future__ import annotations

import secrets
import time
from collections.abc import Sequence
from typing import Any

from ackwise.errors import InvalidBrokerURL, MessageTooLarge, StaleReceipt
from ackwise.spi import (
    Adapter,
    BrokerURL,
    Capabilities,
    DeadLetter,
    Delivery,
    Execute,
    Outgoing,
    QueueSpec,
    QueueStats,
)
from ackwise_postgresql import _sql
from ackwise_postgresql._link import Link, channel

__all__ = ["MAX_MESSAGE_SIZE", "PostgreSQLAdapter"]

#: Largest envelope accepted.  A bytea holds up to 1 GB, but every receive of a batch reads
#: the rows whole: keep payloads small and pass references to large data.
MAX_MESSAGE_SIZE = 64 * 1024 * 1024
#: Longest an idle receiver sleeps without a notification before it looks again (a missed
#: notification, say across a reconnect, costs at most this).
_REST = 5.0


def _connect_timeout(url: BrokerURL) -> float:
    raw = url.query.get("connect_timeout", "10")
    try:
        value = float(raw)
    except ValueError:
        value = -1.0
    if not value > 0:
        raise InvalidBrokerURL(
            f"broker URL {url}: connect_timeout must be seconds > 0, got {raw!r}"
        )
    return value


class PostgreSQLAdapter(Adapter):
    """Adapter for one PostgreSQL database."""

    name = "postgresql"
    # Everything natively: unbounded delays, per-message leases, exact counts, priorities.
    capabilities = Capabilities(max_message_size=MAX_MESSAGE_SIZE, priorities=True)

    def __init__(self, url: BrokerURL) -> None:
        super().__init__(url)
        if url.scheme not in ("postgresql", "postgres"):
            raise InvalidBrokerURL(f"broker URL {url}: scheme must be postgresql or postgres")
        self._link = Link(url, _connect_timeout(url))
        self._identity: tuple[Any, ...] | None = None

    def __repr__(self) -> str:
        return f"<PostgreSQLAdapter {self._link.where}>"

    # -- lifecycle -------------------------------------------------------------------------
    def open(self) -> None:
        self._link.connection()

    def close(self) -> None:
        self._link.close()

    # -- topology --------------------------------------------------------------------------
    def declare(self, queue: QueueSpec) -> None:
        self._link.execute(f"declare {queue.name}", _sql.DECLARE, (queue.name,))

    def queues(self) -> Sequence[str]:
        return [name for (name,) in self._link.execute("list queues", _sql.QUEUES)]

    # -- producing -------------------------------------------------------------------------
    def _arrays(self, messages: Sequence[Outgoing]) -> dict[str, Any]:
        for m in messages:
            if len(m.body) > MAX_MESSAGE_SIZE:
                raise MessageTooLarge(
                    f"message {m.id}: {len(m.body)} bytes exceeds the PostgreSQL broker's "
                    f"limit of {MAX_MESSAGE_SIZE}; nothing was published"
                )
        self.check_priorities(messages)
        return {
            "ids": [m.id for m in messages],
            "bodies": [m.body for m in messages],
            "priorities": [m.priority for m in messages],
        }

    def _publish_params(self, queue: str, messages: Sequence[Outgoing]) -> dict[str, Any]:
        params = self._arrays(messages)
        params.update(
            queue=queue, channel=channel(queue), delays=[max(m.delay, 0.0) for m in messages]
        )
        return params

    def publish(self, queue: str, messages: Sequence[Outgoing]) -> None:
        if messages:
            params = self._publish_params(queue, messages)
            self._link.execute(f"publish to {queue}", _sql.PUBLISH, params)

    def takes_transaction(self, execute: Execute) -> bool:
        """Whether ``execute`` runs on a connection to this broker's own table."""
        if self._identity is None:
            self._identity = self._link.execute("identify the database", _sql.IDENTITY)[0]
        theirs = execute(_sql.IDENTITY, {})
        return bool(theirs) and tuple(theirs[0]) == tuple(self._identity)

    def publish_in_transaction(
        self, execute: Execute, queue: str, messages: Sequence[Outgoing]
    ) -> None:
        if messages:
            execute(_sql.PUBLISH, self._publish_params(queue, messages))

    def publish_dead(self, queue: str, messages: Sequence[Outgoing], *, reason: str) -> None:
        if not messages:
            return
        params = self._arrays(messages)
        params.update(queue=queue, reason=reason)
        self._link.execute(f"publish dead letters to {queue}", _sql.PUBLISH_DEAD, params)

    # -- consuming -------------------------------------------------------------------------
    def _take(self, queue: str, n: int, lease: float) -> list[Delivery]:
        token = secrets.randbits(63) or 1
        rows = self._link.execute(
            f"receive from {queue}",
            _sql.RECEIVE,
            {"queue": queue, "n": n, "lease": lease, "token": token},
        )
        rows.sort(key=lambda row: (-row[5], row[0]))  # highest priority, then publication
        return [
            Delivery(queue, mid, bytes(body), (seq, token), deliveries, deadline)
            for seq, mid, body, deliveries, deadline, _ in rows
        ]

    def receive(
        self, queue: str, *, max_messages: int, wait: float, lease: float
    ) -> Sequence[Delivery]:
        if max_messages < 1:
            return []
        self._link.drain()
        out = self._take(queue, max_messages, lease)
        if out or wait <= 0:
            return out
        end = time.monotonic() + wait
        self._link.listen(channel(queue))  # before looking again: no publish falls between
        while True:
            out = self._take(queue, max_messages, lease)
            remaining = end - time.monotonic()
            if out or remaining <= 0:
                return out
            now, due = self._link.execute(f"look at {queue}", _sql.NEXT_DUE, (queue,))[0]
            pause = min(remaining, _REST)
            if due is not None:
                pause = min(pause, max(due - now, 0.0) + 0.001)
            self._link.wait(pause)

    def _settle(
        self, sql: str, deliveries: Sequence[Delivery], operation: str, **extra: Any
    ) -> None:
        if not deliveries:
            return
        params = {
            "seqs": [d.receipt[0] for d in deliveries],
            "tokens": [d.receipt[1] for d in deliveries],
            **extra,
        }
        done = {seq for (seq,) in self._link.execute(operation, sql, params)}
        stale = [d for d in deliveries if d.receipt[0] not in done]
        if stale:
            raise StaleReceipt(stale, operation)

    def ack(self, deliveries: Sequence[Delivery]) -> None:
        self._settle(_sql.ACK, deliveries, "ack")

    def extend(self, deliveries: Sequence[Delivery], *, lease: float) -> None:
        self._settle(_sql.EXTEND, deliveries, "extend", lease=lease)

    def nack(self, delivery: Delivery, *, delay: float = 0.0) -> None:
        seq, token = delivery.receipt
        params = {
            "seq": seq,
            "token": token,
            "delay": max(delay, 0.0),
            "channel": channel(delivery.queue),
        }
        [(count, _)] = self._link.execute("nack", _sql.NACK, params)
        if not count:
            raise StaleReceipt([delivery], "nack")

    def dead_letter(self, delivery: Delivery, *, reason: str, body: bytes | None = None) -> None:
        seq, token = delivery.receipt
        params = {"seq": seq, "token": token, "reason": reason, "body": body}
        if not self._link.execute("dead_letter", _sql.DEAD_LETTER, params):
            raise StaleReceipt([delivery], "dead_letter")

    # -- inspection ------------------------------------------------------------------------
    def stats(self, queue: str) -> QueueStats:
        [(ready, delayed, in_flight, oldest, dead, now)] = self._link.execute(
            f"stats of {queue}", _sql.STATS, {"queue": queue}
        )
        return QueueStats(
            queue,
            ready=ready,
            delayed=delayed,
            in_flight=in_flight,
            dead=dead,
            oldest_age=max(0.0, now - oldest) if oldest is not None else 0.0,
        )

    def dead_letters(self, queue: str, *, limit: int = 100) -> Sequence[DeadLetter]:
        rows = self._link.execute(
            f"list dead letters of {queue}", _sql.DEAD_LETTERS, (queue, limit)
        )
        return [
            DeadLetter(queue, mid, bytes(body), reason or "unknown", dead_at or 0.0, attempt)
            for mid, body, reason, dead_at, attempt in rows
        ]

    def requeue_dead(self, queue: str, message_ids: Sequence[str]) -> int:
        if not message_ids:
            return 0
        params = {"queue": queue, "ids": list(message_ids), "channel": channel(queue)}
        [(moved, _)] = self._link.execute(
            f"replay dead letters of {queue}", _sql.REQUEUE_DEAD, params
        )
        return int(moved)

    def delete_dead(self, queue: str, message_ids: Sequence[str] | None = None) -> int:
        what = f"delete dead letters of {queue}"
        if message_ids is None:
            return self._link.rowcount(what, _sql.DELETE_DEAD, (queue,))
        return self._link.rowcount(what, _sql.DELETE_DEAD_IDS, (queue, list(message_ids)))

    def purge(self, queue: str) -> int:
        return self._link.rowcount(f"purge {queue}", _sql.PURGE, (queue,))

    def delete_queue(self, queue: str) -> None:
        self._link.rowcount(f"delete {queue}", _sql.DELETE_QUEUE, (queue,))
        self._link.rowcount(f"delete {queue}", _sql.FORGET_QUEUE, (queue,))
