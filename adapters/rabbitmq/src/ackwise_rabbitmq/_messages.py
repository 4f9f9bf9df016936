"""What the adapter's messages carry (ackwise's headers), and reading the ones ackwise did not
write: delivery counts, corrupt deliveries, dead letters as :class:`~ackwise.DeadLetter`.

See the adapter's overview (:mod:`ackwise_rabbitmq._adapter`): **Delivery count**,
**Malformed messages**, **Dead letters**.  Plain functions: no connection, no state.
"""

from __future__ import annotations

import hashlib
import logging
import math
import struct
from typing import Any

import pika.exceptions as px
import pika.frame
import pika.spec

from ackwise.spi import MAX_PRIORITY, DeadLetter, Delivery

# The adapter's one logger, named as before it was split into modules.
log = logging.getLogger("ackwise_rabbitmq._adapter")

#: RabbitMQ's default ``max_message_size`` (128 MiB); larger messages are refused by the broker.
MAX_MESSAGE_SIZE = 128 * 1024 * 1024

H_DELIVERIES = "x-ackwise-deliveries"
H_REASON = "x-ackwise-reason"
H_DEAD_AT = "x-ackwise-dead-at"
H_ATTEMPT = "x-ackwise-attempt"
#: RabbitMQ's delivery count (quorum queues).
H_COUNT = "x-delivery-count"
#: Stands in for the headers of a message that pika cannot decode (see ``_read_frame``).
H_UNREADABLE = "x-ackwise-unreadable-headers"
#: Delivery counts in headers are below this: a larger one is no count ackwise or RabbitMQ
#: wrote, and the attempt written back into a header must fit AMQP's 64-bit integers.
_MAX_COUNT = 2**31
#: What pika's field decoder raises on values RabbitMQ accepts from other clients (a
#: timestamp past year 9999: OverflowError or ValueError).
_FIELD_ERRORS = (ArithmeticError, ValueError, OSError, struct.error, px.InvalidFieldTypeException)


# -- messages ackwise did not write ------------------------------------------------------------
def _read_frame(buffer: bytes) -> tuple[int, Any]:
    """pika's frame decoder, except that a content header whose headers pika cannot decode
    comes through without them, marked :data:`H_UNREADABLE`.

    Installed on the adapter's connection only (``_pika_private.read_frames_with``: ``buffer``
    is what the connection received and has not decoded yet).  pika raises on a header
    timestamp past year 9999, which RabbitMQ accepts from any client; that raise would cost the
    connection and every delivery on it, and again at each redelivery of the same message.
    """
    try:
        frame: tuple[int, Any] = pika.frame.decode_frame(buffer)
    except _FIELD_ERRORS as exc:
        header = _header_without_headers(buffer, exc)
        if header is None:
            raise
        return header
    return frame


def _header_without_headers(buffer: bytes, error: Exception) -> tuple[int, Any] | None:
    """The content-header frame at the start of ``buffer``, its headers table left out (None:
    it is no such frame, or more than its headers is wrong)."""
    props_type = pika.spec.BasicProperties
    try:
        kind, channel, size = struct.unpack_from(">BHL", buffer)
        if kind != pika.spec.FRAME_HEADER:
            return None
        end = pika.spec.FRAME_HEADER_SIZE + size + pika.spec.FRAME_END_SIZE
        payload = bytes(buffer[pika.spec.FRAME_HEADER_SIZE : end - 1])
        body_size = struct.unpack_from(">Q", payload, 4)[0]
        encoded = payload[12:]
        flags = struct.unpack_from(">H", encoded)[0]
        # Basic's 14 properties fit one flag word: a continuation bit means something else.
        if not flags & props_type.FLAG_HEADERS or flags & 1:
            return None
        table = 2  # the headers table follows content_type and content_encoding (short strings)
        for flag in (props_type.FLAG_CONTENT_TYPE, props_type.FLAG_CONTENT_ENCODING):
            if flags & flag:
                table += 1 + encoded[table]
        after = table + 4 + struct.unpack_from(">I", encoded, table)[0]
        flags_without = struct.pack(">H", flags & ~props_type.FLAG_HEADERS)
        props = props_type().decode(flags_without + encoded[2:table] + encoded[after:])
    except (*_FIELD_ERRORS, IndexError):
        return None
    props.headers = {H_UNREADABLE: f"{type(error).__name__}: {error}"}
    return end, pika.frame.Header(channel, body_size, props)


