"""What ackwise writes into an SQS message and reads back: its attributes (``ackwise-id``,
``ackwise-enc``, ``ackwise-due`` and the dead letters' ones), the body's encoding, the size SQS
counts, and telling the messages ackwise did not frame (corrupt records).

See the adapter's overview (:mod:`ackwise_sqs._adapter`): *bodies*, *malformed messages*.
Plain functions: no client, no state.
"""

from __future__ import annotations

import base64
import math
import re
from typing import Any

from ackwise import decode_envelope
from ackwise_sqs._limits import MAX_DELAY

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
