"""Messages ackwise did not frame never stop an SQS worker nor cost a valid message.

A foreign producer sends straight into the SQS queue of an ackwise queue (``sqs_queue_name``)
with boto3, among valid tasks: message attributes of every DataType where ackwise's belong,
bodies that are not the base64 their attribute says, unknown encodings, due times that are
garbage or absurdly far; a real worker drains (``ackwise_conformance.corruption``).  The
dead-letter listing reads malformed dead letters.  Only what SQS accepts is sent.
"""

from __future__ import annotations

import base64
import math
import time
import uuid
from collections.abc import Callable, Iterator
from typing import Any

import boto3
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ackwise import BrokerURL, open_adapter
from ackwise.spi import Outgoing, QueueSpec
from ackwise_conformance.corruption import REASONS, drain_among_corrupt
from ackwise_sqs import MAX_DELAY, SQSAdapter, sqs_queue_name
from ackwise_sqs._url import parse_sqs_url

_ID, _ENC, _DUE = "ackwise-id", "ackwise-enc", "ackwise-due"
#: How far ahead a due time may be and still be one (the adapter's bound: 12 h and an hour).
HORIZON = MAX_DELAY + 3600.0
#: The drains' lease: no valid message may come back while it runs (moto on a busy machine).
LEASE = 30.0

Attributes = dict[str, dict[str, Any]]
Send = Callable[[str, str, Attributes], None]


@pytest.fixture
def send_raw(sqs_url: str) -> Iterator[Send]:
    """Send one message into the SQS queue of an ackwise queue with plain boto3."""
    s = parse_sqs_url(BrokerURL.parse(sqs_url))
    client = boto3.client("sqs", endpoint_url=s.endpoint_url, region_name=s.region or "us-east-1")
    urls: dict[str, str] = {}

    def send(queue: str, body: str, attributes: Attributes) -> None:
        if queue not in urls:
            name, _ = sqs_queue_name(s.prefix, queue)
            urls[queue] = client.get_queue_url(QueueName=name)["QueueUrl"]
        client.send_message(QueueUrl=urls[queue], MessageBody=body, MessageAttributes=attributes)

    yield send
    client.close()


def _string(value: str) -> dict[str, Any]:
    return {"DataType": "String", "StringValue": value}


def _number(value: str) -> dict[str, Any]:
    return {"DataType": "Number", "StringValue": value}


def _binary(value: bytes) -> dict[str, Any]:
    return {"DataType": "Binary", "BinaryValue": value}


def _drain_one(sqs_url: str, send_raw: Send, body: str, attributes: Attributes) -> Any:
    def write(queue: str, _record: object) -> bytes:
        send_raw(queue, body, attributes)
        return body.encode()

    return drain_among_corrupt(sqs_url, [None], write, lease=LEASE, timeout=20.0).dead


# -- regressions -------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("body", "attributes"),
    [
        # b64decode raised binascii.Error in receive: the worker died, and the next one
        ("abc", {_ENC: _string("base64")}),
        # b64decode raised ValueError on text outside ASCII (found by the property test)
        ("\u00e9t\u00e9", {_ENC: _string("base64")}),
        # float("inf") is a due time: math.ceil(inf - now) raised OverflowError in receive
        ("payload", {_DUE: _string("inf")}),
        # re-armed 12 hours at each receive, for good: never delivered, never dead-lettered
        ("payload", {_DUE: _number("1" + "0" * 30)}),
        # not ackwise's framing, yet decoded as if it were (decode_error, or run)
        ("payload", {_ENC: _string("gzip")}),
        ("payload", {_ENC: _binary(b"base64")}),
        ("payload", {_ID: _binary(b"id")}),
        ("payload", {_DUE: _binary(b"\x00")}),
    ],
    ids=[
        "invalid-base64",
        "non-ascii-base64",
        "due-infinite",
        "due-absurdly-far",
        "unknown-encoding",
        "binary-encoding",
        "binary-id",
        "binary-due",
    ],
)
def test_a_malformed_framing_attribute_is_a_corrupt_record_and_the_worker_goes_on(
    sqs_url: str, send_raw: Send, body: str, attributes: Attributes
) -> None:
    [dead] = _drain_one(sqs_url, send_raw, body, attributes)
    assert (dead.reason, dead.body) == ("corrupt_record", body.encode())


