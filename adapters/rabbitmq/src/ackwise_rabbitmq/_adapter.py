"""``amqp://``, ``amqps://``: the RabbitMQ adapter, on pika's ``BlockingConnection``.

**Threads.**  pika's ``BlockingConnection`` is not thread-safe and sends heartbeats only while
someone runs its I/O loop.  So the adapter owns an I/O thread that holds the connection and
never stops turning its loop (``process_data_events``): heartbeats keep flowing while a long,
CPU-bound task runs in the worker's executor.  The worker's consumer thread calls the adapter;
every pika call is handed to the I/O thread (a command queue woken by
``add_callback_threadsafe``).  An idle worker's ``receive``, waiting for a delivery, turns the
loop itself meanwhile (:meth:`_IOThread._drive`): the delivery reaches it without a hand-off.
The I/O thread then stands aside until a call wakes it or 0.5 s pass; a call made meanwhile
while no receive drives (the acks of finished tasks) runs on the caller's thread
(:meth:`_IOThread._run_own_call`), as a producer's calls do while nothing consumes.

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
stored is sent again (:mod:`ackwise_rabbitmq._publish`).

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

**Code**: the adapter is composed of one part per concern, each a class in its own module
building on the one before: :mod:`~ackwise_rabbitmq._io` (the connection, its I/O thread and
the calls handed to it), :mod:`~ackwise_rabbitmq._topology` (names, declaration, delay tiers),
:mod:`~ackwise_rabbitmq._publish` (confirmed publishing), :mod:`~ackwise_rabbitmq._consume`
(consumer windows, receiving, settling) and :mod:`~ackwise_rabbitmq._browse` (stats, dead
letters).  :mod:`~ackwise_rabbitmq._messages` reads and writes the messages' headers, and
:mod:`~ackwise_rabbitmq._pika_private` is the only code that touches pika's private API.
"""

from __future__ import annotations

import dataclasses

from ackwise.spi import AttemptCount, BrokerURL, Capabilities, LeaseExtension
from ackwise_rabbitmq._browse import _Browsing
from ackwise_rabbitmq._consume import Receipt, _Consuming
from ackwise_rabbitmq._io import _IOThread
from ackwise_rabbitmq._messages import MAX_MESSAGE_SIZE
from ackwise_rabbitmq._publish import _Publishing
from ackwise_rabbitmq._topology import DELAY_TIERS, MAX_DELAY_MS, _Topology

__all__ = ["DELAY_TIERS", "MAX_MESSAGE_SIZE", "RabbitMQAdapter", "Receipt"]


class RabbitMQAdapter(_Browsing, _Consuming, _Publishing, _Topology, _IOThread):
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

    @classmethod
    def lease_options(cls, lease: float) -> dict[str, str]:
        """Heartbeats of twice the lease: a frozen consumer's connection, and so its
        deliveries, end after about two missed heartbeats."""
        return {"heartbeat": str(max(1, round(2 * lease)))}

    def __repr__(self) -> str:
        return f"<RabbitMQAdapter {self.settings.where} {self.settings.queue_type}>"
