"""Receiving: ``ReceiveMessage`` under a visibility lease, each message's delivery and receipt,
and the re-arm (by visibility) of long delays received before they are due.

See the adapter's overview (:mod:`ackwise_sqs._adapter`): *lease*, *receipt*, *attempt*,
*delay*, *malformed messages*.
"""

from __future__ import annotations

import logging
import math
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from ackwise.errors import AdapterError, PermanentAdapterError
from ackwise.spi import Delivery
from ackwise_sqs._client import Client, _slices
from ackwise_sqs._limits import _BATCH, MAX_VISIBILITY
from ackwise_sqs._messages import _Malformed, _message_id, _number, _raw, _unframe
from ackwise_sqs._topology import Topology, _Queue
from ackwise_sqs._url import SQSSettings

__all__ = ["Receiver", "SQSReceipt", "visibility"]

# The adapter's one logger, named as before it was split into modules.
log = logging.getLogger("ackwise_sqs._adapter")


@dataclass(eq=False)
class SQSReceipt:
    """One receive of one message: its handle and what this adapter knows of its lease."""

    handle: str
    queue_url: str
    received_at: float
    deadline: float
    settled: bool = False
    #: A DeleteMessage for it failed on a broker error: it may have gone through.  Deleting
    #: again (within the lease) is what SQS answers for both cases alike.
    deleting: bool = False

    def __repr__(self) -> str:
        return f"SQSReceipt({self.handle[:12]}…, deadline={self.deadline:.3f})"


def visibility(lease: float) -> int:
    """The visibility timeout of a lease of ``lease`` seconds: whole seconds, rounded up."""
    if lease > MAX_VISIBILITY:
        raise PermanentAdapterError(
            f"lease {lease}s exceeds SQS's visibility cap of {MAX_VISIBILITY}s (12 hours)"
        )
    return max(0, math.ceil(lease))


class Receiver:
    """Receiving deliveries, and re-arming the messages not due yet."""

    def __init__(self, settings: SQSSettings, client: Client, topology: Topology) -> None:
        self.settings = settings
        self._client = client
        self._topology = topology
        #: Early receives of long delays re-armed by visibility (not deliveries).
        self.rearmed = 0
        self._counting = threading.Lock()

    # -- consuming -------------------------------------------------------------------------
    def receive(
        self, queue: str, *, max_messages: int, wait: float, lease: float
    ) -> Sequence[Delivery]:
        if max_messages <= 0:
            return []
        info = self._topology.queue(queue)
        seconds = visibility(lease)
        wait_seconds = 0 if wait <= 0 else min(20, max(1, round(wait)))
        first = min(_BATCH, max_messages)
        out, full = self._receive_once(info, first, wait_seconds, seconds)
        rest = max_messages - first
        if full and rest > 0:
            # The queue had a full batch: the rest at once, one request per batch of 10 (a
            # queue that had less costs no request more).
            sizes = [min(_BATCH, rest - i) for i in range(0, rest, _BATCH)]
            got, error = self._client.parallel(
                lambda n: self._receive_once(info, n, 0, seconds)[0], sizes
            )
            for deliveries in got:
                out.extend(deliveries)
            if error is not None and not out:
                raise error
            if error is not None:
                # What the failed request took (if anything) comes back after its lease.
                log.warning("SQS ReceiveMessage failed for part of a receive: %s", error)
        return out

    def _receive_once(
        self, info: _Queue, n: int, wait_seconds: int, visibility: int
    ) -> tuple[list[Delivery], bool]:
        """One ReceiveMessage: (the deliveries, whether SQS returned all ``n`` asked for)."""
        started = time.time()
        got = self._client.call(
            "ReceiveMessage",
            QueueUrl=info.url,
            MaxNumberOfMessages=n,
            WaitTimeSeconds=wait_seconds,
            VisibilityTimeout=visibility,
            MessageSystemAttributeNames=[
                "ApproximateReceiveCount",
                "ApproximateFirstReceiveTimestamp",
            ],
            MessageAttributeNames=["All"],
        ).get("Messages", [])
        out: list[Delivery] = []
        early: list[tuple[str, int]] = []
        now = time.time()
        # The visibility clock starts when SQS takes the message: not before the request that
        # answered was sent (botocore may have retried it after a reset: the retry's send),
        # and during a long poll, when one arrives.  Counting from the call's start would
        # shorten the lease by the wait; the take is assumed no more than a second before the
        # answer came back.
        sent = self._client.last_send(started)
        taken = max(sent, now - 1.0) if wait_seconds else sent
        # A re-arm may hide a message for what is left of the 12 hours this receive may hold
        # it (counted from before the request, and a second early for the re-arm's flight).
        room = MAX_VISIBILITY - math.ceil(now - started) - 1
        for m in got:
            try:
                body, due = _unframe(m, now)
            except _Malformed as exc:
                # Handed over, never raised: a raise would stop the worker, and the next one
                # when the message comes back.
                out.append(self._delivery(info, m, taken, visibility, _raw(m["Body"]), None, exc))
                continue
            if due is not None and due > now:
                # Not a delivery: hide it until due, or as long as this receive may.
                early.append((m["ReceiptHandle"], min(room, math.ceil(due - now))))
                continue
            out.append(self._delivery(info, m, taken, visibility, body, due))
        if early:
            self._rearm(info, early)
            with self._counting:
                self.rearmed += len(early)
        return out, len(got) >= n

    def _delivery(
        self,
        info: _Queue,
        m: dict[str, Any],
        taken: float,
        visibility: int,
        body: bytes,
        due: float | None,
        malformed: _Malformed | None = None,
    ) -> Delivery:
        """The delivery of a received message; ``malformed`` marks one ackwise did not frame
        (the worker dead-letters it as it is, ``body`` being the record's own bytes)."""
        system = m.get("Attributes", {})
        count = int(system.get("ApproximateReceiveCount", "1"))
        first = _number({"StringValue": system.get("ApproximateFirstReceiveTimestamp", "")})
        if due is not None and first is not None and first / 1000.0 < due - 0.5:
            count -= 1  # the first receive was the early one of a long delay
        deadline = taken + visibility
        return Delivery(
            queue=info.name,
            message_id=_message_id(m),
            body=body,
            receipt=SQSReceipt(m["ReceiptHandle"], info.url, taken, deadline),
            attempt=max(1, count),
            lease_deadline=deadline,
            corrupt=None if malformed is None else str(malformed),
        )

    def _rearm(self, info: _Queue, early: list[tuple[str, int]]) -> None:
        """Hide early messages until due.  A refused re-arm only brings them back sooner (after
        this receive's visibility, to be re-armed then): never worth the deliveries in hand."""
        for chunk in _slices(early, _BATCH):
            try:
                self._client.call(
                    "ChangeMessageVisibilityBatch",
                    QueueUrl=info.url,
                    Entries=[
                        {"Id": str(i), "ReceiptHandle": h, "VisibilityTimeout": v}
                        for i, (h, v) in enumerate(chunk)
                    ],
                )
            except AdapterError as exc:
                log.warning(
                    "SQS: re-arming %d message(s) not due yet on %s failed (%s); they come "
                    "back after the receive's visibility and are re-armed then",
                    len(chunk),
                    info.name,
                    exc,
                )
