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
"""

from __future__ import annotations

import base64
import concurrent.futures as cf
import hashlib
import json
import logging
import math
import re
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar

import boto3
from botocore.config import Config
from botocore.exceptions import ClientError

from ackwise import (
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
    decode_envelope,
    fork_generation,
)
from ackwise.errors import (
    AdapterError,
    MessageTooLarge,
    PermanentAdapterError,
    PublishError,
    QueueNotFound,
    StaleReceipt,
    TransientAdapterError,
)
from ackwise_sqs._errors import (
    VisibilityCapReached,
    error_code,
    map_botocore_errors,
)
from ackwise_sqs._url import SQSSettings, parse_sqs_url

__all__ = [
    "MAX_DELAY",
    "MAX_MESSAGE_SIZE",
    "MAX_VISIBILITY",
    "SQSAdapter",
    "SQSReceipt",
    "sqs_queue_name",
]

log = logging.getLogger(__name__)

#: SQS's cap on a message's visibility timeout, per receive (12 hours).
MAX_VISIBILITY = 43200
#: The longest delay (publish or nack) the adapter holds: SQS's visibility cap.
MAX_DELAY = float(MAX_VISIBILITY)
#: SQS's largest message (1 MiB, body and attributes), less room for ackwise's attributes.
MAX_MESSAGE_SIZE = 1_048_576 - 1024
_BATCH = 10  # SQS's limit on entries per batch call
_RETENTION = 1_209_600  # 14 days, SQS's longest
#: Settling this close to a lease's deadline counts as stale: the request could arrive after it.
_FENCE_MARGIN = 0.2
_PEEK_VISIBILITY = 30
_PEEK_LIMIT = 10_000
#: Requests of one receive / ack / extend that run at once (each carries up to 10 messages).
_PARALLEL = 4

_ID = "ackwise-id"
_ENC = "ackwise-enc"
_DUE = "ackwise-due"
_REASON = "ackwise-reason"
_DEAD_AT = "ackwise-dead-at"
_ATTEMPT = "ackwise-attempt"
#: A due time further ahead of the receiving worker's clock than this is none ackwise wrote (the
#: longest delay is 12 hours; an hour more allows for clocks that disagree).  Re-armed, such a
#: message would be hidden for good: it is delivered as a corrupt record instead.
_DUE_HORIZON = MAX_DELAY + 3600.0

# SQS accepts these characters in a body (XML 1.0); anything else goes base64.
_INVALID_BODY = re.compile("[^\x09\x0a\x0d\x20-\ud7ff\ue000-\ufffd\U00010000-\U0010ffff]")
# ackwise queue names, as SQS takes them: the prefix and the "-dlq" suffix must fit in 80.
_NAME = re.compile(r"^[A-Za-z0-9_-]+(\.fifo)?$")
_NAME_ROOM = 80 - len("-dlq")


def sqs_queue_name(prefix: str, queue: str) -> tuple[str, str]:
    """Return (queue, dead-letter queue) SQS names for ackwise queue ``queue``.

    :raises PublishError: the name cannot be an SQS queue name (the message says why).
    """
    name = prefix + queue
    if not _NAME.match(queue) or len(name) > _NAME_ROOM:
        raise PublishError(
            f"invalid queue name {queue!r} for SQS: letters, digits, '-' and '_', optionally "
            f"ending in '.fifo', at most {_NAME_ROOM - len(prefix)} characters with the prefix "
            f"{prefix!r} (SQS allows 80, and ackwise adds '-dlq' for the dead-letter queue)"
        )
    if name.endswith(".fifo"):
        return name, name.removesuffix(".fifo") + "-dlq.fifo"
    return name, name + "-dlq"


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


@dataclass
class _Queue:
    name: str
    url: str
    dlq_url: str
    fifo: bool
    max_size: int
    max_deliveries: int | None = None
    group: str | None = None
    extra: dict[str, Any] = field(default_factory=dict)


class SQSAdapter(Adapter):
    """Amazon SQS through boto3: visibility leases, long polling, batches, redrive, FIFO."""

    name = "sqs"
    capabilities: ClassVar[Capabilities] = Capabilities(
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
    )
    #: Every request costs a round trip and carries at most 10 messages: while tasks are short
    #: the worker holds enough to receive and acknowledge in whole batches.
    deep_prefetch = True

    def __init__(self, url: BrokerURL) -> None:
        super().__init__(url)
        self.settings: SQSSettings = parse_sqs_url(url)
        self._client: Any = None
        self._queues: dict[str, _Queue] = {}
        #: API calls made, by operation name (for benchmarks and tests).
        self.calls: dict[str, int] = {}
        #: Early receives of long delays re-armed by visibility (not deliveries).
        self.rearmed = 0
        self._counting = threading.Lock()
        self._generation = fork_generation()
        self._io: cf.ThreadPoolExecutor | None = None  # the parallel requests of one call

    # -- lifecycle -------------------------------------------------------------------------
    def open(self) -> None:
        if self._generation != fork_generation():
            # Inherited through fork(): the parent's client and threads are not ours to use.
            self._client, self._io = None, None
            self._generation = fork_generation()
        if self._client is not None:
            return
        s = self.settings
        with map_botocore_errors("SQS: open"):
            session = boto3.session.Session(profile_name=s.profile, region_name=s.region)
            self._client = session.client(
                "sqs",
                endpoint_url=s.endpoint_url,
                config=Config(
                    connect_timeout=5,
                    read_timeout=30,  # above the longest long poll (20 s)
                    retries={"mode": "standard", "max_attempts": 3},
                    max_pool_connections=_PARALLEL + 1,
                ),
            )

    def close(self) -> None:
        io, self._io = self._io, None
        if io is not None and self._generation == fork_generation():
            io.shutdown(wait=False)  # idle: every call waits for its requests
        client, self._client = self._client, None
        if client is not None:
            try:
                client.close()
            except Exception:  # closing a broken connection pool
                log.debug("closing the SQS client failed", exc_info=True)

    def _call(self, operation: str, **params: Any) -> dict[str, Any]:
        if self._client is None or self._generation != fork_generation():
            self.open()
        with self._counting:  # the parallel requests of one call count from their threads
            self.calls[operation] = self.calls.get(operation, 0) + 1
        with map_botocore_errors(f"SQS {operation}"):
            result: dict[str, Any] = getattr(self._client, _snake(operation))(**params)
        return result

    # -- topology --------------------------------------------------------------------------
    def declare(self, queue: QueueSpec) -> None:
        name, dlq_name = sqs_queue_name(self.settings.prefix, queue.name)
        fifo = name.endswith(".fifo")
        base: dict[str, str] = {"MessageRetentionPeriod": str(_RETENTION)}
        if fifo:
            base["FifoQueue"] = "true"
        dlq_url = self._create(dlq_name, base)
        dlq_arn = self._call("GetQueueAttributes", QueueUrl=dlq_url, AttributeNames=["QueueArn"])[
            "Attributes"
        ]["QueueArn"]
        url = self._create(name, base)
        redrive = json.dumps(
            {"deadLetterTargetArn": dlq_arn, "maxReceiveCount": str(queue.max_deliveries + 1)}
        )
        self._call(
            "SetQueueAttributes",
            QueueUrl=url,
            Attributes={"RedrivePolicy": redrive, "MessageRetentionPeriod": str(_RETENTION)},
        )
        info = self._describe(queue.name, url, dlq_url, fifo)
        info.max_deliveries = queue.max_deliveries
        group = queue.options.get("message_group_id")
        info.group = str(group) if group else None

    def _create(self, name: str, attributes: dict[str, str]) -> str:
        try:
            return str(self._call("CreateQueue", QueueName=name, Attributes=attributes)["QueueUrl"])
        except PermanentAdapterError as exc:
            # QueueAlreadyExists: same name, other attributes; the attributes are set after.
            cause = exc.__cause__
            if isinstance(cause, ClientError) and error_code(cause).endswith("QueueAlreadyExists"):
                return str(self._call("GetQueueUrl", QueueName=name)["QueueUrl"])
            raise

    def _describe(self, queue: str, url: str, dlq_url: str, fifo: bool) -> _Queue:
        attrs = self._call("GetQueueAttributes", QueueUrl=url, AttributeNames=["All"])["Attributes"]
        info = _Queue(
            name=queue,
            url=url,
            dlq_url=dlq_url,
            fifo=fifo,
            max_size=int(attrs.get("MaximumMessageSize", 262_144)),
        )
        redrive = attrs.get("RedrivePolicy")
        if redrive:
            info.max_deliveries = int(json.loads(redrive)["maxReceiveCount"]) - 1
        self._queues[queue] = info
        return info

    def _queue(self, queue: str) -> _Queue:
        """The queue's URLs and limits; declared with defaults when it does not exist yet."""
        info = self._queues.get(queue)
        if info is not None:
            return info
        name, dlq_name = sqs_queue_name(self.settings.prefix, queue)
        try:
            url = str(self._call("GetQueueUrl", QueueName=name)["QueueUrl"])
            dlq_url = str(self._call("GetQueueUrl", QueueName=dlq_name)["QueueUrl"])
        except QueueNotFound:
            self.declare(QueueSpec(queue))
            return self._queues[queue]
        return self._describe(queue, url, dlq_url, name.endswith(".fifo"))

    def queues(self) -> Sequence[str]:
        prefix = self.settings.prefix
        names: list[str] = []
        params: dict[str, Any] = {"MaxResults": 1000}
        if prefix:
            params["QueueNamePrefix"] = prefix
        while True:
            out = self._call("ListQueues", **params)
            for url in out.get("QueueUrls", []):
                name = url.rsplit("/", 1)[-1]
                if not name.startswith(prefix) or name.endswith(("-dlq", "-dlq.fifo")):
                    continue
                names.append(name[len(prefix) :])
            token = out.get("NextToken")
            if not token:
                return sorted(names)
            params["NextToken"] = token

    # -- producing -------------------------------------------------------------------------
    def publish(self, queue: str, messages: Sequence[Outgoing]) -> None:
        if not messages:
            return
        for m in messages:
            self.check_delay(m.delay)
        info = self._queue(queue)
        entries = [self._entry(info, m, i) for i, m in enumerate(messages)]
        self._send_batches(info, info.url, entries, [m.id for m in messages])

    def _unchecked_entry(
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

    def _entry(
        self,
        info: _Queue,
        m: Outgoing,
        index: int,
        *,
        extra: dict[str, str] | None = None,
        delay: float | None = None,
    ) -> dict[str, Any]:
        """The entry of one message to send, checked against the queue's size limit."""
        entry = self._unchecked_entry(info, m, index, extra=extra, delay=delay)
        size = _size(entry)
        if size > info.max_size:
            raise MessageTooLarge(
                f"message {m.id}: {size} bytes on the wire (body and attributes); SQS queue "
                f"{info.name!r} accepts at most {info.max_size} (MaximumMessageSize); nothing "
                "was published"
            )
        return entry

    def _send_batches(
        self, info: _Queue, url: str, entries: list[dict[str, Any]], ids: Sequence[str]
    ) -> None:
        failed: list[str] = []
        transient = False
        for chunk in _chunks(entries, info.max_size):
            out = self._call("SendMessageBatch", QueueUrl=url, Entries=chunk)
            for f in out.get("Failed", []):
                failed.append(f"{ids[int(f['Id'])]} ({f.get('Code')}: {f.get('Message', '')})")
                transient = transient or not f.get("SenderFault", False)
        if failed:
            error = TransientAdapterError if transient else PermanentAdapterError
            raise error(f"SQS refused {len(failed)} message(s): {'; '.join(failed[:5])}")

    def publish_dead(self, queue: str, messages: Sequence[Outgoing], *, reason: str) -> None:
        if not messages:
            return
        info = self._queue(queue)
        now = time.time()
        entries = [
            self._entry(info, m, i, extra=_dead_attrs(reason, now, 0), delay=0.0)
            for i, m in enumerate(messages)
        ]
        self._send_batches(info, info.dlq_url, entries, [m.id for m in messages])

    # -- consuming -------------------------------------------------------------------------
    def receive(
        self, queue: str, *, max_messages: int, wait: float, lease: float
    ) -> Sequence[Delivery]:
        if max_messages <= 0:
            return []
        info = self._queue(queue)
        visibility = _visibility(lease)
        wait_seconds = 0 if wait <= 0 else min(20, max(1, round(wait)))
        first = min(_BATCH, max_messages)
        out, full = self._receive_once(info, first, wait_seconds, visibility)
        rest = max_messages - first
        if full and rest > 0:
            # The queue had a full batch: the rest at once, one request per batch of 10 (a
            # queue that had less costs no request more).
            sizes = [min(_BATCH, rest - i) for i in range(0, rest, _BATCH)]
            got, error = self._parallel(
                lambda n: self._receive_once(info, n, 0, visibility)[0], sizes
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
        got = self._call(
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
        # The visibility clock starts when SQS takes the message: during a long poll, when
        # one arrives.  Counting from the call's start would shorten the lease by the wait;
        # the take is assumed no more than a second before the answer came back.
        taken = max(started, now - 1.0) if wait_seconds else started
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
                self._call(
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

    def _parallel(
        self, fn: Callable[[Any], Any], items: Sequence[Any]
    ) -> tuple[list[Any], Exception | None]:
        """``fn`` over ``items``, up to _PARALLEL at once (the first on this thread).

        Returns the results of the calls that succeeded, in order, and the first error.
        """
        if not items:
            return [], None
        if self._generation != fork_generation():
            self.open()  # not the parent's threads
        if self._io is None and len(items) > 1:
            self._io = cf.ThreadPoolExecutor(_PARALLEL - 1, thread_name_prefix="ackwise-sqs")
        futures = [self._io.submit(fn, x) for x in items[1:]] if self._io else []
        results: list[Any] = []
        error: Exception | None = None
        try:
            results.append(fn(items[0]))
        except Exception as exc:
            error = exc
        for f in futures:
            try:
                results.append(f.result())
            except Exception as exc:
                error = error or exc
        return results, error

    def extend(self, deliveries: Sequence[Delivery], *, lease: float) -> None:
        valid, stale = self._split(deliveries)
        now = time.time()
        wanted = _visibility(lease)
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
        self.check_delay(delay)
        _, stale = self._split([delivery])
        if stale:
            raise StaleReceipt(stale, "nack")
        r: SQSReceipt = delivery.receipt
        if math.ceil(delay) + (time.time() - r.received_at) > MAX_VISIBILITY:
            # Past what visibility can hold for this receive: a fresh copy carries the delay.
            info = self._queue(delivery.queue)
            out = Outgoing(delivery.message_id, delivery.body, delay)
            self._send_batches(info, info.url, [self._entry(info, out, 0)], [out.id])
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
        info = self._queue(delivery.queue)
        entry = self._dead_entry(info, delivery, reason, body)
        self._send_batches(info, info.dlq_url, [entry], [delivery.message_id])
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
                return self._entry(info, out, 0, extra=extra, delay=0.0)
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
        entry = self._unchecked_entry(info, Outgoing(delivery.message_id, delivery.body), 0)
        del entry["MessageAttributes"][_ID]
        return entry

    def _settle_one(self, operation: str, delivery: Delivery, **params: Any) -> None:
        r: SQSReceipt = delivery.receipt
        try:
            self._call(operation, ReceiptHandle=r.handle, **params)
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
        results, error = self._parallel(
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
        out = self._call(
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

    # -- dead letters ----------------------------------------------------------------------
    def _peek(self, url: str) -> list[dict[str, Any]]:
        """Take every message of ``url`` briefly, to look at it; see :meth:`_unpeek`."""
        seen: list[dict[str, Any]] = []
        while len(seen) < _PEEK_LIMIT:
            got = self._call(
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
            self._call(
                "ChangeMessageVisibilityBatch",
                QueueUrl=url,
                Entries=[
                    {"Id": str(i), "ReceiptHandle": m["ReceiptHandle"], "VisibilityTimeout": 0}
                    for i, m in enumerate(chunk)
                ],
            )

    def _delete(self, url: str, messages: list[dict[str, Any]]) -> None:
        for chunk in _slices(messages, _BATCH):
            self._call(
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
        info = self._queue(queue)
        peeked = self._peek(info.dlq_url)
        try:
            letters = [self._dead_letter_of(info, m) for m in peeked]
        finally:
            self._unpeek(info.dlq_url, peeked)
        letters.sort(key=lambda x: x.dead_at)
        return letters[:limit]

    def requeue_dead(self, queue: str, message_ids: Sequence[str]) -> int:
        info = self._queue(queue)
        wanted = set(message_ids)
        peeked = self._peek(info.dlq_url)
        chosen = [m for m in peeked if self._dead_letter_of(info, m).message_id in wanted]
        rest = _without(peeked, chosen)
        try:
            if chosen:
                letters = [self._dead_letter_of(info, m) for m in chosen]
                entries = [
                    self._entry(info, Outgoing(x.message_id, x.body), i)
                    for i, x in enumerate(letters)
                ]
                # Published first, then deleted: a crash in between replays it twice, never 0.
                self._send_batches(info, info.url, entries, [x.message_id for x in letters])
                self._delete(info.dlq_url, chosen)
        finally:
            self._unpeek(info.dlq_url, rest)
        return len(chosen)

    def delete_dead(self, queue: str, message_ids: Sequence[str] | None = None) -> int:
        info = self._queue(queue)
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
        info = self._queue(queue)
        names = [
            "ApproximateNumberOfMessages",
            "ApproximateNumberOfMessagesDelayed",
            "ApproximateNumberOfMessagesNotVisible",
        ]
        main = self._call("GetQueueAttributes", QueueUrl=info.url, AttributeNames=names)[
            "Attributes"
        ]
        dead = self._call("GetQueueAttributes", QueueUrl=info.dlq_url, AttributeNames=names)[
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
        info = self._queue(queue)
        total = 0
        while True:
            got = self._call(
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


# -- helpers -----------------------------------------------------------------------------------
_STALE_CODES = frozenset({"ReceiptHandleIsInvalid", "InvalidReceiptHandle", "MessageNotInflight"})


def _is_stale(exc: AdapterError) -> bool:
    cause = exc.__cause__
    return isinstance(cause, ClientError) and (
        error_code(cause) in _STALE_CODES or error_code(cause).endswith("MessageNotInflight")
    )


def _snake(operation: str) -> str:
    return re.sub(r"(?<!^)(?=[A-Z])", "_", operation).lower()


def _visibility(lease: float) -> int:
    if lease > MAX_VISIBILITY:
        raise PermanentAdapterError(
            f"lease {lease}s exceeds SQS's visibility cap of {MAX_VISIBILITY}s (12 hours)"
        )
    return max(0, math.ceil(lease))


def _string(value: str) -> dict[str, str]:
    return {"DataType": "String", "StringValue": value}


def _text(attr: dict[str, Any] | None) -> str | None:
    """An attribute's text (None for a Binary attribute, or none at all)."""
    value = None if attr is None else attr.get("StringValue")
    return value if isinstance(value, str) else None


def _number(attr: dict[str, Any] | None) -> float | None:
    """The finite number an attribute holds as text, or None."""
    try:
        value = float(_text(attr) or "")
    except ValueError:
        return None
    return value if math.isfinite(value) else None


def _whole(attr: dict[str, Any] | None) -> int | None:
    """The count an attribute holds as decimal digits (as ackwise writes it), or None."""
    text = _text(attr)
    if text is None or not (text.isascii() and text.isdigit()) or len(text) > 18:
        return None
    return int(text)


def _describe(attr: dict[str, Any]) -> str:
    value = repr(attr.get("StringValue", attr.get("BinaryValue")))
    if len(value) > 60:
        value = value[:57] + "..."
    return f"{attr.get('DataType', 'untyped')} {value}"


def _dead_attrs(reason: str, dead_at: float, attempt: int) -> dict[str, str]:
    return {_REASON: reason, _DEAD_AT: f"{dead_at:.6f}", _ATTEMPT: str(attempt)}


def _encode_body(body: bytes) -> tuple[str, dict[str, Any]]:
    try:
        text = body.decode("utf-8")
    except UnicodeDecodeError:
        text = None
    if text is not None and text and not _INVALID_BODY.search(text):
        return text, {}
    return base64.b64encode(body).decode("ascii"), {_ENC: _string("base64")}


class _Malformed(Exception):
    """A message ackwise did not frame; the text says what is wrong with it."""


def _raw(body: str) -> bytes:
    """A message body's bytes as SQS holds it (UTF-8 text)."""
    return body.encode("utf-8", "surrogatepass")


def _unframe(m: dict[str, Any], now: float) -> tuple[bytes, float | None]:
    """The body and due time of a received message, as ackwise framed them.

    :raises _Malformed: one of ackwise's attributes holds what ackwise never writes.
    """
    attrs: dict[str, Any] = m.get("MessageAttributes", {})
    if _ID in attrs and not _text(attrs[_ID]):
        raise _Malformed(f"attribute {_ID} is {_describe(attrs[_ID])}, not a message id")
    return _decoded_body(m["Body"], attrs.get(_ENC)), _due(attrs.get(_DUE), now)


def _decoded_body(body: str, encoding: dict[str, Any] | None) -> bytes:
    if encoding is None:
        return _raw(body)
    if _text(encoding) != "base64":
        raise _Malformed(f"attribute {_ENC} is {_describe(encoding)}, not 'base64'")
    try:
        return base64.b64decode(body, validate=True)
    except ValueError as exc:  # binascii.Error, or a character outside ASCII
        raise _Malformed(f"its body is not the base64 that attribute {_ENC} says: {exc}") from None


def _due(attr: dict[str, Any] | None, now: float) -> float | None:
    if attr is None:
        return None
    due = _number(attr)
    if due is None or due > now + _DUE_HORIZON:
        raise _Malformed(
            f"attribute {_DUE} is {_describe(attr)}, not a due time within "
            f"{_DUE_HORIZON / 3600:.0f} hours (the longest delay is {MAX_DELAY / 3600:.0f})"
        )
    return due


def _message_id(m: dict[str, Any]) -> str:
    """ackwise's id of a message; SQS's own where it has none ackwise can use."""
    return _text(m.get("MessageAttributes", {}).get(_ID)) or str(m["MessageId"])


def _stored_body(m: dict[str, Any]) -> bytes:
    """A dead letter's body: decoded where ackwise encoded it, else as SQS holds it."""
    try:
        return _decoded_body(m["Body"], m.get("MessageAttributes", {}).get(_ENC))
    except _Malformed:
        return _raw(m["Body"])


def _dead_reason(attrs: dict[str, Any]) -> str:
    if _REASON not in attrs:
        return "max_deliveries"  # without ackwise's attributes the redrive policy moved it
    return _text(attrs[_REASON]) or "unknown"


def _headers(body: bytes) -> dict[str, Any]:
    try:
        return dict(decode_envelope(body).headers)
    except Exception:  # not an envelope: no headers to read
        return {}


def _size(entry: dict[str, Any]) -> int:
    """The message's size as SQS counts it: body plus attribute names, types and values."""
    size = len(entry["MessageBody"].encode("utf-8"))
    for name, attr in entry.get("MessageAttributes", {}).items():
        size += len(name) + len(attr["DataType"]) + len(attr["StringValue"].encode("utf-8"))
    return size


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


def _by_queue_url(deliveries: Iterable[Delivery]) -> dict[str, list[Delivery]]:
    by_url: dict[str, list[Delivery]] = {}
    for d in deliveries:
        by_url.setdefault(d.receipt.queue_url, []).append(d)
    return by_url


def _slices(items: list[Any], n: int) -> Iterable[list[Any]]:
    for i in range(0, len(items), n):
        yield items[i : i + n]


def _without(items: list[Any], removed: list[Any]) -> list[Any]:
    gone = {id(x) for x in removed}
    return [x for x in items if id(x) not in gone]


def _in_order(all_: Sequence[Delivery], subset: list[Delivery]) -> list[Delivery]:
    ids = {id(d) for d in subset}
    return [d for d in all_ if id(d) in ids]
