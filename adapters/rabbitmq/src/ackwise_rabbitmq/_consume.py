"""Consuming: the consumer windows of a queue, receiving from their inbox, and settling.

See the adapter's overview (:mod:`ackwise_rabbitmq._adapter`): **Receiving**, **Receipts**.
The broker pushes into an inbox on the I/O thread (a consumer per window, ``basic.qos`` per
consumer); ``receive`` takes from it; acks, nacks and dead letters settle what was taken, by
receipt (connection generation, delivery tag).
"""

from __future__ import annotations

import collections
import logging
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from ackwise.errors import (
    PermanentAdapterError,
    StaleReceipt,
    TransientAdapterError,
    UnsupportedCapability,
)
from ackwise.spi import Delivery, Outgoing
from ackwise_rabbitmq import _pika_private
from ackwise_rabbitmq._io import IOThread
from ackwise_rabbitmq._messages import (
    H_DELIVERIES,
    _attempt,
    _dead_body,
    _malformed,
    _message_id,
    _priority,
)
from ackwise_rabbitmq._publish import Publisher, delay_ms
from ackwise_rabbitmq._topology import Topology, tier
from ackwise_rabbitmq._url import RabbitMQSettings

__all__ = ["Consumer", "Receipt"]

# The adapter's one logger, named as before it was split into modules.
log = logging.getLogger("ackwise_rabbitmq._adapter")

#: A late ack is posted without waiting while the I/O loop turned this recently (seconds; the
#: loop turns at least every 0.5 s).
_FRESH_LOOP = 1.0


@dataclass(frozen=True, slots=True)
class Receipt:
    """A delivery's receipt: the connection it came on and its AMQP delivery tag."""

    generation: int
    tag: int
    #: The consumer it came through (its window is freed when the delivery is settled).
    consumer: _Consumer | None = field(default=None, compare=False, repr=False)
    #: The message's priority, which a republish (a nack with a delay, a dead letter) keeps.
    priority: int = field(default=0, compare=False)


@dataclass(slots=True)
class _Raw:
    generation: int
    queue: str
    tag: int
    properties: Any
    body: bytes
    redelivered: bool
    consumer: _Consumer


@dataclass(slots=True, eq=False)
class _Consumer:
    """One ``basic.consume`` of a queue: its window and how much of it is in use."""

    queue: str
    tag: str
    credit: int
    outstanding: int = 0  # pushed and not settled (in the inbox or handed out)


