"""Deliberately broken adapters: the conformance suite must catch every one of them.

Each adapter is the real ``sqlite://`` adapter with exactly one bug, registered under its own
URL scheme by the ackwise plugin hook at the bottom of this module::

    broken-nack-drop:///path.db       nack() deletes the message
    broken-stale-ack:///path.db       settlements ignore the lease token (stale receipts win)
    broken-ignore-delay:///path.db    delays are ignored: delayed messages are ready at once
    broken-pop-first:///path.db       receive pops rows; "in flight" lives in process memory
    broken-no-redelivery:///path.db   expired leases are never taken again
    broken-shutdown-loss:///path.db   returns are deferred to the next poll; close() drops them
    broken-no-extend:///path.db       extend answers but moves no lease

Two more count in ``stats().in_flight`` only the deliveries of their own instance, as RabbitMQ
does without its management API (``global_in_flight=False``): the suite must neither claim a
violation it cannot see on the correct one nor miss the stale ack on the broken one::

    own-in-flight:///path.db                      no bug: only the count is this instance's
    broken-stale-ack-own-in-flight:///path.db     broken-stale-ack, counting as above

Use: put this directory on ``PYTHONPATH`` and set ``ACKWISE_PLUGINS=broken_adapters`` (worker
processes of the crash scenarios inherit both).  ``tests/test_selftest.py`` runs the
conformance suite against each of them through pytester and asserts which named scenario
fails.

**drops on nack** versus **loses prefetched messages on shutdown**: ``broken-nack-drop``
deletes the message on *every* ``nack``, whoever calls it (a REJECT_ON_LOST requeue after an
executor crash, or the return of prefetched messages at SIGTERM).  ``broken-shutdown-loss``
never deletes anything: its ``nack(delay=0)`` only queues the return client-side and sends it
with the next ``receive``; ``close()`` forgets the queue.  A running worker polls again at
once, so the requeue after an executor crash arrives (C02 REJECT_ON_LOST passes); only the
last returns before ``close()`` -- exactly the prefetched, unstarted messages a graceful
shutdown hands back -- never reach the broker and stay invisible until their lease runs out
(30 s in C05; on a broker that requeues only at shutdown or after an hour-long visibility
timeout, lost for that long).

The classes are built on first access (module ``__getattr__``), not at import: this module is
imported while ackwise's process-wide plugin manager is being built (``ACKWISE_PLUGINS``), and
asking that manager for the SQLite adapter class at that moment would wait on its own lock.
"""

from __future__ import annotations

import dataclasses
import functools
import secrets
import time
from collections.abc import Sequence
from typing import Any

from ackwise import Adapter, BrokerURL, QueueStats, get_plugins, hookimpl
from ackwise.errors import StaleReceipt
from ackwise.spi import AdapterRegistry, Delivery, Outgoing

__all__ = ["SCHEMES", "ackwise_register_adapters"]

#: URL scheme -> class name in this module.
SCHEMES = {
    "broken-nack-drop": "NackDropAdapter",
    "broken-stale-ack": "StaleAckAdapter",
    "broken-ignore-delay": "IgnoreDelayAdapter",
    "broken-pop-first": "PopFirstAdapter",
    "broken-no-redelivery": "NoRedeliveryAdapter",
    "broken-shutdown-loss": "ShutdownLossAdapter",
    "broken-no-extend": "NoExtendAdapter",
    "own-in-flight": "OwnInFlightAdapter",
    "broken-stale-ack-own-in-flight": "StaleAckOwnInFlightAdapter",
}

# Row states of the sqlite adapter's table (see ackwise's _sqlite.py).
READY, IN_FLIGHT, DEAD = 0, 1, 2


@hookimpl
def ackwise_register_adapters(registry: AdapterRegistry) -> None:
    for scheme, class_name in SCHEMES.items():
        registry.add(scheme, f"{__name__}:{class_name}", distribution="ackwise-selftest")


def __getattr__(name: str) -> type[Adapter]:
    try:
        return _classes()[name]
    except KeyError:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}") from None