def _count(value: object) -> int | None:
    """A delivery count as ackwise and RabbitMQ write it into a header, or None.

    pika reads an AMQP long (RabbitMQ's ``x-delivery-count``) as its own subclass of int.
    """
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value < _MAX_COUNT:
        return None
    return int(value)


def _text(value: object) -> str | None:
    """A header's text: pika gives AMQP strings as str, or as bytes when not UTF-8."""
    if isinstance(value, bytes):
        return value.decode("utf-8", "replace")
    return value if isinstance(value, str) else None


def _priority(props: Any) -> int:
    """A message's priority as ackwise keeps it: 0 to 9 (anything else another client set
    counts as 0 when ackwise sends the message again)."""
    p = props.priority
    return p if type(p) is int and 0 <= p <= MAX_PRIORITY else 0


def _brief(value: object) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def _stand_in_id(body: bytes) -> str:
    """An id for a message without a usable ``message_id``: derived from the body, so that a
    dead letter is listed, replayed and deleted under the same id every time."""
    return "corrupt-" + hashlib.sha256(body).hexdigest()[:16]


def _message_id(props: Any, body: bytes) -> str:
    mid = props.message_id
    return mid if isinstance(mid, str) and mid else _stand_in_id(body)


def _malformed(props: Any, headers: dict[Any, Any]) -> str | None:
    """What makes a message one that ackwise did not write (None: nothing does)."""
    if H_UNREADABLE in headers:
        return f"its headers cannot be decoded ({headers[H_UNREADABLE]})"
    mid = props.message_id
    if mid is None or mid == "":
        return "it has no message_id property"
    if not isinstance(mid, str):
        return f"its message_id is not UTF-8 text: {_brief(mid)}"
    for name in (H_DELIVERIES, H_COUNT):
        if name in headers and _count(headers[name]) is None:
            return f"header {name} is {_brief(headers[name])}, not a delivery count"
    return None


def _attempt(headers: dict[Any, Any], redelivered: bool) -> int:
    """This delivery's count: ackwise's header plus RabbitMQ's, or the redelivered flag."""
    base = _count(headers.get(H_DELIVERIES)) or 0
    count = _count(headers.get(H_COUNT))
    if count is not None:
        return base + count + 1
    return base + (2 if redelivered else 1)


def _seconds(value: object) -> float | None:
    """A time in seconds since the epoch as a header holds it (ackwise writes text)."""
    text = _text(value)
    try:
        seconds = float(text if text is not None else value)  # type: ignore[arg-type]
    except (TypeError, ValueError, ArithmeticError):
        return None
    return seconds if math.isfinite(seconds) and seconds >= 0 else None


def _dead_reason(headers: dict[Any, Any]) -> str:
    if H_REASON in headers:
        return _text(headers[H_REASON]) or "unknown"
    # Dead-lettered by RabbitMQ itself: the delivery limit, or another reason in x-death.
    deaths = headers.get("x-death")
    first = deaths[0] if isinstance(deaths, list) and deaths else None
    native = _text(first.get("reason")) if isinstance(first, dict) else None
    return "max_deliveries" if native == "delivery_limit" else native or "unknown"


def _dead_letter_of(queue: str, props: Any, body: bytes) -> DeadLetter:
    """A message of a dead-letter queue as a :class:`DeadLetter`, whatever its properties hold."""
    headers = props.headers or {}
    dead_at = _seconds(headers.get(H_DEAD_AT))
    if dead_at is None:
        dead_at = float(props.timestamp) if isinstance(props.timestamp, int) else 0.0
    attempt = _count(headers.get(H_ATTEMPT))
    if attempt is None:
        attempt = (_count(headers.get(H_COUNT)) or 0) + 1
    return DeadLetter(
        queue=queue,
        message_id=_message_id(props, body),
        body=body,
        reason=_dead_reason(headers),
        dead_at=dead_at,
        attempt=attempt,
    )


def _dead_body(delivery: Delivery, body: bytes | None) -> bytes:
    """The body a dead letter stores: ``body`` (the annotated envelope) when the broker takes
    it, else the delivered one, which the broker took once: checked before anything is sent,
    since a refused publish would leave the delivery unsettled until the connection closes."""
    if body is None:
        return delivery.body
    if len(body) <= MAX_MESSAGE_SIZE:
        return body
    log.warning(
        "message %s on %s: its annotated dead letter is %d bytes, over RabbitMQ's limit of %d; "
        "dead-lettered with the body it was delivered with",
        delivery.message_id,
        delivery.queue,
        len(body),
        MAX_MESSAGE_SIZE,
    )
    return delivery.body
