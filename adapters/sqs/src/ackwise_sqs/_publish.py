"""Producing: the entries of the messages to send (attributes, delays, FIFO group and
deduplication ids, the size check) and sending them in batches.  What is published was checked
(delays, priorities) by the adapter.

See the adapter's overview (:mod:`ackwise_sqs._adapter`): *delay*, *bodies*.
"""

from __future__ import annotations

import hashlib
import math
import time
from collections.abc import Iterable, Sequence
from typing import Any

from ackwise.errors import MessageTooLarge, PermanentAdapterError, TransientAdapterError
from ackwise.spi import Outgoing
from ackwise_sqs._client import Client
from ackwise_sqs._limits import _BATCH
from ackwise_sqs._messages import _DUE, _ID, _dead_attrs, _encode_body, _headers, _size, _string
from ackwise_sqs._topology import Topology, _Queue
from ackwise_sqs._url import SQSSettings

__all__ = ["Publisher"]


class Publisher:
    """Publishing to a queue and to its dead-letter queue."""

    def __init__(self, settings: SQSSettings, client: Client, topology: Topology) -> None:
        self.settings = settings
        self._client = client
        self._topology = topology

    # -- producing -------------------------------------------------------------------------
    def publish(self, queue: str, messages: Sequence[Outgoing]) -> None:
        """Send checked ``messages`` (at least one)."""
        info = self._topology.queue(queue)
        entries = [self.entry(info, m, i) for i, m in enumerate(messages)]
        self.send_batches(info, info.url, entries, [m.id for m in messages])

    def unchecked_entry(
        self,
        info: _Queue,
        m: Outgoing,
        index: int,
        *,
        extra: dict[str, str] | None = None,
        delay: float | None = None,
    ) -> dict[str, Any]:
        body, attrs = _encode_body(m.body)
        attrs[_ID] = _string(m.id)
        for key, value in (extra or {}).items():
            attrs[key] = _string(value)
        delay = m.delay if delay is None else delay
        entry: dict[str, Any] = {"Id": str(index), "MessageBody": body}
        if delay > 0:
            if not info.fifo and delay <= self.settings.max_native_delay:
                entry["DelaySeconds"] = math.ceil(delay)
            else:
                # Beyond DelaySeconds (or on FIFO queues): the due time rides along, and the
                # early receive re-arms the message by visibility.
                attrs[_DUE] = {"DataType": "Number", "StringValue": f"{time.time() + delay:.3f}"}
                if not info.fifo:
                    entry["DelaySeconds"] = int(self.settings.max_native_delay)
        if info.fifo:
            headers = _headers(m.body)
            group = headers.get("message_group_id") or info.group or self.settings.message_group
            entry["MessageGroupId"] = str(group)[:128]
            # The idempotency key dedups a publish made twice (SQS keeps the id 5 minutes);
            # without one, only a byte-identical resend of the same message is a duplicate.
            idem = headers.get("idempotency_key")
            digest = hashlib.sha256(
                f"key:{idem}".encode() if idem is not None else f"msg:{m.id}:".encode() + m.body
            )
            entry["MessageDeduplicationId"] = digest.hexdigest()
        entry["MessageAttributes"] = attrs
        return entry

    def entry(
        self,
        info: _Queue,
        m: Outgoing,
        index: int,
        *,
        extra: dict[str, str] | None = None,
        delay: float | None = None,
    ) -> dict[str, Any]:
        """The entry of one message to send, checked against the queue's size limit."""
        entry = self.unchecked_entry(info, m, index, extra=extra, delay=delay)
        size = _size(entry)
        if size > info.max_size:
            raise MessageTooLarge(
                f"message {m.id}: {size} bytes on the wire (body and attributes); SQS queue "
                f"{info.name!r} accepts at most {info.max_size} (MaximumMessageSize); nothing "
                "was published"
            )
        return entry

    def send_batches(
        self, info: _Queue, url: str, entries: list[dict[str, Any]], ids: Sequence[str]
    ) -> None:
        """Send ``entries`` to ``url`` (the queue's or its dead-letter queue's) in batches;
        ``ids``: their messages' ids, for the error of those SQS refused."""
        failed: list[str] = []
        transient = False
        for chunk in _chunks(entries, info.max_size):
            out = self._client.call("SendMessageBatch", QueueUrl=url, Entries=chunk)
            for f in out.get("Failed", []):
                failed.append(f"{ids[int(f['Id'])]} ({f.get('Code')}: {f.get('Message', '')})")
                transient = transient or not f.get("SenderFault", False)
        if failed:
            error = TransientAdapterError if transient else PermanentAdapterError
            raise error(f"SQS refused {len(failed)} message(s): {'; '.join(failed[:5])}")

    def publish_dead(self, queue: str, messages: Sequence[Outgoing], *, reason: str) -> None:
        """Send checked ``messages`` (at least one) to the dead-letter queue."""
        info = self._topology.queue(queue)
        now = time.time()
        entries = [
            self.entry(info, m, i, extra=_dead_attrs(reason, now, 0), delay=0.0)
            for i, m in enumerate(messages)
        ]
        self.send_batches(info, info.dlq_url, entries, [m.id for m in messages])


def _chunks(entries: list[dict[str, Any]], max_bytes: int) -> Iterable[list[dict[str, Any]]]:
    """Batches of at most 10 entries and ``max_bytes`` in total (SendMessageBatch's limits)."""
    chunk: list[dict[str, Any]] = []
    size = 0
    for e in entries:
        s = _size(e)
        if chunk and (len(chunk) == _BATCH or size + s > max_bytes):
            yield chunk
            chunk, size = [], 0
        chunk.append(e)
        size += s
    if chunk:
        yield chunk