class Consumer:
    """Consumer windows, the inbox, and the unsettled deliveries of this connection (guarded by
    the connection's lock, :attr:`IOThread.lock <ackwise_rabbitmq._io.IOThread.lock>`; the
    windows' ``basic.qos`` is the I/O thread's).  It hears of each new connection, and of each
    one lost, as the connection's :class:`~ackwise_rabbitmq._io.ConnectionListener`."""

    def __init__(
        self, settings: RabbitMQSettings, io: IOThread, topology: Topology, publisher: Publisher
    ) -> None:
        self.settings = settings
        self._io = io
        self._lock = io.lock
        self._topology = topology
        self._publisher = publisher
        self._unacked: dict[int, str] = {}  # delivery tag -> queue, of this generation
        # Pushed by a consumer, not yet taken by ``receive`` (guarded by ``_lock``):
        self._inbox: dict[str, collections.deque[_Raw]] = {}
        # queue -> its consumers (their windows add up), this generation:
        self._consumers: dict[str, list[_Consumer]] = {}
        self._qos = 0  # owned by the I/O thread
        self._receivers_waiting = 0  # receives waiting for a push (guarded by ``_lock``)

    # -- the connection's comings and goings (ConnectionListener) --------------------------
    def connection_began(self) -> None:
        """A new connection is up: forget the previous one's windows (lock held)."""
        self._qos = 0
        self._unacked.clear()
        self._inbox.clear()
        self._consumers.clear()

    def connection_ended(self) -> None:
        """The connection is gone: forget its deliveries (lock held)."""
        self._unacked.clear()
        self._inbox.clear()  # unacked at the broker: closing the connection requeues them
        self._consumers.clear()

    # -- consuming -------------------------------------------------------------------------
    def receive(
        self, queue: str, *, max_messages: int, wait: float, lease: float
    ) -> Sequence[Delivery]:
        """Up to ``max_messages`` pushed messages of ``queue``, waiting up to ``wait``
        seconds for one; the first receive of a queue starts its consumer window."""
        if max_messages <= 0:
            return []
        io = self._io
        io.consuming()  # the I/O thread turns the loop without pause from now on
        io.ensure_open()
        raws = self._take(queue, max_messages)
        if not raws and wait <= 0 and io.aside:
            # The I/O thread stands aside since a receive drove: take in what came here.
            io.drive(lambda: bool(self._inbox.get(queue)), time.monotonic(), take=False)
            raws = self._take(queue, max_messages)
        if not raws:
            with self._lock:
                consumers = self._consumers.get(queue, [])
                credit = sum(c.credit for c in consumers)
                # The caller's whole budget: what it holds unsettled (through any consumer of
                # this connection) and the room it asks to fill.
                want = max_messages + sum(1 for q in self._unacked.values() if q == queue)
                # Nothing pushed and a window too small for what the caller asks: it holds
                # every delivery the window let through (no worker does: one with acks still
                # to send polls with wait=0 and finds the window open again shortly), or its
                # budget grew (an automatic prefetch) past the window.  The window grows by
                # one more consumer (cancelling one could return its in-flight deliveries),
                # at least doubling, so that a budget creeping up adds few consumers (many
                # small windows cost the quorum queue: 0.89x the drain rate at concurrency 1
                # with 8 consumers where 5 cover the same budget).
                # A window short of the budget keeps the worker's buffer low: it then asks
                # for more after every task and gets one or two (0.75x the drain rate at
                # concurrency 1 with windows of 2/3 of the budget).
                # A window that grew (an automatic budget: a fixed one keeps its first) keeps a
                # quarter more than the budget for the acks still on their way through the
                # quorum queue's log, which hold their slots meanwhile (windows of exactly the
                # budget: 0.83x the drain rate at concurrency 1).
                short = want > credit
                thin = len(consumers) > 1 and want + want // 4 > credit
                full = sum(c.outstanding for c in consumers) >= credit and wait > 0
                grow = not consumers or short or thin or full
            if grow:
                n = len(consumers)
                if not consumers:
                    more = max(want, 1)
                else:
                    more = max(want + want // 4 - credit, credit if short else credit // 2, 1)
                io.call(lambda: self._add_consumer(queue, more, n))
            if wait > 0:
                deadline = time.monotonic() + wait
                io.drive(lambda: bool(self._inbox.get(queue)), deadline)
                with self._lock:
                    while not self._inbox.get(queue) and io.alive:
                        remaining = deadline - time.monotonic()
                        if remaining <= 0:
                            break
                        self._receivers_waiting += 1
                        try:
                            self._lock.wait(remaining)
                        finally:
                            self._receivers_waiting -= 1
                io.ensure_open()
            raws = self._take(queue, max_messages)
        now = time.time()
        return [self._delivery(raw, now + lease) for raw in raws]

    def _take(self, queue: str, n: int) -> list[_Raw]:
        """Hand over up to ``n`` pushed messages: from here on they are the caller's."""
        with self._lock:
            inbox = self._inbox.get(queue)
            if not inbox:
                return []
            generation = self._io.generation
            out: list[_Raw] = []
            while inbox and len(out) < n:
                raw = inbox.popleft()
                if raw.generation != generation:
                    continue  # the connection went meanwhile: the broker requeued it
                self._unacked[raw.tag] = queue
                out.append(raw)
            return out

    def _add_consumer(self, queue: str, credit: int, seen: int) -> None:
        """Consume ``queue`` with a window of ``credit`` more unacked messages (I/O thread).

        The broker pushes while fewer than ``credit`` of this consumer's deliveries are
        unsettled; a late ack frees its slot just as the task that ends frees room in the
        worker, so the windows of a queue's consumers add up to the worker's own prefetch
        budget.  (An early ack frees a slot while the task still runs: :meth:`ack_before_start`
        stops the consumers first.)  A budget that grows gets another consumer for the
        difference (RabbitMQ applies ``basic.qos`` to new consumers only) rather than a
        replacement, which would cost deliveries (see :meth:`_cancel`).  ``seen`` is how many
        consumers the caller saw: if that changed, or a push came meanwhile, there is nothing
        to do.
        """
        with self._lock:
            if len(self._consumers.get(queue, [])) != seen or self._inbox.get(queue):
                return
        io = self._io
        io.check_live()
        ch = io.consume_channel
        if self._qos != credit:
            ch.basic_qos(prefetch_count=credit)  # per consumer: applies to the next one
            self._qos = credit
        generation = io.generation
        consumer = _Consumer(queue, "", credit)
        with self._lock:
            inbox = self._inbox.setdefault(queue, collections.deque())

        # pika's channel calls this from the I/O loop as each delivery's frames arrive.
        def on_message(_ch: Any, method: Any, props: Any, body: bytes) -> None:
            raw = _Raw(
                generation, queue, method.delivery_tag, props, body, method.redelivered, consumer
            )
            with self._lock:
                consumer.outstanding += 1
                handover = not inbox and self._receivers_waiting > 0
                inbox.append(raw)
                self._lock.notify_all()
            if handover:
                # The receiver just woken waits for the GIL, which this thread would hold
                # until its next wait on the socket: hand it over now (a task's start sooner).
                time.sleep(0)

        # The channel's own consume-ok slot, as BlockingChannel.basic_consume uses it; the
        # consumer itself is the impl's, so that its deliveries come straight to the inbox
        # and a cancel can keep the ones in transit (see _cancel_consumers).
        consumer.tag = _pika_private.consume(ch, queue, on_message)
        io.raise_if_lost()
        with self._lock:
            self._consumers.setdefault(queue, []).append(consumer)

    def consumer_cancelled(self, tag: str) -> None:
        """The broker cancelled a consumer: its queue was deleted, by this adapter or another
        client.  The consumer is forgotten, so that a later receive of the queue subscribes
        again, and so is the queue's declaration, so that ``declare`` declares it again.  What
        the consumer pushed stays in the inbox and is settled as usual."""
        with self._lock:
            for queue, consumers in list(self._consumers.items()):
                kept = [c for c in consumers if c.tag != tag]
                if len(kept) == len(consumers):
                    continue
                if kept:
                    self._consumers[queue] = kept
                else:
                    del self._consumers[queue]
                self._topology.forget(queue)

    def _cancel_consumers(self, queues: Iterable[str]) -> None:
        """Cancel every consumer of ``queues`` (I/O thread, no wait): see :meth:`_cancel`."""
        with self._lock:
            consumers = [c for q in queues for c in self._consumers.get(q, [])]
        self._cancel(consumers)

    def _cancel(self, consumers: Iterable[_Consumer]) -> None:
        """Send ``basic.cancel`` for ``consumers`` (I/O thread, no wait).

        The next synchronous method on the channel returns after every cancel-ok.  Messages
        the broker pushed before it took a cancel in still arrive and go to the inbox like
        any other: they were asked for (pika's own cancel would reject them back to the
        queue, which counts as a delivery on a quorum queue).  A quorum queue itself takes
        back what was still on its way and counts it as a delivery (RabbitMQ 3.10, measured:
        replacements sent a message to the dead letters without a run, early acks whole
        windows back): only a full window, where nothing can be on its way, is cancelled
        without that cost.
        """
        ch = self._io.consume_channel
        for consumer in consumers:
            with self._lock:
                mine = self._consumers.get(consumer.queue, [])
                if consumer not in mine:
                    continue
                mine.remove(consumer)
                if not mine:
                    del self._consumers[consumer.queue]
            _pika_private.cancel_keeping_in_transit(ch, consumer.tag)

    def stop_receiving(self) -> None:
        """Cancel every consumer and give back at once what they pushed and no one took."""
        io = self._io
        with self._lock:
            if not io.alive or (not self._consumers and not any(self._inbox.values())):
                return

        def run() -> None:
            ch = io.consume_channel
            self._cancel_consumers(list(self._consumers))
            ch.basic_qos(prefetch_count=self._qos)  # every cancel-ok has come before this
            with self._lock:
                raws = [raw for inbox in self._inbox.values() for raw in inbox]
                self._inbox.clear()
            for raw in raws:
                if raw.generation == io.generation:
                    _pika_private.send_reject(ch, raw.tag, requeue=True)
            ch.basic_qos(prefetch_count=self._qos)  # they are back before this returns

        try:
            io.call(run)
        except TransientAdapterError as exc:
            # The connection is gone: the broker has requeued everything it held for us.
            log.warning("returning prefetched messages failed, the connection is gone: %s", exc)

    def held(self, queue: str) -> tuple[int, int]:
        """Of ``queue``: (deliveries handed out and not settled, messages pushed to this
        connection's consumers and handed to no one)."""
        with self._lock:
            mine = sum(1 for q in self._unacked.values() if q == queue)
            pushed = len(self._inbox.get(queue, ()))
        return mine, pushed

    def windows(self) -> dict[str, list[int]]:
        """Each consumed queue's consumer windows (their ``basic.qos``), this connection."""
        with self._lock:
            return {q: [c.credit for c in consumers] for q, consumers in self._consumers.items()}

    def _delivery(self, raw: _Raw, deadline: float) -> Delivery:
        """The delivery of a pushed message; one ackwise did not write is marked corrupt (the
        worker dead-letters it as it is), never raised on: this runs after its tag was
        recorded unacked, and a raise would stop the worker at each redelivery."""
        props = raw.properties
        headers = props.headers or {}
        return Delivery(
            queue=raw.queue,
            message_id=_message_id(props, raw.body),
            body=raw.body,
            receipt=Receipt(raw.generation, raw.tag, raw.consumer, _priority(props)),
            attempt=_attempt(headers, raw.redelivered),
            lease_deadline=deadline,
            corrupt=_malformed(props, headers),
        )

    # -- settling --------------------------------------------------------------------------
    def _claim(self, deliveries: Sequence[Delivery]) -> tuple[list[Delivery], list[Delivery]]:
        """Split into (valid, stale) and take the valid ones out of the unsettled set."""
        valid: list[Delivery] = []
        stale: list[Delivery] = []
        io = self._io
        with self._lock:
            for d in deliveries:
                r = d.receipt
                if (
                    isinstance(r, Receipt)
                    and io.alive
                    and r.generation == io.generation
                    and r.tag in self._unacked
                ):
                    del self._unacked[r.tag]
                    if r.consumer is not None:
                        r.consumer.outstanding -= 1
                    valid.append(d)
                else:
                    stale.append(d)
        return valid, stale

    def _unclaim(self, deliveries: Sequence[Delivery]) -> None:
        io = self._io
        with self._lock:
            for d in deliveries:
                r = d.receipt
                if r.generation == io.generation and io.alive:
                    self._unacked[r.tag] = d.queue
                    if r.consumer is not None:
                        r.consumer.outstanding += 1

    def _settle(
        self, valid: list[Delivery], stale: list[Delivery], fn: Callable[[], None], operation: str
    ) -> None:
        if valid:
            try:
                self._io.call(fn)
            except StaleReceipt:
                raise
            except TransientAdapterError as exc:
                # The connection is gone: RabbitMQ requeued these deliveries.
                log.warning("%s failed, the connection is gone: %s", operation, exc)
                stale = [*stale, *valid]
        if stale:
            raise StaleReceipt(stale, operation)

    def ack(self, deliveries: Sequence[Delivery]) -> None:
        """Late acks: posted without waiting for an answer (``basic.ack`` has none; a lost
        one is a redelivery, which at-least-once allows): sent by this thread when the
        connection is free for it, else by the I/O thread (:meth:`IOThread.post
        <ackwise_rabbitmq._io.IOThread.post>`).

        When the I/O loop has not turned for a while, or two of its turns came far apart
        (this process was paused, say: :meth:`IOThread.fresh
        <ackwise_rabbitmq._io.IOThread.fresh>`), the connection may be gone without
        the adapter knowing.  A turn after a pause does not tell: it stops at a short read,
        and the heartbeats the broker sent before it closed the connection come before the
        close.  Then the acks are followed by a barrier, a method the broker answers on the
        same channel (as :meth:`ack_before_start`): its answer proves the connection alive
        and the acks taken in, and its failure reports the receipts stale.
        """
        if not deliveries:
            return
        io = self._io
        if io.fresh(_FRESH_LOOP):
            valid, stale = self._claim(deliveries)
            if valid:
                generation = valid[0].receipt.generation
                tags = [d.receipt.tag for d in valid]

                def post() -> None:
                    ch = io.consume_channel_of(generation)
                    if ch is None:
                        return  # that connection is gone: the broker requeued them
                    for tag in tags:
                        _pika_private.send_ack(ch, tag)

                try:
                    io.post(post)
                except TransientAdapterError:
                    stale = [*stale, *valid]
            if stale:
                raise StaleReceipt(stale, "ack")
            return
        valid, stale = self._claim(deliveries)

        def run() -> None:
            io.check_live()
            ch = io.consume_channel
            for d in valid:
                _pika_private.send_ack(ch, d.receipt.tag)
            # The barrier: same value, no change; answered after the acks were taken in.
            ch.basic_qos(prefetch_count=self._qos)

        self._settle(valid, stale, run, "ack")
        io.answered()  # the broker answered after the pause: the connection lives

    def ack_before_start(self, deliveries: Sequence[Delivery]) -> None:
        """Ack, then wait for the broker to have taken the acks in (``Ack.EARLY``).

        ``basic.ack`` has no answer: an ack still in the socket when the broker stops or the
        connection breaks is lost, and the message is delivered again, which an at-most-once
        task must never see.  So a synchronous method follows on the same channel: the
        broker handles a channel's frames in order, so its answer means every ack before it
        reached the channel and was passed on to the queue.  If the answer does not come
        the acks are reported stale and the worker does not start those tasks (at worst one
        is lost, never run twice).
        """
        if not deliveries:
            return
        with self._lock:
            # Full windows, counted before these deliveries are settled here (the broker still
            # counts them): nothing can be on its way to those consumers.
            full = [
                c
                for q in {d.queue for d in deliveries}
                for c in self._consumers.get(q, [])
                if c.outstanding >= c.credit
            ]
        valid, stale = self._claim(deliveries)

        def run() -> None:
            self._io.check_live()
            ch = self._io.consume_channel
            # Stop the full windows before the acks free their slots (the tasks still run, so
            # the worker has no more room): the broker handles the cancels first.  A window
            # with room keeps its consumer (see _cancel), and what it pushes next waits here
            # for room.
            self._cancel(full)
            for d in valid:
                _pika_private.send_ack(ch, d.receipt.tag)
            # The barrier: same value, no change; the cancel-oks come before its answer.
            ch.basic_qos(prefetch_count=self._qos)

        self._settle(valid, stale, run, "ack")

    def extend(self, deliveries: Sequence[Delivery]) -> None:
        """Connection-based leases: a delivery is held while the connection lives (the I/O
        thread keeps it alive), so there is nothing to move; stale receipts still raise."""
        io = self._io
        with self._lock:
            stale = [
                d
                for d in deliveries
                if not (
                    isinstance(d.receipt, Receipt)
                    and io.alive
                    and d.receipt.generation == io.generation
                    and d.receipt.tag in self._unacked
                )
            ]
        if stale:
            raise StaleReceipt(stale, "extend")

    def nack(self, delivery: Delivery, *, delay: float = 0.0) -> None:
        """Return the message to its queue, ready after ``delay`` (checked) seconds."""
        valid, stale = self._claim([delivery])
        if stale:
            raise StaleReceipt(stale, "nack")
        tag = delivery.receipt.tag
        if delay <= 0 and self.settings.queue_type == "quorum":

            def requeue() -> None:
                self._io.check_live()
                self._io.consume_channel.basic_nack(tag, requeue=True)  # x-delivery-count + 1

            self._settle(valid, [], requeue, "nack")
            return
        # Republish (into a delay tier), confirmed, then ack: a crash in between duplicates
        # the message, never loses it.  The count so far travels in our header.
        item = self._publisher.route(
            delivery.queue,
            Outgoing(delivery.message_id, delivery.body, delay, delivery.receipt.priority),
            {H_DELIVERIES: delivery.attempt},
        )
        top = tier(delay_ms(delay)) if delay > 0 else -1
        self._republish_then_ack(delivery, item, "nack", top)

    def _republish_then_ack(
        self,
        delivery: Delivery,
        item: tuple[str, str, bytes, Any],
        operation: str,
        top: int = -1,
    ) -> None:
        """Publish ``item`` (confirmed; into the delay tiers up to ``top``, declared first
        unless this adapter did), then ack the delivery."""
        tag = delivery.receipt.tag

        def run() -> None:
            self._io.check_live()
            self._publisher.publish_tiered(delivery.queue, [item], top, io_thread=True)
            self._io.consume_channel.basic_ack(tag)

        try:
            self._settle([delivery], [], run, operation)
        except (PermanentAdapterError, UnsupportedCapability):
            self._unclaim([delivery])  # nothing was sent: the delivery is still ours
            raise

    def dead_letter(self, delivery: Delivery, *, reason: str, body: bytes | None = None) -> None:
        """Move the message to its queue's dead letters: republished there, then acked."""
        _, stale = self._claim([delivery])
        if stale:
            raise StaleReceipt(stale, "dead_letter")
        props = self._publisher.dead_props(
            delivery.message_id, reason, time.time(), delivery.attempt, delivery.receipt.priority
        )
        item = ("", self._topology.aux(delivery.queue, "dead"), _dead_body(delivery, body), props)
        self._republish_then_ack(delivery, item, "dead_letter")
