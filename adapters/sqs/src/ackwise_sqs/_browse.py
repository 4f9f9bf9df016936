"""Looking into a queue: its stats, its dead letters (listed, replayed, deleted: the dead-letter
queue is read by peeking, its messages received briefly and then made visible again), purge.

See the adapter's overview (:mod:`ackwise_sqs._adapter`): *dead letters*.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from ackwise.spi import DeadLetter, Outgoing, QueueStats
from ackwise_sqs._client import Client, _slices
from ackwise_sqs._limits import _BATCH
from ackwise_sqs._messages import (
    _ATTEMPT,
    _DEAD_AT,
    _dead_reason,
    _message_id,
    _number,
    _stored_body,
    _whole,
)
from ackwise_sqs._publish import Publisher
from ackwise_sqs._topology import Topology, _Queue

__all__ = ["Browser"]

_PEEK_VISIBILITY = 30
_PEEK_LIMIT = 10_000


class Browser:
    """Stats, the dead-letter queue (list, replay, delete) and purge."""

    def __init__(self, client: Client, topology: Topology, publisher: Publisher) -> None:
        self._client = client
        self._topology = topology
        self._publisher = publisher

    # -- dead letters ----------------------------------------------------------------------
    def _peek(self, url: str) -> list[dict[str, Any]]:
        """Take every message of ``url`` briefly, to look at it; see :meth:`_unpeek`."""
        seen: list[dict[str, Any]] = []
        while len(seen) < _PEEK_LIMIT:
            got = self._client.call(
                "ReceiveMessage",
                QueueUrl=url,
                MaxNumberOfMessages=_BATCH,
                WaitTimeSeconds=0,
                VisibilityTimeout=_PEEK_VISIBILITY,
                MessageSystemAttributeNames=["All"],
                MessageAttributeNames=["All"],
            ).get("Messages", [])
            seen.extend(got)
            if not got:
                break
        return seen

    def _unpeek(self, url: str, messages: list[dict[str, Any]]) -> None:
        for chunk in _slices(messages, _BATCH):
            self._client.call(
                "ChangeMessageVisibilityBatch",
                QueueUrl=url,
                Entries=[
                    {"Id": str(i), "ReceiptHandle": m["ReceiptHandle"], "VisibilityTimeout": 0}
                    for i, m in enumerate(chunk)
                ],
            )

    def _delete(self, url: str, messages: list[dict[str, Any]]) -> None:
        for chunk in _slices(messages, _BATCH):
            self._client.call(
                "DeleteMessageBatch",
                QueueUrl=url,
                Entries=[
                    {"Id": str(i), "ReceiptHandle": m["ReceiptHandle"]} for i, m in enumerate(chunk)
                ],
            )

    def _dead_letter_of(self, info: _Queue, m: dict[str, Any]) -> DeadLetter:
        """A message of the dead-letter queue as a :class:`DeadLetter`, whatever it holds."""
        attrs: dict[str, Any] = m.get("MessageAttributes", {})
        sent = int(m.get("Attributes", {}).get("SentTimestamp", "0")) / 1000.0
        dead_at = _number(attrs.get(_DEAD_AT))
        attempt = _whole(attrs.get(_ATTEMPT))
        return DeadLetter(
            queue=info.name,
            message_id=_message_id(m),
            body=_stored_body(m),
            reason=_dead_reason(attrs),
            dead_at=dead_at if dead_at is not None else sent,
            attempt=attempt if attempt is not None else (info.max_deliveries or 0) + 1,
        )

    def dead_letters(self, queue: str, *, limit: int = 100) -> Sequence[DeadLetter]:
        info = self._topology.queue(queue)
        peeked = self._peek(info.dlq_url)
        try:
            letters = [self._dead_letter_of(info, m) for m in peeked]
        finally:
            self._unpeek(info.dlq_url, peeked)
        letters.sort(key=lambda x: x.dead_at)
        return letters[:limit]

    def requeue_dead(self, queue: str, message_ids: Sequence[str]) -> int:
        info = self._topology.queue(queue)
        wanted = set(message_ids)
        peeked = self._peek(info.dlq_url)
        chosen = [m for m in peeked if self._dead_letter_of(info, m).message_id in wanted]
        rest = _without(peeked, chosen)
        try:
            if chosen:
                letters = [self._dead_letter_of(info, m) for m in chosen]
                entries = [
                    self._publisher.entry(info, Outgoing(x.message_id, x.body), i)
                    for i, x in enumerate(letters)
                ]
                # Published first, then deleted: a crash in between replays it twice, never 0.
                self._publisher.send_batches(
                    info, info.url, entries, [x.message_id for x in letters]
                )
                self._delete(info.dlq_url, chosen)
        finally:
            self._unpeek(info.dlq_url, rest)
        return len(chosen)

    def delete_dead(self, queue: str, message_ids: Sequence[str] | None = None) -> int:
        info = self._topology.queue(queue)
        peeked = self._peek(info.dlq_url)
        if message_ids is None:
            chosen = peeked
        else:
            wanted = set(message_ids)
            chosen = [m for m in peeked if self._dead_letter_of(info, m).message_id in wanted]
        rest = _without(peeked, chosen)
        try:
            self._delete(info.dlq_url, chosen)
        finally:
            self._unpeek(info.dlq_url, rest)
        return len(chosen)

    # -- inspection ------------------------------------------------------------------------
    def stats(self, queue: str) -> QueueStats:
        """Count from SQS's approximate attributes.

        ``in_flight`` includes messages hidden by ``nack(delay)`` or re-armed long delays (SQS
        shows them as not visible); ``oldest_age`` is 0.0: SQS publishes the age of the oldest
        message only as a CloudWatch metric.
        """
        info = self._topology.queue(queue)
        names = [
            "ApproximateNumberOfMessages",
            "ApproximateNumberOfMessagesDelayed",
            "ApproximateNumberOfMessagesNotVisible",
        ]
        main = self._client.call("GetQueueAttributes", QueueUrl=info.url, AttributeNames=names)[
            "Attributes"
        ]
        dead = self._client.call("GetQueueAttributes", QueueUrl=info.dlq_url, AttributeNames=names)[
            "Attributes"
        ]
        return QueueStats(
            queue=queue,
            ready=int(main.get(names[0], 0)),
            delayed=int(main.get(names[1], 0)),
            in_flight=int(main.get(names[2], 0)),
            dead=sum(int(dead.get(n, 0)) for n in names),
            oldest_age=0.0,
        )

    def purge(self, queue: str) -> int:
        """Delete every receivable message; messages still in ``DelaySeconds`` cannot be reached.

        Not ``PurgeQueue``: it deletes in-flight messages too (and runs once a minute at most).
        """
        info = self._topology.queue(queue)
        total = 0
        while True:
            got = self._client.call(
                "ReceiveMessage",
                QueueUrl=info.url,
                MaxNumberOfMessages=_BATCH,
                WaitTimeSeconds=0,
                VisibilityTimeout=_PEEK_VISIBILITY,
            ).get("Messages", [])
            if not got:
                return total
            self._delete(info.url, got)
            total += len(got)


def _without(items: list[Any], removed: list[Any]) -> list[Any]:
    gone = {id(x) for x in removed}
    return [x for x in items if id(x) not in gone]
