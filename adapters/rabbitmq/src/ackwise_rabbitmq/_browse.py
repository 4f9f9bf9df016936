"""Inspection: a queue's stats, listing queues, and browsing, replaying and deleting its dead
letters; purging.

See the adapter's overview (:mod:`ackwise_rabbitmq._adapter`): **Stats**, **Dead letters**.
"""

from __future__ import annotations

import base64
import contextlib
import json
import logging
import time
import urllib.parse
import urllib.request
from collections.abc import Iterator, Sequence
from typing import Any

import pika.exceptions as px
from pika.adapters.blocking_connection import BlockingChannel

from ackwise.errors import QueueNotFound
from ackwise.spi import DeadLetter, QueueStats
from ackwise_rabbitmq._consume import Consumer
from ackwise_rabbitmq._io import IOThread
from ackwise_rabbitmq._messages import _dead_letter_of, _priority
from ackwise_rabbitmq._publish import Publisher
from ackwise_rabbitmq._topology import DELAY_TIERS, Topology
from ackwise_rabbitmq._url import RabbitMQSettings

__all__ = ["Browser"]

# The adapter's one logger, named as before it was split into modules.
log = logging.getLogger("ackwise_rabbitmq._adapter")


class Browser:
    """Counts (``queue.declare`` passive, the management API), dead-letter queue reads."""

    def __init__(
        self,
        settings: RabbitMQSettings,
        io: IOThread,
        topology: Topology,
        publisher: Publisher,
        consumer: Consumer,
    ) -> None:
        self.settings = settings
        self._io = io
        self._topology = topology
        self._publisher = publisher
        self._consumer = consumer

    # -- inspection ------------------------------------------------------------------------
    def _counts(self, queue: str) -> tuple[int, int, int]:
        exists, aux = self._topology.exists, self._topology.aux
        ready = exists(queue)
        if ready is None:
            raise QueueNotFound(f"{self.settings.where}: queue {queue!r} does not exist")
        # The delay tiers that exist are 0 to some k (declared from the bottom up when a delay
        # first needs them, :meth:`~ackwise_rabbitmq._topology.Topology.declare_tiers`):
        # count up to the first one missing.
        delayed = 0
        for k in range(DELAY_TIERS):
            waiting = exists(aux(queue, f"wait.{k}"))
            if waiting is None:
                break
            delayed += waiting
        dead = exists(aux(queue, "dead")) or 0
        return ready, delayed, dead

    def stats(self, queue: str) -> QueueStats:
        started = time.monotonic()
        ready, delayed, dead = self._io.call(lambda: self._counts(queue))
        # ``pushed``: pushed to this adapter's consumer but handed to no one: ready as far as
        # ackwise is concerned (they go back to the queue at a graceful stop); the broker, and
        # so any other process, counts them unacknowledged.
        mine, pushed = self._consumer.held(queue)
        info = None
        if self.settings.management:
            # Totals at least as new as this call began (see the URL's management_lag).
            time.sleep(max(0.0, started + self.settings.management_lag - time.monotonic()))
            info = self._queue_totals(queue)
        if info is not None and "messages_unacknowledged" in info:
            # Queue totals come from the queue itself (quorum queues: as of their last tick,
            # a fraction of a second).  A message counted there but no longer ready now has
            # been delivered since: count it in flight, so that lag errs towards "still in
            # flight", never towards "settled".
            unacked = int(info.get("messages_unacknowledged") or 0)
            total = int(info.get("messages") or 0)
            in_flight = max(unacked - pushed, total - ready - pushed, mine)
        else:
            in_flight = mine
        return QueueStats(queue, ready + pushed, delayed, max(0, in_flight), dead, 0.0)

    def _queue_totals(self, queue: str) -> dict[str, Any] | None:
        """The queue's live totals from the management API (not its sampled statistics)."""
        vhost = urllib.parse.quote(self.settings.vhost, safe="")
        name = urllib.parse.quote(queue, safe="")
        found = self.management(
            f"/api/queues/{vhost}?name={name}&use_regex=false&disable_stats=true"
            "&enable_queue_totals=true&columns=name,messages,messages_ready,"
            "messages_unacknowledged"
        )
        items = found.get("items", []) if isinstance(found, dict) else found or []
        for item in items:
            if item.get("name") == queue:
                return dict(item)
        return None

    def management(self, path: str) -> Any:
        """The management API's answer at ``path``, or None without it (or on its failure)."""
        base = self.settings.management
        if not base:
            return None
        request = urllib.request.Request(base.rstrip("/") + path)
        token = base64.b64encode(
            f"{self.settings.username}:{self.settings.password}".encode()
        ).decode()
        request.add_header("Authorization", f"Basic {token}")
        try:
            with urllib.request.urlopen(request, timeout=self.settings.connection_timeout) as r:
                return json.loads(r.read())
        except Exception as exc:  # the management API is optional: report, do not fail
            log.warning("RabbitMQ management API at %s: %s", base, exc)
            return None

    def queues(self) -> Sequence[str] | None:
        """The queues of the vhost but ackwise's own, or None without the management API."""
        vhost = urllib.parse.quote(self.settings.vhost, safe="")
        info = self.management(f"/api/queues/{vhost}?columns=name")
        if info is None:
            return None
        prefix = self.settings.prefix + "."
        return sorted(q["name"] for q in info if not q["name"].startswith(prefix))

    @contextlib.contextmanager
    def _reading_dead(self) -> Iterator[BlockingChannel]:
        """A channel to read dead letters on with ``basic.get``: what it took and did not ack
        goes back to the queue, in order, before this returns.

        Closing the channel would return them too, but not before the next read: RabbitMQ
        sends ``close-ok`` first and requeues when the queue hears the channel is gone, so a
        read right after (the next listing, ``stats`` then a listing) could miss letters that
        the queue's count shows.  A ``basic.nack`` of everything (tag 0, ``multiple``) goes
        from the channel to the queue before the channel answers the ``basic.qos`` after it,
        so they are back in the queue before any later request reaches it.
        """
        with self._io.temp_channel() as ch:
            yield ch
            if ch.is_open:
                ch.basic_nack(delivery_tag=0, multiple=True, requeue=True)
                ch.basic_qos(prefetch_count=0)  # the barrier: answered after the nack went

    def _read_dead(
        self, ch: BlockingChannel, queue: str, limit: int | None
    ) -> list[tuple[int, DeadLetter, int]]:
        """(delivery tag, dead letter, priority) of up to ``limit`` dead letters."""
        out: list[tuple[int, DeadLetter, int]] = []
        dead = self._topology.aux(queue, "dead")
        while limit is None or len(out) < limit:
            method, props, body = ch.basic_get(dead, auto_ack=False)
            if method is None:
                break
            dead_letter = _dead_letter_of(queue, props, body)
            out.append((method.delivery_tag, dead_letter, _priority(props)))
        return out

    def dead_letters(self, queue: str, *, limit: int = 100) -> Sequence[DeadLetter]:
        def run() -> list[DeadLetter]:
            with self._reading_dead() as ch:
                return [d for _, d, _ in self._read_dead(ch, queue, limit)]

        return self._io.call(run, timeout=120.0)

    def requeue_dead(self, queue: str, message_ids: Sequence[str]) -> int:
        wanted = set(message_ids)

        def run() -> int:
            with self._reading_dead() as ch:
                moved = 0
                for tag, d, priority in self._read_dead(ch, queue, None):
                    if d.message_id not in wanted:
                        continue
                    # Confirmed on the queue first, then removed from the dead letters.
                    props = self._publisher.properties(d.message_id, priority=priority)
                    self._publisher.publish_tiered(
                        queue, [("", queue, d.body, props)], -1, io_thread=True
                    )
                    ch.basic_ack(tag)
                    moved += 1
                return moved

        return self._io.call(run, timeout=300.0)

    def delete_dead(self, queue: str, message_ids: Sequence[str] | None = None) -> int:
        dead = self._topology.aux(queue, "dead")
        if message_ids is None:
            return self._io.call(
                lambda: int(self._io.admin().queue_purge(dead).method.message_count)
            )
        wanted = set(message_ids)

        def run() -> int:
            with self._reading_dead() as ch:
                gone = 0
                for tag, d, _ in self._read_dead(ch, queue, None):
                    if d.message_id in wanted:
                        ch.basic_ack(tag)
                        gone += 1
                return gone

        return self._io.call(run, timeout=300.0)

    def purge(self, queue: str) -> int:
        """Empty the queue and its delay tiers (those that exist; they stay declared: a
        publisher elsewhere may count on them)."""

        def run() -> int:
            total = int(self._io.admin().queue_purge(queue).method.message_count)
            for k in range(DELAY_TIERS):
                total += self._purge_if_exists(self._topology.aux(queue, f"wait.{k}"))
            return total

        return self._io.call(run)

    def _purge_if_exists(self, name: str) -> int:
        """Purge queue ``name``: how many messages it held, 0 if it does not exist."""
        try:
            return int(self._io.admin().queue_purge(name).method.message_count)
        except px.ChannelClosedByBroker as exc:
            if exc.reply_code != 404:
                raise
            return 0
