"""``amqp://``, ``amqps://``: the RabbitMQ adapter, on pika's ``BlockingConnection``.

**Threads.**  pika's ``BlockingConnection`` is not thread-safe and sends heartbeats only while
someone runs its I/O loop.  So the adapter owns an I/O thread that holds the connection and
never stops turning its loop (``process_data_events``): heartbeats keep flowing while a long,
CPU-bound task runs in the worker's executor.  The worker's consumer thread calls the adapter;
every pika call is handed to the I/O thread (a command queue woken by
``add_callback_threadsafe``).  An idle worker's ``receive``, waiting for a delivery, turns the
loop itself meanwhile (:meth:`IOThread.drive <ackwise_rabbitmq._io.IOThread.drive>`): the delivery reaches it without a hand-off.
The I/O thread then stands aside until a call wakes it or 0.5 s pass; a call made meanwhile
while no receive drives (the acks of finished tasks) runs on the caller's thread
(:meth:`IOThread._run_own_call <ackwise_rabbitmq._io.IOThread._run_own_call>`), as a producer's calls do while nothing consumes.

**Receiving**: the first ``receive`` of a queue starts a consumer (``basic.consume``) whose
window (``basic.qos``, per consumer) is what the worker asked for; the broker pushes into an
inbox on the I/O thread and ``receive`` takes from it without a round trip.  A late ack frees
a slot just as the finished task frees room in the worker, so the window tracks the worker's
prefetch budget; a budget that grows gets another consumer for the difference, never a
replacement (a quorum queue takes back, and counts as a delivery, what was on its way to a
cancelled consumer).  An early ack would free a slot while its task still runs, so
:meth:`RabbitMQAdapter.ack_before_start` cancels the full windows first (the next ``receive``
starts one with the room left); a window with room keeps its consumer, for the same reason,
and what it pushes next waits for room.  At a graceful stop,
:meth:`RabbitMQAdapter.stop_receiving` cancels the consumers and rejects what the inbox holds
back to the queue at once.  A worker reading several queues has its windows per queue.

**Topology** of a queue ``q`` (``p`` is the URL's ``prefix``, default ``ackwise``).
``declare`` makes the first two; the rest, the delay tiers, are declared when a delay first
needs them (tiers 0 to the one it enters, bottom up; once per process)::

    q                     the queue: durable, quorum (classic with ?queue_type=classic);
                          dead-lettering through the default exchange to p.q.dead;
                          x-delivery-limit = max_deliveries; x-dead-letter-strategy
                          at-least-once (quorum)
    p.q.dead              dead letters: a durable classic queue (quorum with
                          ?aux_queue_type=quorum; x-delivery-limit 1,000,000)
    p.q.deliver → q       a fanout exchange: the last hop of a delay
    p.q.delay.k → p.q.wait.k   delay tier k (0 ≤ k < 32): a topic exchange and a durable
                          classic queue (quorum with ?aux_queue_type=quorum: dead-lettered
                          at least once) whose messages live 2**k ms, then are dead-lettered
                          to tier k-1's exchange (tier 0: to p.q.deliver)

A queue declared by an earlier ackwise dead-letters through a fanout exchange ``p.q.dlx``
(bound to ``p.q.dead``), which is kept.  The adapter remembers which tiers it declared; a
publish into a tier deleted since (``delete_queue`` elsewhere) is refused by RabbitMQ, never
dropped (a closed channel, a returned message): the tiers are declared again and what was not
stored is sent again (:mod:`ackwise_rabbitmq._publish`, :mod:`ackwise_rabbitmq._confirms`).

**Delays** are binary: a delay of ``d`` ms is published with the routing key of its 32 bits
(``"b31.b30.….b0"``) to the exchange of its highest set bit; exchange ``k`` routes a message
whose bit ``k`` is 1 into the wait queue of tier ``k`` and one whose bit is 0 straight on to
exchange ``k-1``.  Each tier has one TTL, so its queue expires in FIFO order; a message visits
only the tiers of its set bits.  Nothing is held unacked in a worker meanwhile, so a delay
longer than the broker's ``consumer_timeout`` is safe.  Resolution: 1 ms (rounded up, never
early); longest delay ``2**32 - 1`` ms (about 49.7 days).

**Receipts.**  AMQP acknowledgements are per channel: a receipt is ``(connection generation,
delivery tag)``.  A receipt from an earlier connection (it closed, so RabbitMQ requeued the
message), or one already settled, is stale: settling it raises
:class:`~ackwise.errors.StaleReceipt` and sends nothing (an unknown tag would make RabbitMQ
close the channel with every other delivery on it).

**Delivery count**: ``x-delivery-count`` of quorum queues, plus ackwise's own
``x-ackwise-deliveries`` header carried by messages that the adapter republishes (a delayed
nack); classic queues have only the ``redelivered`` flag (counted as one more delivery).

**Malformed messages** (another client's): one without a UTF-8 ``message_id``, with a
delivery-count header that is no small non-negative integer, or with headers pika cannot
decode (a timestamp past year 9999; the connection decodes such a frame without its headers)
is handed over as a corrupt delivery (:attr:`~ackwise.Delivery.corrupt`), under a stand-in id
derived from its body where it has none.

**Stats**: ``ready``, ``delayed`` and ``dead`` are exact (``queue.declare`` passive on the
queue, its wait queues that exist and its dead-letter queue).  ``in_flight`` is exact only with the
management API (``?management=http://host:15672``), and then lags by the broker's
``collect_statistics_interval``; without it, it counts this adapter's own unsettled
deliveries.  ``oldest_age`` likewise needs the management API (0.0 without).

**Dead letters** live in a queue, so listing, replaying and deleting some of them reads the
whole dead-letter queue through a channel of its own (``basic.get``) and closes it to put back
what stays: O(size of the dead-letter queue) per call; deleting all is one ``queue.purge``.

**Code**: the adapter holds one object per concern and hands each call to the one it concerns:
the connection (:class:`~ackwise_rabbitmq._io.IOThread`: its I/O thread, the calls handed to
it, and the publishing channel's confirms, :mod:`~ackwise_rabbitmq._confirms`), the topology
(:class:`~ackwise_rabbitmq._topology.Topology`: names, declaration, delay tiers), the
publisher (:class:`~ackwise_rabbitmq._publish.Publisher`: routing, confirmed publishing), the
consumer (:class:`~ackwise_rabbitmq._consume.Consumer`: consumer windows, receiving,
settling; it hears of each connection as the I/O thread's listener) and the browser
(:class:`~ackwise_rabbitmq._browse.Browser`: stats, dead letters).  Each builds on those
before it, by their methods only.  :mod:`~ackwise_rabbitmq._messages` reads and writes the
messages' headers, and :mod:`~ackwise_rabbitmq._pika_private` is the only code that touches
pika's private API.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

from ackwise.errors import MessageTooLarge, UnsupportedCapability
from ackwise.spi import (
    Adapter,
    AttemptCount,
    BrokerURL,
    Capabilities,
    DeadLetter,
    Delivery,
    LeaseExtension,
    Outgoing,
    QueueSpec,
    QueueStats,
)
from ackwise_rabbitmq._browse import Browser
from ackwise_rabbitmq._consume import Consumer, Receipt
from ackwise_rabbitmq._io import IOThread
from ackwise_rabbitmq._messages import MAX_MESSAGE_SIZE
from ackwise_rabbitmq._publish import Publisher
from ackwise_rabbitmq._topology import DELAY_TIERS, MAX_DELAY_MS, Topology
from ackwise_rabbitmq._url import RabbitMQSettings, parse_rabbitmq_url

__all__ = ["DELAY_TIERS", "MAX_MESSAGE_SIZE", "RabbitMQAdapter", "Receipt"]


class RabbitMQAdapter(Adapter):
    """Adapter for one RabbitMQ node (or a cluster behind one address)."""

    name = "rabbitmq"
    capabilities = Capabilities(
        native_delay=True,
        max_delay=MAX_DELAY_MS / 1000.0,
        lease_extension=LeaseExtension.CONNECTION,
        max_lease=None,
        attempt_count=AttemptCount.EXACT,
        native_dead_letter=True,
        max_message_size=MAX_MESSAGE_SIZE,
        multi_process=True,
        # AMQP cannot look at a quorum queue's head without delivering it (a delivery
        # counts), and the management API gives quorum queues no head timestamp.
        oldest_age=False,
        # A quorum queue frees a window slot only once the ack went through its log: a fast
        # worker needs a deeper window than 4 x concurrency to keep busy.
        deep_prefetch=True,
        # basic.qos counts a delivery until its ack arrives.
        push_window=True,
        # Publishes queue for the connection; those that overlap share a confirm wait.
        concurrent_publish=True,
    )

    def __init__(self, url: BrokerURL) -> None:
        super().__init__(url)
        self.settings: RabbitMQSettings = parse_rabbitmq_url(url)
        # How long the broker lets a delivery stay unacknowledged is the URL's
        # consumer_timeout (AMQP cannot read it).
        # Without the management API, stats() sees only this connection's unacknowledged
        # deliveries (AMQP counts ready messages only).
        self.capabilities = dataclasses.replace(
            type(self).capabilities,
            max_hold=self.settings.consumer_timeout,
            global_in_flight=bool(self.settings.management),
            priorities=self.settings.priorities,
        )
        settings = self.settings
        self._io = IOThread(settings)
        self._topology = Topology(settings, self._io)
        self._publisher = Publisher(settings, self._io, self._topology)
        self._consumer = Consumer(settings, self._io, self._topology, self._publisher)
        self._io.listen(self._consumer)
        self._browser = Browser(settings, self._io, self._topology, self._publisher, self._consumer)

    @classmethod
    def lease_options(cls, lease: float) -> dict[str, str]:
        """Heartbeats of twice the lease: a frozen consumer's connection, and so its
        deliveries, end after about two missed heartbeats."""
        return {"heartbeat": str(max(1, round(2 * lease)))}

    def __repr__(self) -> str:
        return f"<RabbitMQAdapter {self.settings.where} {self.settings.queue_type}>"

    # -- lifecycle -------------------------------------------------------------------------
    def open(self) -> None:
        self._io.open()

    def close(self) -> None:
        self._io.close()

    # -- topology --------------------------------------------------------------------------
    def declare(self, queue: QueueSpec) -> None:
        self._topology.declare(queue)

    def delete_queue(self, queue: str) -> None:
        """Delete the queue, its dead-letter and delay queues, and its exchanges (every name
        ackwise could have declared: what does not exist is skipped)."""
        self._topology.delete_queue(queue)

    # -- producing -------------------------------------------------------------------------
    def _check(self, messages: Sequence[Outgoing]) -> None:
        for m in messages:
            if len(m.body) > MAX_MESSAGE_SIZE:
                raise MessageTooLarge(
                    f"message {m.id}: {len(m.body)} bytes exceeds the RabbitMQ broker's limit "
                    f"of {MAX_MESSAGE_SIZE}; nothing was published"
                )
            if m.delay > 0:
                self.check_delay(m.delay)
        self.check_priorities(messages)

    def publish(self, queue: str, messages: Sequence[Outgoing]) -> None:
        if not messages:
            return
        self._topology.check_name(queue)
        self._check(messages)
        self._publisher.publish(queue, messages)

    def publish_dead(self, queue: str, messages: Sequence[Outgoing], *, reason: str) -> None:
        if not messages:
            return
        self._topology.check_name(queue)
        self._check(messages)
        self._publisher.publish_dead(queue, messages, reason=reason)

    # -- consuming -------------------------------------------------------------------------
    def receive(
        self, queue: str, *, max_messages: int, wait: float, lease: float
    ) -> Sequence[Delivery]:
        return self._consumer.receive(queue, max_messages=max_messages, wait=wait, lease=lease)

    def stop_receiving(self) -> None:
        """Cancel every consumer and give back at once what they pushed and no one took."""
        self._consumer.stop_receiving()

    def ack(self, deliveries: Sequence[Delivery]) -> None:
        """Late acks, posted without waiting for an answer: see
        :meth:`Consumer.ack <ackwise_rabbitmq._consume.Consumer.ack>`."""
        self._consumer.ack(deliveries)

    def ack_before_start(self, deliveries: Sequence[Delivery]) -> None:
        """Ack, then wait for the broker to have taken the acks in (``Ack.EARLY``): see
        :meth:`Consumer.ack_before_start <ackwise_rabbitmq._consume.Consumer.ack_before_start>`."""
        self._consumer.ack_before_start(deliveries)

    def extend(self, deliveries: Sequence[Delivery], *, lease: float) -> None:
        # Connection-based leases: nothing to move; stale receipts still raise.
        self._consumer.extend(deliveries)

    def nack(self, delivery: Delivery, *, delay: float = 0.0) -> None:
        self.check_delay(delay)
        self._consumer.nack(delivery, delay=delay)

    def dead_letter(self, delivery: Delivery, *, reason: str, body: bytes | None = None) -> None:
        self._consumer.dead_letter(delivery, reason=reason, body=body)

    # -- inspection ------------------------------------------------------------------------
    def stats(self, queue: str) -> QueueStats:
        self._topology.check_name(queue)
        return self._browser.stats(queue)

    def queues(self) -> Sequence[str]:
        names = self._browser.queues()
        if names is None:
            raise UnsupportedCapability(
                self.name, "listing queues", "needs the management API (?management=http://…)"
            )
        return names

    def dead_letters(self, queue: str, *, limit: int = 100) -> Sequence[DeadLetter]:
        self._topology.check_name(queue)
        return self._browser.dead_letters(queue, limit=limit)

    def requeue_dead(self, queue: str, message_ids: Sequence[str]) -> int:
        self._topology.check_name(queue)
        return self._browser.requeue_dead(queue, message_ids)

    def delete_dead(self, queue: str, message_ids: Sequence[str] | None = None) -> int:
        self._topology.check_name(queue)
        return self._browser.delete_dead(queue, message_ids)

    def purge(self, queue: str) -> int:
        """Empty the queue and its delay tiers (those that exist; they stay declared: a
        publisher elsewhere may count on them)."""
        self._topology.check_name(queue)
        return self._browser.purge(queue)
