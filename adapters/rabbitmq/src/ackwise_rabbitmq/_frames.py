"""The AMQP 0-9-1 frames of ``basic.publish``, encoded here rather than by pika.

pika builds a ``Basic.Publish`` object, a ``BasicProperties`` object and three frame objects
for every message, then marshals each (about 10 µs a message, on the path of every
``delay()``).  The adapter's messages use five properties only, so the frames are packed
here directly, into one ``bytes`` per message; ``tests/test_rabbitmq_frames.py`` checks them
byte for byte against pika's marshalling.

The layout (AMQP 0-9-1, sections 2.3.5 and 4.2.6; class ``basic`` is 60, ``publish`` 40):

* method frame: type 1, channel, size, then class, method, a reserved short, the exchange and
  the routing key (short strings), and the ``mandatory`` bit; frame end ``0xCE``;
* header frame: type 2, then class, weight 0, the body's size, the property flags and the
  properties present, in the flags' order;
* body frames: type 3, the body cut to the connection's largest frame (none when empty).
"""

from __future__ import annotations

import struct
from typing import Any, NamedTuple

from pika.data import encode_table
from pika.exceptions import ShortStringTooLong

__all__ = ["Properties", "publish_frames"]

#: The property flags (``BasicProperties``) of the properties the adapter sets.
_HEADERS = 1 << 13
_DELIVERY_MODE = 1 << 12
_PRIORITY = 1 << 11
_MESSAGE_ID = 1 << 7
_TIMESTAMP = 1 << 6

_FRAME = struct.Struct(">BHI")  # type, channel, payload size
_METHOD = struct.Struct(">HHH")  # class, method, reserved (ticket)
_HEADER = struct.Struct(">HHQH")  # class, weight, body size, property flags
_TIMESTAMP_VALUE = struct.Struct(">Q")
_END = b"\xce"
#: ``delivery_mode`` 2: persistent.
_PERSISTENT = b"\x02"


class Properties(NamedTuple):
    """The properties of a message the adapter publishes: always persistent."""

    message_id: str
    timestamp: int
    headers: dict[str, Any] | None = None
    priority: int = 0


def _short(value: str) -> bytes:
    encoded = value.encode("utf-8")
    if len(encoded) > 255:
        raise ShortStringTooLong(encoded)
    return bytes((len(encoded),)) + encoded


def publish_frames(
    channel: int,
    exchange: str,
    routing_key: str,
    body: bytes,
    props: Properties,
    *,
    mandatory: bool,
    body_max: int,
) -> bytes:
    """The frames of one ``basic.publish`` on ``channel``, as pika marshals them; ``body_max``:
    the largest body frame's payload (the connection's ``frame_max`` less 8)."""
    method = (
        _METHOD.pack(60, 40, 0)
        + _short(exchange)
        + _short(routing_key)
        + (b"\x01" if mandatory else b"\x00")
    )
    flags = _DELIVERY_MODE | _MESSAGE_ID | _TIMESTAMP
    listed: list[bytes] = []
    if props.headers:
        flags |= _HEADERS
        encode_table(listed, props.headers)
    listed.append(_PERSISTENT)
    if props.priority:
        flags |= _PRIORITY
        listed.append(bytes((props.priority,)))
    listed.append(_short(props.message_id))
    listed.append(_TIMESTAMP_VALUE.pack(props.timestamp))
    size = len(body)
    header = _HEADER.pack(60, 0, size, flags) + b"".join(listed)
    out = [
        _FRAME.pack(1, channel, len(method)),
        method,
        _END,
        _FRAME.pack(2, channel, len(header)),
        header,
        _END,
    ]
    for start in range(0, size, body_max):
        chunk = body[start : start + body_max]
        out += (_FRAME.pack(3, channel, len(chunk)), chunk, _END)
    return b"".join(out)