@functools.cache
def _classes() -> dict[str, type[Adapter]]:
    sqlite_adapter: Any = get_plugins().adapters.get("sqlite").load()

    class _Broken(sqlite_adapter):
        """The sqlite adapter behind a ``broken-…:///path.db`` URL."""

        def __init__(self, url: BrokerURL) -> None:
            # parse_sqlite_url only reads the path and the query: hand it a sqlite:// URL.
            super().__init__(BrokerURL.parse("sqlite://" + url.raw.split("://", 1)[1]))
            self.url = url

        def __repr__(self) -> str:
            return f"<{type(self).__name__} {self.path}>"

    # -- 1. drops on nack ----------------------------------------------------------------------
    class NackDropAdapter(_Broken):
        """BUG: ``nack`` deletes the message instead of returning it to the queue.

        Imitates AMQP ``basic_reject(requeue=False)`` / ``basic_nack(requeue=False)`` on a
        queue without a dead-letter exchange, or an SQS adapter that "rejects" with
        ``DeleteMessage``: a message handed back for another try silently vanishes.
        """

        name = "broken-nack-drop"

        def nack(self, delivery: Delivery, *, delay: float = 0.0) -> None:
            self.ack([delivery])

    # -- 2. acks a stale receipt ---------------------------------------------------------------
    class StaleAckAdapter(_Broken):
        """BUG: ``ack``/``nack``/``extend``/``dead_letter`` find the row by its id only.

        The lease token of the receipt is ignored (swapped for whatever token the row holds
        now), so a worker whose lease expired -- paused by GC or SIGSTOP -- settles the *new*
        delivery that another worker is running.  Imitates adapters that settle by message
        id (``DELETE … WHERE id = ?``, a Redis ``LREM`` of the message from a shared
        processing list, ``HDEL`` of a hash keyed by message id).
        """

        name = "broken-stale-ack"

        def _current(self, deliveries: Sequence[Delivery]) -> dict[int, Delivery]:
            """Each delivery with the row's current token (the bug); absent rows left out."""
            seqs = [d.receipt[0] for d in deliveries]
            if not seqs:
                return {}
            marks = ",".join("?" * len(seqs))
            rows = (
                self._conn()
                .execute(
                    f"SELECT seq, token FROM ackwise_messages "
                    f"WHERE state = {IN_FLIGHT} AND seq IN ({marks})",
                    seqs,
                )
                .fetchall()
            )
            tokens = dict(rows)
            return {
                id(d): dataclasses.replace(d, receipt=(d.receipt[0], tokens[d.receipt[0]]))
                for d in deliveries
                if d.receipt[0] in tokens
            }

        def _settle(self, operation: str, deliveries: Sequence[Delivery], **kw: Any) -> None:
            current = self._current(deliveries)
            settle = getattr(super(), operation)
            settle(list(current.values()), **kw)
            missing = [d for d in deliveries if id(d) not in current]
            if missing:  # a row that is gone altogether is still noticed
                raise StaleReceipt(missing, operation)

        def ack(self, deliveries: Sequence[Delivery]) -> None:
            self._settle("ack", deliveries)

        def extend(self, deliveries: Sequence[Delivery], *, lease: float) -> None:
            self._settle("extend", deliveries, lease=lease)

        def nack(self, delivery: Delivery, *, delay: float = 0.0) -> None:
            current = self._current([delivery]).get(id(delivery), delivery)
            super().nack(current, delay=delay)

        def dead_letter(
            self, delivery: Delivery, *, reason: str, body: bytes | None = None
        ) -> None:
            current = self._current([delivery]).get(id(delivery), delivery)
            super().dead_letter(current, reason=reason, body=body)

    # -- 3. ignores delay ----------------------------------------------------------------------
    class IgnoreDelayAdapter(_Broken):
        """BUG: ``publish`` and ``nack(delay)`` make the message ready at once.

        Imitates a delay that is sent but never honoured: an ``x-delay`` header published to
        an exchange that is not of the delayed-message plugin's type, an ETA kept in the
        message body that no consumer reads, a scheduled set nobody moves from.
        """

        name = "broken-ignore-delay"

        def publish(self, queue: str, messages: Sequence[Outgoing]) -> None:
            super().publish(queue, [dataclasses.replace(m, delay=0.0) for m in messages])

        def nack(self, delivery: Delivery, *, delay: float = 0.0) -> None:
            super().nack(delivery, delay=0.0)

    # -- 4. pops before recording in flight ----------------------------------------------------
    class PopFirstAdapter(_Broken):
        """BUG: ``receive`` deletes the rows (the pop); "in flight" exists only in memory.

        Acks and extensions touch nothing but this process's dict; ``nack`` and
        ``dead_letter`` write the message back.  While the process lives everything looks
        right; when it dies (SIGKILL, OOM, host loss) the messages it held are gone, and the
        broker never counted them as in flight.  Imitates kombu's client-side ack emulation
        on brokers without acknowledgements (``BRPOP`` then an "unacked" record kept by the
        worker), RQ-style ``LPOP`` consumers, and ``DELETE … RETURNING`` "receive" in SQL
        queues -- what STYLE.md warns against.
        """

        name = "broken-pop-first"

        def __init__(self, url: BrokerURL) -> None:
            super().__init__(url)
            self._held: dict[Any, Delivery] = {}

        def receive(
            self, queue: str, *, max_messages: int, wait: float, lease: float
        ) -> Sequence[Delivery]:
            got = super().receive(queue, max_messages=max_messages, wait=wait, lease=lease)
            if got:
                with self._write() as db:
                    db.executemany(
                        "DELETE FROM ackwise_messages WHERE seq = ?",
                        [(d.receipt[0],) for d in got],
                    )
                for d in got:
                    self._held[tuple(d.receipt)] = d
            return got

        def _release(self, deliveries: Sequence[Delivery], operation: str) -> None:
            stale = [d for d in deliveries if tuple(d.receipt) not in self._held]
            for d in deliveries:
                self._held.pop(tuple(d.receipt), None)
            if stale:
                raise StaleReceipt(stale, operation)

        def ack(self, deliveries: Sequence[Delivery]) -> None:
            self._release(deliveries, "ack")

        def extend(self, deliveries: Sequence[Delivery], *, lease: float) -> None:
            stale = [d for d in deliveries if tuple(d.receipt) not in self._held]
            if stale:
                raise StaleReceipt(stale, "extend")

        def _put_back(self, d: Delivery, state: int, due: float, reason: str | None) -> None:
            now = time.time()
            with self._write() as db:
                db.execute(
                    "INSERT INTO ackwise_messages (queue, id, body, state, available_at, "
                    "deliveries, enqueued_at, reason, dead_at) VALUES (?,?,?,?,?,?,?,?,?)",
                    (
                        d.queue,
                        d.message_id,
                        d.body,
                        state,
                        due,
                        d.attempt,
                        now,
                        reason,
                        now if reason else None,
                    ),
                )

        def nack(self, delivery: Delivery, *, delay: float = 0.0) -> None:
            delay = delay if delay > 0 else 0.0
            if delay:
                self.check_delay(delay)
            self._release([delivery], "nack")
            self._put_back(delivery, READY, time.time() + delay, None)

        def dead_letter(
            self, delivery: Delivery, *, reason: str, body: bytes | None = None
        ) -> None:
            self._release([delivery], "dead_letter")
            d = delivery if body is None else dataclasses.replace(delivery, body=body)
            self._put_back(d, DEAD, time.time(), reason)

    # -- 5. never redelivers after lease expiry ------------------------------------------------
    class NoRedeliveryAdapter(_Broken):
        """BUG: ``receive`` takes ready rows only, never in-flight rows whose lease expired.

        A consumer that dies (or stalls) holding messages keeps them in flight forever.
        Imitates a Redis adapter whose sweeper of the in-flight set never runs, kombu's
        Redis "unacked" hash restored only when a worker starts, SQS messages under a
        visibility timeout of hours: the lease exists but nothing ever acts on its expiry.
        """

        name = "broken-no-redelivery"

        def _take(self, queue: str, max_messages: int, lease: float) -> list[Delivery]:
            token = secrets.randbits(63) or 1
            with self._write() as db:
                now = time.time()
                deadline = now + lease
                rows = db.execute(
                    f"UPDATE ackwise_messages SET state = {IN_FLIGHT}, available_at = ?, "
                    "token = ?, deliveries = deliveries + 1 "
                    "WHERE seq IN (SELECT seq FROM ackwise_messages "
                    f"WHERE queue = ? AND state < {DEAD} AND state = {READY} "  # the bug
                    "AND available_at <= ? ORDER BY available_at, seq LIMIT ?) "
                    "RETURNING seq, id, body, deliveries",
                    (deadline, token, queue, now, max_messages),
                ).fetchall()
            rows.sort()
            return [
                Delivery(queue, id_, body, (seq, token), deliveries, deadline)
                for seq, id_, body, deliveries in rows
            ]

        def _next_due(self, queue: str) -> float | None:
            due: float | None = (
                self._conn()
                .execute(
                    "SELECT min(available_at) FROM ackwise_messages "
                    f"WHERE queue = ? AND state < {DEAD} AND state = {READY}",
                    (queue,),
                )
                .fetchone()[0]
            )
            return due

    # -- 5b. extends nothing --------------------------------------------------------------------
    class NoExtendAdapter(_Broken):
        """BUG: ``extend`` checks the receipts and answers, but moves no lease.

        Imitates an adapter that sends a "touch" the broker ignores (a wrong visibility
        timeout of 0, an ack subject typo): a long task's message is delivered to another
        consumer while it still runs.
        """

        name = "broken-no-extend"

        def extend(self, deliveries: Sequence[Delivery], *, lease: float) -> None:
            stale = [d for d in deliveries if d.lease_deadline <= time.time()]
            if stale:
                raise StaleReceipt(stale, "extend")

    # -- 6. loses prefetched messages on shutdown ----------------------------------------------
    class ShutdownLossAdapter(_Broken):
        """BUG: ``nack(delay=0)`` is deferred to the next ``receive``; ``close()`` drops it.

        The receipt is checked at once (a stale one still raises), but the return itself is
        queued client-side and piggybacked on the next poll.  The worker returns prefetched,
        unstarted messages at SIGTERM and never polls again, so those returns are forgotten
        by ``close()``.  Imitates Celery's warm-shutdown loss of prefetched messages on
        Redis / SQS: the "restore unacked" step at shutdown does not happen, and the
        reserved messages stay invisible until the visibility timeout (an hour by default).
        """

        name = "broken-shutdown-loss"

        def __init__(self, url: BrokerURL) -> None:
            super().__init__(url)
            self._returns: list[Delivery] = []

        def nack(self, delivery: Delivery, *, delay: float = 0.0) -> None:
            if delay > 0:
                super().nack(delivery, delay=delay)
                return
            seq, token = delivery.receipt
            row = (
                self._conn()
                .execute(
                    "SELECT 1 FROM ackwise_messages "
                    f"WHERE seq = ? AND token = ? AND state = {IN_FLIGHT}",
                    (seq, token),
                )
                .fetchone()
            )
            if row is None:
                raise StaleReceipt([delivery], "nack")
            self._returns.append(delivery)

        def receive(
            self, queue: str, *, max_messages: int, wait: float, lease: float
        ) -> Sequence[Delivery]:
            pending, self._returns = self._returns, []
            for d in pending:
                try:
                    super().nack(d, delay=0.0)
                except StaleReceipt:
                    pass  # its lease ran out meanwhile: another consumer owns it now
            return super().receive(queue, max_messages=max_messages, wait=wait, lease=lease)

        def close(self) -> None:
            self._returns.clear()  # the bug: pending returns are forgotten, not flushed
            super().close()

    # -- 7. counts only its own deliveries in flight (not a bug: RabbitMQ without management) --
    class _OwnInFlight(_Broken):
        """``stats().in_flight`` counts only what this instance received and holds still."""

        capabilities = dataclasses.replace(sqlite_adapter.capabilities, global_in_flight=False)

        def __init__(self, url: BrokerURL) -> None:
            super().__init__(url)
            self._own: set[tuple[int, int]] = set()

        def receive(
            self, queue: str, *, max_messages: int, wait: float, lease: float
        ) -> Sequence[Delivery]:
            got = super().receive(queue, max_messages=max_messages, wait=wait, lease=lease)
            self._own.update(tuple(d.receipt) for d in got)
            return got

        def stats(self, queue: str) -> QueueStats:
            st = super().stats(queue)
            rows = (
                self._conn()
                .execute(
                    f"SELECT seq, token FROM ackwise_messages WHERE queue = ? AND state = {IN_FLIGHT}",
                    (queue,),
                )
                .fetchall()
            )
            return dataclasses.replace(
                st, in_flight=sum(1 for seq, token in rows if (seq, token) in self._own)
            )

    class OwnInFlightAdapter(_OwnInFlight):
        name = "own-in-flight"

    class StaleAckOwnInFlightAdapter(_OwnInFlight, StaleAckAdapter):  # type: ignore[misc]
        name = "broken-stale-ack-own-in-flight"

    classes: list[type[Adapter]] = [
        NackDropAdapter,
        StaleAckAdapter,
        IgnoreDelayAdapter,
        PopFirstAdapter,
        NoRedeliveryAdapter,
        ShutdownLossAdapter,
        NoExtendAdapter,
        OwnInFlightAdapter,
        StaleAckOwnInFlightAdapter,
    ]
    return {cls.__name__: cls for cls in classes}
