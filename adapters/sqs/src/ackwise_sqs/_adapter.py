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

The code is one part per concern, each a class in its own module building on the parts it
uses: :mod:`~ackwise_sqs._client` (the boto3 client, its calls and their parallel requests),
:mod:`~ackwise_sqs._topology` (queue names, creation, redrive policy),
:mod:`~ackwise_sqs._publish` (sending), :mod:`~ackwise_sqs._receive` (receiving, receipts,
the re-arm of long delays), :mod:`~ackwise_sqs._settle` (ack, extend, nack, dead letter) and
:mod:`~ackwise_sqs._browse` (stats, dead letters, purge).  :mod:`~ackwise_sqs._messages` reads
and writes ackwise's attributes and bodies (plain functions); :mod:`~ackwise_sqs._limits`
holds SQS's limits.
"""

from __future__ import annotations

from ackwise.spi import AttemptCount, Capabilities, LeaseExtension
from ackwise_sqs._browse import _Browsing
from ackwise_sqs._client import _Client
from ackwise_sqs._limits import _BATCH, MAX_DELAY, MAX_MESSAGE_SIZE, MAX_VISIBILITY
from ackwise_sqs._publish import _Publishing
from ackwise_sqs._receive import SQSReceipt, _Receiving
from ackwise_sqs._settle import _Settling
from ackwise_sqs._topology import _Topology, sqs_queue_name

__all__ = [
    "MAX_DELAY",
    "MAX_MESSAGE_SIZE",
    "MAX_VISIBILITY",
    "SQSAdapter",
    "SQSReceipt",
    "sqs_queue_name",
]


class SQSAdapter(_Browsing, _Settling, _Receiving, _Publishing, _Topology, _Client):
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
