"""``sqs://``: the Amazon SQS adapter, on boto3.

How SQS carries ackwise's contract:

lease
    the visibility timeout: ``ReceiveMessage(VisibilityTimeout=lease)``, renewed with
    ``ChangeMessageVisibilityBatch``.  SQS counts visibility in whole seconds (leases are
    rounded up) and holds a message invisible at most 12 hours per receive: renewal past that
    raises :class:`~ackwise_sqs.VisibilityCapReached` (a stale receipt, reported by the worker).
receipt
    the ``ReceiptHandle`` plus what this adapter knows of the lease: when it was received, the
    deadline it last set, and whether it was settled.  SQS does not reliably refuse a stale
    receipt handle (its documentation: ``DeleteMessage`` with an old handle "succeeds, but the
    message might not be deleted"; moto deletes it), so the adapter fences settlements itself:
    a receipt whose deadline has passed (less a safety margin for the request's flight time), or
    that was settled already, raises :class:`~ackwise.errors.StaleReceipt` without a request.
attempt
    ``ApproximateReceiveCount`` (hence :attr:`AttemptCount.APPROXIMATE`), less one when the
    message's first receive was the early receive of a long delay (below).
delay
    ``DelaySeconds`` up to ``max_native_delay`` (900 s, SQS's limit).  A longer delay is sent
    with ``DelaySeconds=max_native_delay`` and its due time in the message attribute
    ``ackwise-due``; the receive that meets it before it is due re-arms it by visibility
    (``ChangeMessageVisibility(due - now)``) and hands nothing to the worker: that receive is
    not a delivery, and the attempt is corrected for it (``ApproximateFirstReceiveTimestamp``
    before the due time means the first receive was early).  FIFO queues have no per-message
    ``DelaySeconds``, so every delay on them takes this path.  ``nack(delay)`` sets the
    visibility.  The longest delay is 12 hours (:data:`MAX_DELAY`), SQS's visibility cap.
dead letters
    a dead-letter queue ``<name>-dlq`` per queue, wired by a redrive policy with
    ``maxReceiveCount = max_deliveries + 1`` (the worker dead-letters a message delivered
    ``max_deliveries + 1`` times itself, with the reason and the attempt history; the redrive
    policy is the backstop, and its extra one covers the early receive of a long delay).
    ``dead_letter`` sends to the DLQ with the reason in message attributes, then deletes.
bodies
    sent as they are when they are valid XML text in UTF-8 (JSON envelopes are); otherwise
    base64, marked by the attribute ``ackwise-enc``.
malformed messages
    one whose ``ackwise-id``, ``ackwise-enc`` or ``ackwise-due`` holds what ackwise never
    writes (a Binary value, an encoding other than base64, a body that is not that base64, a
    due time that is no number or more than 13 hours ahead) is delivered as a corrupt record
    (:attr:`~ackwise.Delivery.corrupt`), its body as SQS holds it.

The adapter holds one object per concern, each in its own module and using the parts it
needs by their methods only: the client (:class:`~ackwise_sqs._client.Client`: the boto3
client, its calls and their parallel requests), the topology
(:class:`~ackwise_sqs._topology.Topology`: queue names, creation, redrive policy), the
publisher (:class:`~ackwise_sqs._publish.Publisher`: sending), the receiver
(:class:`~ackwise_sqs._receive.Receiver`: receiving, receipts, the re-arm of long delays), the
settler (:class:`~ackwise_sqs._settle.Settler`: ack, extend, nack, dead letter) and the browser
(:class:`~ackwise_sqs._browse.Browser`: stats, dead letters, purge); the adapter checks delays
and priorities before it hands a call on.  :mod:`~ackwise_sqs._messages` reads
and writes ackwise's attributes and bodies (plain functions); :mod:`~ackwise_sqs._limits`
holds SQS's limits.
"""

from __future__ import annotations

from collections.abc import Sequence

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
from ackwise_sqs._browse import Browser
from ackwise_sqs._client import Client
from ackwise_sqs._limits import _BATCH, MAX_DELAY, MAX_MESSAGE_SIZE, MAX_VISIBILITY
from ackwise_sqs._publish import Publisher
from ackwise_sqs._receive import Receiver, SQSReceipt
from ackwise_sqs._settle import Settler
from ackwise_sqs._topology import Topology, sqs_queue_name
from ackwise_sqs._url import SQSSettings, parse_sqs_url

__all__ = [
    "MAX_DELAY",
    "MAX_MESSAGE_SIZE",
    "MAX_VISIBILITY",
    "SQSAdapter",
    "SQSReceipt",
    "sqs_queue_name",
]