def test_a_due_time_past_twelve_hours_is_rearmed_within_the_cap_not_raised(
    sqs_url: str, send_raw: Send
) -> None:
    # Defect: the re-arm asked for 12 hours of visibility on top of the receive's own, past
    # SQS's cap: ChangeMessageVisibilityBatch was refused and receive raised (the worker
    # stopped, and the next one on the same message).  Within the horizon it is a delay.
    adapter = open_adapter(sqs_url)
    adapter.open()
    queue = f"due-{uuid.uuid4().hex[:8]}"
    try:
        adapter.declare(QueueSpec(queue))
        send_raw(queue, "later", {_DUE: _number(f"{time.time() + HORIZON - 60:.3f}")})
        assert adapter.receive(queue, max_messages=10, wait=1.0, lease=LEASE) == []
        assert isinstance(adapter, SQSAdapter) and adapter.rearmed == 1
    finally:
        adapter.close()


def test_a_record_at_the_size_limit_is_dead_lettered_without_attributes(
    sqs_url: str, send_raw: Send
) -> None:
    # Defect: its dead letter, with ackwise's attributes, exceeded MaximumMessageSize:
    # dead_letter raised MessageTooLarge and the worker stopped, again at each redelivery.
    body = "x" * 1_048_576  # SQS's largest message, all body

    def write(queue: str, _record: object) -> bytes:
        send_raw(queue, body, {})
        return body.encode()

    outcome = drain_among_corrupt(
        sqs_url, [None], write, reasons=REASONS | {"max_deliveries"}, lease=LEASE
    )
    [dead] = outcome.dead
    assert dead.body == body.encode() and dead.reason == "max_deliveries"


def test_an_annotated_dead_letter_over_the_size_limit_keeps_the_delivered_body(
    sqs_url: str,
) -> None:
    # Defect: dead_letter raised MessageTooLarge (the worker stopped) for an annotated envelope
    # that no longer fitted, though the delivered body, with the reason, does.
    adapter = open_adapter(sqs_url)
    assert isinstance(adapter, SQSAdapter)
    adapter.open()
    queue = f"oversize-{uuid.uuid4().hex[:8]}"
    try:
        adapter.declare(QueueSpec(queue))
        adapter.publish(queue, [Outgoing("big", b"delivered")])
        [delivery] = adapter.receive(queue, max_messages=1, wait=1.0, lease=LEASE)
        too_big = b"x" * (adapter._topology.queue(queue).max_size + 1)
        adapter.dead_letter(delivery, reason="failed", body=too_big)
        [dead] = adapter.dead_letters(queue)
        assert (dead.message_id, dead.reason, dead.body) == ("big", "failed", b"delivered")
    finally:
        adapter.delete_dead(queue)
        adapter.close()


def test_dead_letter_listing_survives_dead_letters_ackwise_did_not_write(sqs_url: str) -> None:
    # Defect: _dead_letter_of did int() on a NaN or infinite ackwise-attempt (ValueError,
    # OverflowError) and b64decode on a body that is not base64: `ackwise dlq list` crashed.
    adapter = open_adapter(sqs_url)
    assert isinstance(adapter, SQSAdapter)
    adapter.open()
    queue = f"deadlist-{uuid.uuid4().hex[:8]}"
    try:
        adapter.declare(QueueSpec(queue, max_deliveries=3))
        client = adapter._client.boto
        dlq = adapter._topology.queue(queue).dlq_url
        letters: list[tuple[str, Attributes]] = [
            ("a", {_ID: _string("a"), "ackwise-attempt": _string("nan")}),
            ("b", {_ID: _string("b"), "ackwise-attempt": _string("inf")}),
            ("c", {"ackwise-dead-at": _string("inf"), "ackwise-attempt": _number("2.5")}),
            ("not base64", {_ID: _string("d"), _ENC: _string("base64")}),
            ("e", {_ID: _binary(b"e"), "ackwise-reason": _binary(b"why")}),
        ]
        for body, attributes in letters:
            client.send_message(QueueUrl=dlq, MessageBody=body, MessageAttributes=attributes)
        listed = {d.body: d for d in adapter.dead_letters(queue)}
        assert sorted(listed) == [b"a", b"b", b"c", b"e", b"not base64"]
        assert all(math.isfinite(d.dead_at) and d.dead_at > 0 for d in listed.values())
        assert {listed[b"a"].attempt, listed[b"b"].attempt, listed[b"c"].attempt} == {4}
        assert listed[b"not base64"].message_id == "d"
        assert listed[b"e"].reason == "unknown" and listed[b"e"].message_id != "e"
        assert listed[b"c"].reason == "max_deliveries"  # no ackwise attributes: the redrive
        assert adapter.delete_dead(queue, ["d", listed[b"e"].message_id]) == 2
        assert adapter.requeue_dead(queue, ["a"]) == 1
        assert sorted(d.body for d in adapter.dead_letters(queue)) == [b"b", b"c"]
    finally:
        adapter.purge(queue)
        adapter.delete_dead(queue)
        adapter.close()


