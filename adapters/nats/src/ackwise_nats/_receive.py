"""Receiving: no-wait pulls from the queue's ``ready`` consumer under a lease (polled while a
receive waits), and the move of due delayed messages from the ``delayed`` subject to the
``ready`` one.

*Lease.*  A pulled message is the consumer's until JetStream's redelivery timer fires.  That
timer is the consumer's AckWait from the delivery, or what a ``-NAK {"delay": d}`` sets: a
nak with a delay keeps the message pending (an ack still removes it) and redelivers it ``d``
after the nak.  A receive whose lease is the AckWait sends nothing more; any other lease is
set per message with such a nak, answered by the server before the receive returns.

*Receipt.*  JetStream accepts an ack of an older delivery of a message (it does not compare
delivery sequences), so staleness is decided here: a receipt carries the lease's deadline
(measured from before the pull, or the nak, was sent: never later than the server's timer)
and is stale from then on, or once settled (see ``_settle``).

*Attempt.*  JetStream's ``num_delivered`` (in the ack subject), plus the deliveries a copy's
``Ackwise-Attempts`` header carries over (a nack publishes a copy).

*Delay.*  A delayed message waits on the ``delayed`` subject with an ``Ackwise-Not-Before``
header.  A receive pulls that consumer too: a message not due yet is nak'ed with the time
left (JetStream holds it), a due one is published to ``ready`` (deduplicated by its stream
sequence, so a crash between the two steps cannot copy it twice within the dedup window)
and acked.  A due message therefore waits for the next receive on its queue (a waiting
receive looks every :data:`_DELAYED_EVERY` seconds, sooner when it knows one is due).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Sequence
from dataclasses import dataclass

from ackwise.errors import QueueNotFound, TransientAdapterError
from ackwise.spi import Delivery
from ackwise_nats._client import Client, Pulled
from ackwise_nats._connection import Connection
from ackwise_nats._errors import JetStreamError
from ackwise_nats._headers import H_ATTEMPTS, H_ID, H_NOT_BEFORE
from ackwise_nats._names import DELAYED_CONSUMER, READY_CONSUMER, QueueNames

__all__ = ["NatsReceipt", "Receiver", "nak_delay"]

#: A receive that waits polls the ready consumer, first after this pause, then after pauses
#: doubling up to the next (so an idle consumer makes about 10 requests a second).
_FIRST_PAUSE = 0.005
_MAX_PAUSE = 0.1
#: How often a waiting receive looks for due delayed messages (sooner when one is known due).
_DELAYED_EVERY = 0.5
#: Most delayed messages one receive looks at.
_MOVE_BATCH = 256


@dataclass(eq=False)
class NatsReceipt:
    """One delivery: its ack subject, and what this adapter knows of its lease."""

    reply: str
    stream_seq: int
    deadline: float
    settled: bool = False

    def __repr__(self) -> str:
        return f"NatsReceipt(seq={self.stream_seq}, deadline={self.deadline:.3f})"


def nak_delay(seconds: float) -> bytes:
    """A ``-NAK`` that has JetStream deliver the message again ``seconds`` from now."""
    return b'-NAK {"delay": %d}' % max(1, int(seconds * 1e9))


def _float(text: str | None) -> float | None:
    try:
        return float(text) if text is not None else None
    except ValueError:
        return None


class Receiver:
    """Pulls under a lease, and moves due delayed messages."""

    def __init__(self, connection: Connection) -> None:
        self._connection = connection
        self.settings = connection.settings
        #: Per queue, the soonest a delayed message this adapter saw comes due.
        self.due_hints: dict[str, float] = {}

    def receive(
        self, queue: str, *, max_messages: int, wait: float, lease: float
    ) -> Sequence[Delivery]:
        if max_messages <= 0:
            return []
        names = self._connection.names(queue)
        result: list[Delivery] = self._connection.call(
            "receive",
            queue,
            self._receive,
            names,
            max_messages,
            max(0.0, wait),
            lease,
            timeout=wait,
        )
        return result

    async def _receive(
        self, client: Client, names: QueueNames, n: int, wait: float, lease: float
    ) -> list[Delivery]:
        # Polled with no-wait pulls: a waiting pull that expires as a redelivery comes due
        # loses its answer on nats-server 2.9, and the redelivery its delivery count.
        loop = asyncio.get_running_loop()
        end = loop.time() + wait
        check_delayed = 0.0
        next_due: float | None = None
        pause = _FIRST_PAUSE
        while True:
            if loop.time() >= check_delayed:
                next_due = await self._move_due(client, names)
                check_delayed = loop.time() + _DELAYED_EVERY
            started = time.time()
            got = await self._pull(client, names, READY_CONSUMER, n)
            left = end - loop.time()
            if got or left <= 0:
                return await self._lease(client, names, got, started, lease)
            nap = min(left, pause, check_delayed - loop.time())
            if next_due is not None:
                nap = min(nap, next_due - time.time())
                if next_due <= time.time():
                    check_delayed = 0.0
            await asyncio.sleep(max(0.0, nap))
            pause = min(2 * pause, _MAX_PAUSE)

    async def _pull(self, client: Client, names: QueueNames, consumer: str, n: int) -> list[Pulled]:
        try:
            got, status = await client.pull(names.stream, consumer, n)
        except TimeoutError:
            # JetStream does not answer a pull from a consumer that does not exist.
            try:
                await client.api(f"CONSUMER.INFO.{names.stream}.{consumer}")
            except JetStreamError as exc:
                if exc.code != 404:
                    raise
                raise self._not_declared(names, consumer, exc.description) from exc
            raise
        if status is None or status == "404 No Messages" or status.startswith("408"):
            return got
        if got:
            return got  # (what ended the pull is for the next one to meet)
        if status.startswith(("503", "404")) or "Consumer Deleted" in status:
            raise self._not_declared(names, consumer, status)
        raise TransientAdapterError(f"{self.settings.where}: pull from {names.stream}: {status}")

    def _not_declared(self, names: QueueNames, consumer: str, why: str) -> QueueNotFound:
        return QueueNotFound(
            f"{self.settings.where}: queue {names.queue!r} is not declared (no consumer "
            f"{consumer!r} on stream {names.stream}: {why})"
        )

    async def _lease(
        self, client: Client, names: QueueNames, got: list[Pulled], started: float, lease: float
    ) -> list[Delivery]:
        ack_wait = self.settings.ack_wait
        deadlines = [started + min(lease, ack_wait)] * len(got)
        if got and abs(lease - ack_wait) > 1e-3:
            sent = time.time()
            answers = await asyncio.gather(
                *(client.ack_request(p.msg.reply or "", nak_delay(lease)) for p in got),
                return_exceptions=True,
            )
            # Answered: the server's timer is the nak's.  Not: either that or the AckWait.
            deadlines = [
                sent + lease
                if not isinstance(a, BaseException)
                else min(started + ack_wait, sent + lease)
                for a in answers
            ]
        return [self._delivery(names, p, d) for p, d in zip(got, deadlines, strict=True)]

    def _delivery(self, names: QueueNames, p: Pulled, deadline: float) -> Delivery:
        headers = p.msg.headers or {}
        message_id = headers.get(H_ID)
        base = headers.get(H_ATTEMPTS, "0")
        corrupt = None
        if not message_id:
            corrupt = f"no {H_ID} header: not published by ackwise"
            message_id = f"corrupt-{p.stream_seq}"
        elif not base.isdigit():
            corrupt = f"{H_ATTEMPTS} header {base[:40]!r} is not a count"
        return Delivery(
            queue=names.queue,
            message_id=message_id,
            body=p.msg.data,
            receipt=NatsReceipt(p.msg.reply or "", p.stream_seq, deadline),
            attempt=(int(base) if base.isdigit() else 0) + p.num_delivered,
            lease_deadline=deadline,
            corrupt=corrupt,
        )

    # -- delays ----------------------------------------------------------------------------
    async def _move_due(self, client: Client, names: QueueNames) -> float | None:
        """Move the due delayed messages to ``ready``; return when the next one is due, as far
        as this adapter knows (``None``: none known)."""
        hints = self.due_hints
        got = await self._pull(client, names, DELAYED_CONSUMER, _MOVE_BATCH)
        now = time.time()
        early: list[tuple[Pulled, float]] = []
        due: list[Pulled] = []
        for p in got:
            not_before = _float((p.msg.headers or {}).get(H_NOT_BEFORE))
            if not_before is not None and not_before > now + 0.001:
                early.append((p, not_before))
            else:
                due.append(p)  # due, or unreadable: delivered (as corrupt if need be) now
        if early:
            await asyncio.gather(
                *(client.ack_request(p.msg.reply or "", nak_delay(nb - now)) for p, nb in early)
            )
        if due:
            items = []
            for p in due:
                headers = {
                    k: v
                    for k, v in (p.msg.headers or {}).items()
                    if k not in (H_NOT_BEFORE, "Nats-Msg-Id")
                }
                headers["Nats-Msg-Id"] = f"due-{p.stream_seq}"
                items.append((names.ready, p.msg.data, headers))
            await client.publish_all(items)
            await asyncio.gather(*(client.ack_request(p.msg.reply or "", b"+ACK") for p in due))
        known = [t for t in (hints.get(names.queue), *(nb for _, nb in early)) if t and t > now]
        if known:
            soonest = min(known)
            hints[names.queue] = soonest
            return soonest
        hints.pop(names.queue, None)
        return None
