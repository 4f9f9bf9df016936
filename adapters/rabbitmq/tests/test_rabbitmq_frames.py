"""The adapter's own ``basic.publish`` frames (``ackwise_rabbitmq._frames``) are the bytes
pika marshals for the same message.  (The adapter publishes only through them: every test
that publishes to RabbitMQ sends them to a real broker.)"""

from __future__ import annotations

import time
from typing import Any

import pika
import pika.frame
import pika.spec
import pytest
from pika.exceptions import ShortStringTooLong

from ackwise_rabbitmq._frames import Properties, publish_frames

BODY_MAX = 131_072 - 8  # pika's default frame_max, less a frame's header and end


def _pikas(
    channel: int,
    exchange: str,
    key: str,
    body: bytes,
    props: Properties,
    *,
    mandatory: bool,
    body_max: int = BODY_MAX,
) -> bytes:
    """What pika's ``Connection._send_message`` marshals for the message."""
    properties = pika.BasicProperties(
        message_id=props.message_id,
        delivery_mode=2,
        timestamp=props.timestamp,
        headers=props.headers or None,
        priority=props.priority or None,
    )
    method = pika.spec.Basic.Publish(exchange=exchange, routing_key=key, mandatory=mandatory)
    frames = [
        pika.frame.Method(channel, method).marshal(),
        pika.frame.Header(channel, len(body), properties).marshal(),
    ]
    for start in range(0, len(body), body_max):
        frames.append(pika.frame.Body(channel, body[start : start + body_max]).marshal())
    return b"".join(frames)


NOW = int(time.time())
CASES: dict[str, tuple[Any, ...]] = {
    "plain": (2, "", "orders", b'{"task":"x"}', Properties("a1b2", NOW)),
    "delay tier": (2, "ackwise.q.delay.7", "0.1.1.0.1", b"body", Properties("id", NOW)),
    "priority": (1, "", "q", b"b", Properties("id", NOW, priority=9)),
    "dead letter headers": (
        3,
        "",
        "ackwise.q.dead",
        b"body",
        Properties(
            "id",
            NOW,
            {"x-ackwise-reason": "failed: boom", "x-ackwise-dead-at": "1.5", "n": 3},
            priority=2,
        ),
    ),
    "empty body": (2, "", "q", b"", Properties("id", NOW)),
    "non-ascii names": (2, "", "café-ü", "ünï".encode(), Properties("idé", NOW)),
    "longest names": (2, "e" * 255, "k" * 255, b"x", Properties("m" * 255, 2**40)),
}


@pytest.mark.parametrize("case", list(CASES.values()), ids=list(CASES))
@pytest.mark.parametrize("mandatory", [True, False])
def test_a_publish_is_the_bytes_pika_marshals(case: tuple[Any, ...], mandatory: bool) -> None:
    channel, exchange, key, body, props = case
    ours = publish_frames(
        channel, exchange, key, body, props, mandatory=mandatory, body_max=BODY_MAX
    )
    assert ours == _pikas(channel, exchange, key, body, props, mandatory=mandatory)


@pytest.mark.parametrize("size", [9, 10, 11, 30])
def test_a_body_longer_than_a_frame_is_cut_as_pika_cuts_it(size: int) -> None:
    body = bytes(range(size))
    props = Properties("id", NOW)
    ours = publish_frames(2, "", "q", body, props, mandatory=True, body_max=10)
    assert ours == _pikas(2, "", "q", body, props, mandatory=True, body_max=10)
    # ...and reads back as the same message.
    frames, at = [], 0
    while at < len(ours):
        used, frame = pika.frame.decode_frame(ours[at:])
        frames.append(frame)
        at += used
    assert b"".join(f.fragment for f in frames[2:]) == body
    assert frames[1].properties.message_id == "id"


@pytest.mark.parametrize(
    "where", ["exchange", "routing_key", "message_id"], ids=["exchange", "key", "message id"]
)
def test_a_name_past_255_bytes_is_refused_as_pika_refuses_it(where: str) -> None:
    names = {"exchange": "", "routing_key": "q", "message_id": "id"}
    names[where] = "é" * 128  # 256 bytes
    with pytest.raises(ShortStringTooLong):
        publish_frames(
            1,
            names["exchange"],
            names["routing_key"],
            b"x",
            Properties(names["message_id"], NOW),
            mandatory=True,
            body_max=BODY_MAX,
        )
