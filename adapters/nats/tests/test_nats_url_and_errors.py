"""The NATS adapter's URLs and error mapping: one-line errors a user can act on."""

from __future__ import annotations

import socket

import nats.errors as nx
import pytest

from ackwise import BrokerURL, open_adapter
from ackwise.errors import (
    AuthenticationFailed,
    BrokerUnavailable,
    InvalidBrokerURL,
    PermanentAdapterError,
    QueueNotFound,
    TransientAdapterError,
)
from ackwise_nats._errors import JetStreamError, map_nats_errors, translate_nats_error
from ackwise_nats._names import QueueNames, decode, encode
from ackwise_nats._url import parse_nats_url


def _settings(url: str):  # type: ignore[no-untyped-def]
    return parse_nats_url(BrokerURL.parse(url))


def test_defaults() -> None:
    s = _settings("nats://broker")
    assert (s.server, s.prefix, s.ack_wait, s.timeout, s.tls) == (
        "nats://broker:4222",
        "ackwise",
        30.0,
        5.0,
        False,
    )


def test_options_credentials_and_tls() -> None:
    s = _settings("nats+tls://me:pw@broker:4443?prefix=app-1&ack_wait=60&timeout=2&replicas=3")
    assert (s.server, s.user, s.password, s.prefix, s.ack_wait, s.timeout, s.replicas) == (
        "tls://broker:4443",
        "me",
        "pw",
        "app-1",
        60.0,
        2.0,
        3,
    )
    assert s.tls
    assert "pw" not in s.where


@pytest.mark.parametrize(
    ("url", "says"),
    [
        ("nats://broker?bogus=1", "unknown option(s) bogus"),
        ("nats://broker/path", "unexpected path '/path'"),
        ("nats://broker?prefix=a.b", "prefix 'a.b' must be"),
        ("nats://broker?ack_wait=soon", "ack_wait='soon' must be a number of seconds"),
        ("nats://broker?ack_wait=0.5", "ack_wait='0.5' must be a number of seconds >= 1"),
        ("nats://broker?replicas=9", "replicas='9' must be 1 to 5"),
        ("nats://broker?tls_ca=/ca.pem", "tls_ca is for nats+tls:// URLs only"),
        ("nats://", "no host"),
        ("nats://u:hunter2@broker?bogus=1", "unknown option(s) bogus"),
    ],
)
def test_a_bad_url_is_one_line_naming_what_is_wrong(url: str, says: str) -> None:
    with pytest.raises(InvalidBrokerURL) as caught:
        open_adapter(url)
    message = str(caught.value)
    assert says in message
    assert "\n" not in message
    assert "hunter2" not in message


def _closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def test_connection_refused_is_a_clear_broker_unavailable() -> None:
    adapter = open_adapter(f"nats://user:hunter2@127.0.0.1:{_closed_port()}")
    with pytest.raises(BrokerUnavailable) as caught:
        adapter.open()
    message = str(caught.value)
    assert "cannot reach NATS" in message and "onnect" in message
    assert "hunter2" not in message and "\n" not in message
    adapter.close()


def test_tls_url_refuses_a_server_without_tls(nats_url: str) -> None:
    adapter = open_adapter(nats_url.replace("nats://", "nats+tls://", 1))
    with pytest.raises(PermanentAdapterError, match="does not offer TLS"):
        adapter.open()


def test_publish_to_an_undeclared_queue_is_queue_not_found(nats_url: str) -> None:
    from ackwise.spi import Outgoing

    adapter = open_adapter(nats_url)
    adapter.open()
    try:
        with pytest.raises(QueueNotFound, match="declare the queue first"):
            adapter.publish("never-declared", [Outgoing("m", b"x")])
        with pytest.raises(QueueNotFound, match="not declared"):
            adapter.receive("never-declared", max_messages=1, wait=0.0, lease=5.0)
    finally:
        adapter.close()


@pytest.mark.parametrize(
    ("exc", "kind"),
    [
        (nx.NoServersError(), BrokerUnavailable),
        (nx.ConnectionClosedError(), BrokerUnavailable),
        (nx.TimeoutError(), TransientAdapterError),
        (nx.AuthorizationError(), AuthenticationFailed),
        (nx.NoRespondersError(), TransientAdapterError),
        (ConnectionResetError(104, "reset"), BrokerUnavailable),
        (JetStreamError(404, 10059, "stream not found"), QueueNotFound),
        (JetStreamError(503, 10039, "JetStream not enabled"), TransientAdapterError),
        (JetStreamError(400, 10052, "bad request"), PermanentAdapterError),
    ],
)
def test_errors_are_mapped(exc: BaseException, kind: type[Exception]) -> None:
    error = translate_nats_error(exc, "NATS nats://h:4222: publish q")
    assert type(error) is kind
    assert str(error).startswith("NATS nats://h:4222: publish q: ")
    with pytest.raises(kind) as caught, map_nats_errors("NATS nats://h:4222"):
        raise exc
    assert caught.value.__cause__ is exc


@pytest.mark.parametrize("queue", ["jobs", "a.b", "x_y", "émoji ✓", "a*b>c", "-", "_2e"])
def test_queue_names_make_valid_stream_names_and_decode_back(queue: str) -> None:
    names = QueueNames.of("ackwise", queue)
    token = encode(queue)
    assert all(c.isascii() and (c.isalnum() or c in "-_") for c in token)
    assert "." not in names.stream and " " not in names.ready
    assert decode(token) == queue


def test_names_of_different_queues_never_meet() -> None:
    tokens = {encode(q) for q in ["a_b", "a.b", "a_5fb", "a-b", "A-b"]}
    assert len(tokens) == 5
    assert decode("a_zz") is None
