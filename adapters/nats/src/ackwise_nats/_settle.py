"""Settling deliveries: the local fence against stale receipts, then acks, lease extension,
nacks and dead letters, each answered by the server before the call returns.

JetStream applies an ack to whatever delivery of the message is pending, an older one's too,
so a receipt is checked here (:meth:`Settler._split`): stale once settled, or from
:data:`_FENCE` seconds before its lease's deadline (the ack could arrive after it).  The check
that counts is made on the loop, right before the request goes (:meth:`Settler._acks`): a
check on the calling thread can be seconds old by then (the process paused, a busy loop), and
an ack sent after the lease ended would remove another consumer's delivery.  A lease extension
counts only when its answer came before the old deadline: one that reached the server later
restarted the timer of whatever delivery was pending then, not necessarily this one.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterable, Sequence

from ackwise.errors import PermanentAdapterError, StaleReceipt
from ackwise.spi import Delivery
from ackwise_nats._client import Client
from ackwise_nats._connection import Connection
from ackwise_nats._headers import H_ATTEMPT, H_ATTEMPTS, H_DEAD_AT, H_ID, H_NOT_BEFORE, H_REASON
from ackwise_nats._receive import NatsReceipt, nak_delay

__all__ = ["Settler"]

#: Settling this close to a lease's deadline counts as stale: the ack could arrive after it.
_FENCE = 0.2


def _receipt(d: Delivery) -> NatsReceipt:
    r = d.receipt
    if not isinstance(r, NatsReceipt):
        raise PermanentAdapterError(f"not a NATS receipt: {r!r}")
    return r


class Settler:
    """Acks, lease extensions, nacks and dead letters, behind the fence of each receipt."""

    def __init__(self, connection: Connection) -> None:
        self._connection = connection
        self.settings = connection.settings

    @staticmethod
    def _split(deliveries: Iterable[Delivery]) -> tuple[list[Delivery], list[Delivery]]:
        """Split into (valid, stale) by what this adapter knows of each lease."""
        now = time.time()
        valid: list[Delivery] = []
        stale: list[Delivery] = []
        for d in deliveries:
            r = _receipt(d)
            (stale if r.settled or now + _FENCE >= r.deadline else valid).append(d)
        return valid, stale

    async def _acks(
        self, client: Client, deliveries: list[Delivery], payload: bytes
    ) -> list[Delivery]:
        """Send ``payload`` for each delivery still within its lease now, on the loop; mark
        the answered ones settled; return those whose lease ran out before it could go."""
        valid, late = self._split(deliveries)
        answers = await asyncio.gather(
            *(client.ack_request(_receipt(d).reply, payload) for d in valid),
            return_exceptions=True,
        )
        for d, answer in zip(valid, answers, strict=True):
            if not isinstance(answer, BaseException):
                _receipt(d).settled = True
        for answer in answers:
            if isinstance(answer, BaseException):
                raise answer
        return late

    def ack(self, deliveries: Sequence[Delivery]) -> None:
        """``+ACK`` each, waiting for the server's answers.  Asked again after a broker error
        (the worker does, for early acks), it acks again: the server answers for a message it
        removed already, and the fence still vouches that the lease was ours."""
        valid, stale = self._split(deliveries)
        if valid:
            stale += self._connection.call("ack", valid[0].queue, self._acks, valid, b"+ACK")
        if stale:
            raise StaleReceipt(stale, "ack")

    def extend(self, deliveries: Sequence[Delivery], *, lease: float) -> None:
        valid, stale = self._split(deliveries)
        if valid:
            stale += self._connection.call("extend", valid[0].queue, self._extend, valid, lease)
        if stale:
            raise StaleReceipt(stale, "extend")

    async def _extend(
        self, client: Client, deliveries: list[Delivery], lease: float
    ) -> list[Delivery]:
        # +WPI restarts the AckWait; any other lease is a nak with that delay.
        same = abs(lease - self.settings.ack_wait) <= 1e-3
        payload = b"+WPI" if same else nak_delay(lease)
        valid, late = self._split(deliveries)
        sent = time.time()
        answers = await asyncio.gather(
            *(client.ack_request(_receipt(d).reply, payload) for d in valid),
            return_exceptions=True,
        )
        answered = time.time()
        for d, answer in zip(valid, answers, strict=True):
            r = _receipt(d)
            # Answered while the old lease still held: the server restarted this delivery's
            # timer no earlier than ``sent``.  Answered later, or not at all, the request may
            # have found another delivery pending: the old deadline stands.
            if not isinstance(answer, BaseException) and answered + _FENCE < r.deadline:
                r.deadline = max(r.deadline, sent + lease)
        for answer in answers:
            if isinstance(answer, BaseException):
                raise answer
        return late

    def nack(self, delivery: Delivery, *, delay: float = 0.0) -> None:
        """A copy goes back (after ``delay`` seconds, checked by the adapter), then the
        original is acked."""
        _, stale = self._split([delivery])
        if not stale:
            stale = self._connection.call("nack", delivery.queue, self._nack, delivery, delay)
        if stale:
            raise StaleReceipt(stale, "nack")

    async def _nack(self, client: Client, d: Delivery, delay: float) -> list[Delivery]:
        if self._split([d])[1]:
            return [d]  # the lease ran out before this could start: change nothing
        # A copy carrying the deliveries so far goes to the ready subject (counted ready at
        # once: a -NAK'ed message stays ack-pending until pulled again) or, with a delay, to
        # the delayed one; then the original goes.  A crash in between leaves both: delivered
        # twice, never lost.  A nack asked again after a broker error copies once (dedup id).
        names = self._connection.names(d.queue)
        headers = {
            H_ID: d.message_id,
            H_ATTEMPTS: str(d.attempt),
            "Nats-Msg-Id": f"nack-{_receipt(d).stream_seq}-{d.attempt}",
        }
        subject = names.ready
        if delay > 0:
            headers[H_NOT_BEFORE] = f"{time.time() + delay:.6f}"
            subject = names.delayed
        await client.publish_all([(subject, d.body, headers)])
        return await self._acks(client, [d], b"+ACK")

    def dead_letter(self, delivery: Delivery, *, reason: str, body: bytes | None = None) -> None:
        _, stale = self._split([delivery])
        if not stale:
            stale = self._connection.call(
                "dead_letter", delivery.queue, self._dead_letter, delivery, reason, body
            )
        if stale:
            raise StaleReceipt(stale, "dead_letter")

    async def _dead_letter(
        self, client: Client, d: Delivery, reason: str, body: bytes | None
    ) -> list[Delivery]:
        if self._split([d])[1]:
            return [d]  # the lease ran out before this could start: change nothing
        headers = {
            H_ID: d.message_id,
            H_REASON: reason,
            H_DEAD_AT: f"{time.time():.6f}",
            H_ATTEMPT: str(d.attempt),
        }
        dead = self._connection.names(d.queue).dead
        await client.publish_all([(dead, d.body if body is None else body, headers)])
        return await self._acks(client, [d], b"+ACK")
