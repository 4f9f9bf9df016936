"""Settling deliveries: the local fence against stale receipts, acks (early or late), lease
extension, nacks and dead letters, in batches where SQS has them.

See the adapter's overview (:mod:`ackwise_sqs._adapter`): *receipt*, *lease*, *dead letters*.
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable, Iterable, Sequence
from typing import Any

from botocore.exceptions import ClientError

from ackwise.errors import (
    AdapterError,
    MessageTooLarge,
    PermanentAdapterError,
    StaleReceipt,
    TransientAdapterError,
)
from ackwise.spi import Delivery, Outgoing
from ackwise_sqs._client import Client, _slices, _snake
from ackwise_sqs._errors import VisibilityCapReached, error_code
from ackwise_sqs._limits import _BATCH, MAX_VISIBILITY
from ackwise_sqs._messages import _ID, _dead_attrs
from ackwise_sqs._publish import Publisher
from ackwise_sqs._receive import SQSReceipt, visibility
from ackwise_sqs._topology import Topology, _Queue

__all__ = ["Settler"]

# The adapter's one logger, named as before it was split into modules.
log = logging.getLogger("ackwise_sqs._adapter")

#: Settling this close to a lease's deadline counts as stale: the request could arrive after it.
_FENCE_MARGIN = 0.2
_STALE_CODES = frozenset({"ReceiptHandleIsInvalid", "InvalidReceiptHandle", "MessageNotInflight"})


class Settler:
    """Ack, extend, nack and dead-letter deliveries, fenced by what is known of their leases."""

    def __init__(self, client: Client, topology: Topology, publisher: Publisher) -> None:
        self._client = client
        self._topology = topology
        self._publisher = publisher

    # -- settling --------------------------------------------------------------------------
    @staticmethod
    def _split(deliveries: Iterable[Delivery]) -> tuple[list[Delivery], list[Delivery]]:
        """Split into (valid, stale) by what this adapter knows of each lease."""
        now = time.time()
        valid: list[Delivery] = []
        stale: list[Delivery] = []
        for d in deliveries:
            r = d.receipt
            if not isinstance(r, SQSReceipt):
                raise PermanentAdapterError(f"not an SQS receipt: {r!r}")
            if r.settled or now + _FENCE_MARGIN >= r.deadline:
                stale.append(d)
            else:
                valid.append(d)
        return valid, stale

    def ack(self, deliveries: Sequence[Delivery]) -> None:
        """Delete the messages: 10 per DeleteMessageBatch, the requests at once.

        A request that failed on a broker error may have been carried out: the worker asks
        again after reconnecting, and SQS deletes a message it deleted already without
        complaint, so an early ack whose answer a cut swallowed is known as done (its task
        runs) as long as the lease lasts (the local fence, see :meth:`_split`).
        """
        valid, stale = self._split(deliveries)
        try:
            refused = self._batch(
                "DeleteMessageBatch",
                valid,
                lambda d, i: {"Id": str(i), "ReceiptHandle": d.receipt.handle},
            )
        except TransientAdapterError:
            for d in valid:
                d.receipt.deleting = True
            raise
        for d in valid:
            d.receipt.settled = True
        stale += refused
        if stale:
            raise StaleReceipt(_in_order(deliveries, stale), "ack")

    def extend(self, deliveries: Sequence[Delivery], *, lease: float) -> None:
        valid, stale = self._split(deliveries)
        now = time.time()
        wanted = visibility(lease)
        capped: list[Delivery] = []
        plan: list[tuple[Delivery, int]] = []
        for d in valid:
            room = MAX_VISIBILITY - math.ceil(now - d.receipt.received_at)
            if room < wanted:
                capped.append(d)
                if room <= 0:
                    continue
            plan.append((d, min(wanted, room)))
        by_delivery = dict((id(d), v) for d, v in plan)
        refused = self._batch(
            "ChangeMessageVisibilityBatch",
            [d for d, _ in plan],
            lambda d, i: {
                "Id": str(i),
                "ReceiptHandle": d.receipt.handle,
                "VisibilityTimeout": by_delivery[id(d)],
            },
        )
        refused_ids = {id(d) for d in refused}
        for d, v in plan:
            if id(d) not in refused_ids:
                d.receipt.deadline = now + v
        # A message whose delete may have gone through is no longer in flight, so SQS refuses
        # to extend it: that is no stale receipt, the delete asked again will say.
        stale += [d for d in refused if not d.receipt.deleting]
        if capped:
            log.error(
                "SQS cannot keep %d message(s) invisible past 12 hours per receive: %s",
                len(capped),
                ", ".join(d.message_id for d in capped[:5]),
            )
        if stale:
            raise StaleReceipt(_in_order(deliveries, stale), "extend")
        if capped:
            raise VisibilityCapReached(capped, MAX_VISIBILITY)

    def nack(self, delivery: Delivery, *, delay: float = 0.0) -> None:
        """Visible again after ``delay`` (checked by the adapter) seconds."""
        _, stale = self._split([delivery])
        if stale:
            raise StaleReceipt(stale, "nack")
        r: SQSReceipt = delivery.receipt
        if math.ceil(delay) + (time.time() - r.received_at) > MAX_VISIBILITY:
            # Past what visibility can hold for this receive: a fresh copy carries the delay.
            info = self._topology.queue(delivery.queue)
            out = Outgoing(delivery.message_id, delivery.body, delay)
            publisher = self._publisher
            publisher.send_batches(info, info.url, [publisher.entry(info, out, 0)], [out.id])
            self._settle_one("DeleteMessage", delivery, QueueUrl=r.queue_url)
            return
        self._settle_one(
            "ChangeMessageVisibility",
            delivery,
            QueueUrl=r.queue_url,
            VisibilityTimeout=math.ceil(delay),
        )

    def dead_letter(self, delivery: Delivery, *, reason: str, body: bytes | None = None) -> None:
        _, stale = self._split([delivery])
        if stale:
            raise StaleReceipt(stale, "dead_letter")
        info = self._topology.queue(delivery.queue)
        entry = self._dead_entry(info, delivery, reason, body)
        self._publisher.send_batches(info, info.dlq_url, [entry], [delivery.message_id])
        self._settle_one("DeleteMessage", delivery, QueueUrl=delivery.receipt.queue_url)

    def _dead_entry(
        self, info: _Queue, delivery: Delivery, reason: str, body: bytes | None
    ) -> dict[str, Any]:
        """The dead letter to send, built before anything is sent: ``body`` (the annotated
        envelope) with ackwise's attributes, else the delivered body with them, else the
        delivered body alone, which SQS held, so it fits."""
        extra = _dead_attrs(reason, time.time(), delivery.attempt)
        for candidate in [delivery.body] if body is None else [body, delivery.body]:
            out = Outgoing(delivery.message_id, candidate)
            try:
                return self._publisher.entry(info, out, 0, extra=extra, delay=0.0)
            except MessageTooLarge:
                continue
        log.warning(
            "message %s on %s: no room for ackwise's attributes beside it within the queue's "
            "MaximumMessageSize (%d bytes); dead-lettered (%s) without them, so it is listed "
            "as max_deliveries under the dead-letter queue's own message id",
            delivery.message_id,
            delivery.queue,
            info.max_size,
            reason,
        )
        entry = self._publisher.unchecked_entry(
            info, Outgoing(delivery.message_id, delivery.body), 0
        )
        del entry["MessageAttributes"][_ID]
        return entry

    def _settle_one(self, operation: str, delivery: Delivery, **params: Any) -> None:
        r: SQSReceipt = delivery.receipt
        try:
            self._client.call(operation, ReceiptHandle=r.handle, **params)
        except PermanentAdapterError as exc:
            if _is_stale(exc):
                r.settled = True
                raise StaleReceipt([delivery], _snake(operation)) from exc
            raise
        r.settled = True

    def _batch(
        self,
        operation: str,
        deliveries: list[Delivery],
        entry: Callable[[Delivery, int], dict[str, Any]],
    ) -> list[Delivery]:
        """Run a batch operation (10 per request, requests at once); return the stale ones."""
        chunks = [
            (url, chunk)
            for url, group in _by_queue_url(deliveries).items()
            for chunk in _slices(group, _BATCH)
        ]
        results, error = self._client.parallel(
            lambda c: self._batch_request(operation, c[0], c[1], entry), chunks
        )
        if error is not None:
            raise error
        stale = [d for found, _ in results for d in found]
        errors = [e for _, errs in results for e in errs]
        if errors:
            raise PermanentAdapterError(f"SQS {operation} failed for {'; '.join(errors[:5])}")
        return stale

    def _batch_request(
        self,
        operation: str,
        url: str,
        chunk: list[Delivery],
        entry: Callable[[Delivery, int], dict[str, Any]],
    ) -> tuple[list[Delivery], list[str]]:
        """One batch request: (deliveries SQS refused as stale, other failures)."""
        out = self._client.call(
            operation, QueueUrl=url, Entries=[entry(d, i) for i, d in enumerate(chunk)]
        )
        stale: list[Delivery] = []
        errors: list[str] = []
        for f in out.get("Failed", []):
            d = chunk[int(f["Id"])]
            if f.get("Code") in _STALE_CODES:
                # ... unless a delete of it may have gone through: the retried delete decides.
                d.receipt.settled = not d.receipt.deleting
                stale.append(d)
            else:
                errors.append(f"{d.message_id}: {f.get('Code')}: {f.get('Message', '')}")
        return stale, errors


def _is_stale(exc: AdapterError) -> bool:
    cause = exc.__cause__
    return isinstance(cause, ClientError) and (
        error_code(cause) in _STALE_CODES or error_code(cause).endswith("MessageNotInflight")
    )


def _by_queue_url(deliveries: Iterable[Delivery]) -> dict[str, list[Delivery]]:
    by_url: dict[str, list[Delivery]] = {}
    for d in deliveries:
        by_url.setdefault(d.receipt.queue_url, []).append(d)
    return by_url


def _in_order(all_: Sequence[Delivery], subset: list[Delivery]) -> list[Delivery]:
    ids = {id(d) for d in subset}
    return [d for d in all_ if id(d) in ids]