class SQSAdapter(Adapter):
    """Amazon SQS through boto3: visibility leases, long polling, batches, redrive, FIFO."""

    name = "sqs"
    capabilities = Capabilities(
        native_delay=True,
        max_delay=MAX_DELAY,
        lease_extension=LeaseExtension.PER_MESSAGE,
        max_lease=float(MAX_VISIBILITY),
        attempt_count=AttemptCount.APPROXIMATE,
        native_dead_letter=True,
        max_message_size=MAX_MESSAGE_SIZE,
        multi_process=True,
        oldest_age=False,  # SQS has it only as a CloudWatch metric
        purge_delayed=False,  # messages within DelaySeconds cannot be received, hence deleted
        max_batch=_BATCH,
        # Every request costs a round trip and carries at most 10 messages: while tasks are
        # short the worker holds enough to receive and acknowledge in whole batches.
        deep_prefetch=True,
        time_resolution=1.0,  # VisibilityTimeout and DelaySeconds are whole seconds
    )

    def __init__(self, url: BrokerURL) -> None:
        super().__init__(url)
        self.settings: SQSSettings = parse_sqs_url(url)
        self._client = Client(self.settings)
        self._topology = Topology(self.settings, self._client)
        self._publisher = Publisher(self.settings, self._client, self._topology)
        self._receiver = Receiver(self.settings, self._client, self._topology)
        self._settler = Settler(self._client, self._topology, self._publisher)
        self._browser = Browser(self._client, self._topology, self._publisher)

    @property
    def calls(self) -> dict[str, int]:
        """API calls made, by operation name (for benchmarks and tests)."""
        return self._client.calls

    @property
    def rearmed(self) -> int:
        """Early receives of long delays re-armed by visibility (not deliveries)."""
        return self._receiver.rearmed

    def last_send(self, since: float) -> float:
        """When this thread's last HTTP attempt went out (``since`` if none did after it)."""
        return self._client.last_send(since)

    # -- lifecycle -------------------------------------------------------------------------
    def open(self) -> None:
        self._client.open()

    def close(self) -> None:
        self._client.close()

    # -- topology --------------------------------------------------------------------------
    def declare(self, queue: QueueSpec) -> None:
        self._topology.declare(queue)

    def delete_queue(self, queue: str) -> None:
        """Delete the queue and its dead-letter queue (SQS: a name is free again after 60 s)."""
        self._topology.delete_queue(queue)

    def queues(self) -> Sequence[str]:
        return self._topology.queues()

    # -- producing -------------------------------------------------------------------------
    def publish(self, queue: str, messages: Sequence[Outgoing]) -> None:
        if not messages:
            return
        for m in messages:
            self.check_delay(m.delay)
        self.check_priorities(messages)  # SQS has none
        self._publisher.publish(queue, messages)

    def publish_dead(self, queue: str, messages: Sequence[Outgoing], *, reason: str) -> None:
        if not messages:
            return
        self.check_priorities(messages)
        self._publisher.publish_dead(queue, messages, reason=reason)

    # -- consuming -------------------------------------------------------------------------
    def receive(
        self, queue: str, *, max_messages: int, wait: float, lease: float
    ) -> Sequence[Delivery]:
        """``ReceiveMessage`` with the lease as visibility (a long poll while ``wait`` lasts,
        up to 20 s); a full first batch has the rest fetched at once, in parallel.  A long
        delay met before it is due is re-armed, not delivered."""
        return self._receiver.receive(queue, max_messages=max_messages, wait=wait, lease=lease)

    def ack(self, deliveries: Sequence[Delivery]) -> None:
        """Delete the messages: 10 per DeleteMessageBatch, the requests at once (see
        :meth:`Settler.ack <ackwise_sqs._settle.Settler.ack>`)."""
        self._settler.ack(deliveries)

    def extend(self, deliveries: Sequence[Delivery], *, lease: float) -> None:
        """``ChangeMessageVisibilityBatch``; past 12 hours since the receive:
        :class:`~ackwise_sqs.VisibilityCapReached`."""
        self._settler.extend(deliveries, lease=lease)

    def nack(self, delivery: Delivery, *, delay: float = 0.0) -> None:
        """Visible again after ``delay``; a delay past what this receive's visibility can hold
        is carried by a fresh copy, and the delivery deleted."""
        self.check_delay(delay)
        self._settler.nack(delivery, delay=delay)

    def dead_letter(self, delivery: Delivery, *, reason: str, body: bytes | None = None) -> None:
        """Sent to the dead-letter queue with ackwise's attributes, then deleted."""
        self._settler.dead_letter(delivery, reason=reason, body=body)

    # -- inspection ------------------------------------------------------------------------
    def stats(self, queue: str) -> QueueStats:
        """Count from SQS's approximate attributes (see
        :meth:`Browser.stats <ackwise_sqs._browse.Browser.stats>`)."""
        return self._browser.stats(queue)

    def dead_letters(self, queue: str, *, limit: int = 100) -> Sequence[DeadLetter]:
        """The dead-letter queue, peeked (received briefly, then visible again)."""
        return self._browser.dead_letters(queue, limit=limit)

    def requeue_dead(self, queue: str, message_ids: Sequence[str]) -> int:
        """The chosen dead letters are sent to the queue, then deleted from the dead-letter
        queue (a crash in between replays one twice, never not at all)."""
        return self._browser.requeue_dead(queue, message_ids)

    def delete_dead(self, queue: str, message_ids: Sequence[str] | None = None) -> int:
        """Peeked, and the chosen ones deleted (all of them without ``message_ids``)."""
        return self._browser.delete_dead(queue, message_ids)

    def purge(self, queue: str) -> int:
        """Delete every receivable message (see
        :meth:`Browser.purge <ackwise_sqs._browse.Browser.purge>`)."""
        return self._browser.purge(queue)