# -- property: any foreign message, among valid ones ------------------------------------------
# What SQS takes in a body or a String value: XML characters, at least one.
_xml_text = st.text(
    st.characters(min_codepoint=0x20, max_codepoint=0xD7FF) | st.sampled_from("\t\n\r"),
    min_size=1,
    max_size=40,
)
_valid_base64 = st.binary(min_size=1, max_size=48).map(lambda b: base64.b64encode(b).decode())
bodies = st.one_of(
    _xml_text,
    _valid_base64,
    st.sampled_from(["abc", "not base64", "YWJj\n", "====", "YQ", "!!!!"]),
    st.just('{"v": 1, "task": '),  # truncated JSON
    st.just('{"v": 99, "id": "x", "task": "t", "args": [], "kwargs": {}}'),
    st.integers(200_000, 900_000).map(lambda n: "y" * n),  # large
)


#: A record's due time is past, or beyond the horizon by more than the drain takes to receive
#: it (PENDING: ten minutes): one within the horizon is a real delay, which it would wait out.
PENDING = HORIZON + 600.0
BEYOND = HORIZON + 3600.0


@st.composite
def _due_values(draw: st.DrawFn) -> dict[str, Any]:
    # Offsets from the time of writing: past (due: delivered), beyond the horizon (corrupt).
    offset = draw(st.sampled_from([-3600.0, -1.0, BEYOND, 1e9]))
    text = draw(
        st.sampled_from(
            [f"{time.time() + offset:.3f}", "-5", "0", "1" + "0" * 30, "soon", "inf", "NaN"]
        )
    )
    kind = draw(st.sampled_from(["Number", "String", "Number.custom"]))
    return {"DataType": kind, "StringValue": text}


_numbers = st.one_of(
    st.integers(-(10**20), 10**20).map(str),
    st.decimals(-(10**6), 10**6, places=3, allow_nan=False, allow_infinity=False).map(
        lambda d: f"{d:f}"
    ),
)
_values = st.one_of(
    st.builds(_string, _xml_text),
    st.builds(_number, _numbers),
    st.builds(lambda v: {"DataType": "String.custom", "StringValue": v}, _xml_text),
    st.builds(_binary, st.binary(min_size=1, max_size=20)),
    st.builds(lambda v: {"DataType": "Binary.gz", "BinaryValue": v}, st.binary(min_size=1)),
)


def _not_pending(attr: dict[str, Any]) -> bool:
    """Whether a due attribute is no real delay (a number from now to :data:`PENDING`)."""
    try:
        due = float(attr.get("StringValue", "x"))
    except ValueError:
        return True
    now = time.time()
    return not now < due <= now + PENDING


_foreign_names = st.from_regex(r"[a-z][a-z0-9_-]{0,19}", fullmatch=True)
attributes = st.builds(
    lambda ackwise, foreign: {**foreign, **ackwise},
    st.fixed_dictionaries(
        {},
        optional={
            _ID: _values,
            _ENC: st.one_of(st.just(_string("base64")), st.builds(_string, _xml_text), _values),
            # a number drawn at random can fall within the horizon (it did: 12.99 h ahead)
            _DUE: st.one_of(_due_values(), _values).filter(_not_pending),
            "ackwise-reason": _values,
            "ackwise-attempt": _values,
        },
    ),
    st.dictionaries(_foreign_names, _values, max_size=3),
)


def _expected(body: str, attrs: Attributes) -> bytes:
    """The bytes its dead letter must hold: the decoded body when the framing is ackwise's
    (the worker then finds no envelope: decode_error), else the record as SQS holds it."""
    raw = body.encode()
    try:
        if _ID in attrs and not attrs[_ID].get("StringValue"):
            return raw
        if _DUE in attrs:
            due = float(attrs[_DUE].get("StringValue", "x"))
            if not math.isfinite(due) or due > time.time() + HORIZON:
                return raw
        if _ENC in attrs:
            if attrs[_ENC].get("StringValue") != "base64":
                return raw
            return base64.b64decode(body, validate=True)
    except ValueError:
        return raw
    return raw


@given(records=st.lists(st.tuples(bodies, attributes), min_size=1, max_size=4))
@settings(
    max_examples=12,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)
def test_foreign_messages_never_cost_a_valid_message_nor_the_worker(
    sqs_url: str, send_raw: Send, records: list[tuple[str, Attributes]]
) -> None:
    def write(queue: str, record: tuple[str, Attributes]) -> bytes:
        body, attrs = record
        expected = _expected(body, attrs)
        send_raw(queue, body, attrs)
        return expected

    drain_among_corrupt(sqs_url, records, write, lease=LEASE)
