"""URL parsing and the mapping of pika's exceptions into ackwise.errors."""

from __future__ import annotations

import inspect
import json
import subprocess
import sys
import uuid
from urllib.parse import urlsplit, urlunsplit

import pika.exceptions as px
import pytest

from ackwise import BrokerURL, errors, open_adapter
from ackwise.spi import QueueSpec
from ackwise_conformance.brokers import BrokerHandle, free_port
from ackwise_rabbitmq import (
    ERROR_MAP,
    RabbitMQAdapter,
    map_pika_errors,
    parse_rabbitmq_url,
    translate_pika_error,
)


def _settings(url: str):  # type: ignore[no-untyped-def]
    return parse_rabbitmq_url(BrokerURL.parse(url))


def test_amqp_url_with_credentials_vhost_heartbeat_and_options() -> None:
    s = _settings(
        "amqp://app:p%40ss@mq.internal:5673/shop%2Fprod?heartbeat=5&queue_type=classic"
        "&consumer_timeout=600&prefix=acme&confirm_timeout=3"
    )
    assert (s.scheme, s.host, s.port, s.vhost) == ("amqp", "mq.internal", 5673, "shop/prod")
    assert (s.username, s.password) == ("app", "p@ss")
    assert (s.heartbeat, s.queue_type, s.consumer_timeout, s.prefix) == (
        5.0,
        "classic",
        600.0,
        "acme",
    )
    assert s.confirm_timeout == 3.0
    assert "p@ss" not in repr(s) and "p@ss" not in s.where
    (params,) = s.connection_parameters()
    assert (params.host, params.port, params.virtual_host, params.heartbeat) == (
        "mq.internal",
        5673,
        "shop/prod",
        5,
    )


def test_defaults_are_rabbitmqs() -> None:
    s = _settings("amqp://localhost")
    assert (s.port, s.vhost, s.username, s.password) == (5672, "/", "guest", "guest")
    assert (s.queue_type, s.heartbeat, s.consumer_timeout) == ("quorum", 60.0, 1800.0)
    assert _settings("amqp://localhost/%2F").vhost == "/"
    assert _settings("amqps://localhost").port == 5671


def test_amqps_builds_a_tls_context() -> None:
    s = _settings("amqps://u:p@mq:5671/?verify=false&server_hostname=mq.example")
    (params,) = s.connection_parameters()
    assert params.ssl_options is not None
    assert params.ssl_options.server_hostname == "mq.example"
    assert params.ssl_options.context.check_hostname is False


def test_hosts_are_more_nodes_tried_in_order_after_the_urls_own() -> None:
    s = _settings("amqps://u:secret@a:5671/v?hosts=b,c:5680&verify=false")
    params = s.connection_parameters()
    assert [(p.host, p.port, p.virtual_host) for p in params] == [
        ("a", 5671, "v"),
        ("b", 5671, "v"),
        ("c", 5680, "v"),
    ]
    assert all(p.ssl_options is not None for p in params)
    assert s.where == "amqps://a:5671,b:5671,c:5680/v" and "secret" not in s.where


@pytest.mark.parametrize(
    ("url", "match"),
    [
        ("amqp://h/?hosts=b:x", "is not host:port"),
        ("amqp://h/?aux_queue_type=stream", "aux_queue_type"),
        ("amqp://h/?nope=1", "unknown option"),
        ("amqp://h/?queue_type=stream", "queue_type"),
        ("amqp://h/?heartbeat=0", "heartbeat must be > 0"),
        ("amqp://h/?heartbeat=soon", "not a number"),
        ("amqp://h/?verify=false", "need the amqps"),
        ("amqp://h/?priorities=true", "priorities=true needs queue_type=classic"),
        ("amqp://h/?queue_type=classic&priorities=maybe", "priorities must be true or false"),
    ],
)
def test_bad_urls_are_refused_with_the_reason(url: str, match: str) -> None:
    with pytest.raises(errors.InvalidBrokerURL, match=match):
        _settings(url)


def test_the_scheme_opens_the_rabbitmq_adapter_without_connecting() -> None:
    adapter = open_adapter("amqp://guest:secret@127.0.0.1:1/%2F")
    assert isinstance(adapter, RabbitMQAdapter)
    assert "secret" not in repr(adapter)


def test_an_unreachable_broker_is_transient_and_names_no_password() -> None:
    adapter = open_adapter(f"amqp://guest:s3cret@127.0.0.1:{free_port()}/%2F?connection_timeout=2")
    with pytest.raises(errors.BrokerUnavailable) as info:
        adapter.open()
    assert "s3cret" not in str(info.value)
    adapter.close()


def test_every_pika_exception_is_mapped() -> None:
    classes = {
        cls
        for _, cls in inspect.getmembers(px, inspect.isclass)
        if issubclass(cls, BaseException) and cls.__module__ == px.__name__
    }
    missing = sorted(c.__name__ for c in classes - set(ERROR_MAP))
    assert not missing, f"pika exceptions without an entry in ERROR_MAP: {missing}"


@pytest.mark.parametrize(
    ("exc", "expected"),
    [
        (px.AMQPConnectionError("refused"), errors.BrokerUnavailable),
        (px.StreamLostError("eof"), errors.BrokerUnavailable),
        (px.ProbableAuthenticationError("no"), errors.AuthenticationFailed),
        (px.ChannelClosedByBroker(404, "NOT_FOUND - no queue 'q'"), errors.QueueNotFound),
        (px.ChannelClosedByBroker(403, "ACCESS_REFUSED"), errors.AuthenticationFailed),
        (
            px.ChannelClosedByBroker(
                406, "PRECONDITION_FAILED - delivery acknowledgement on channel 1 timed out"
            ),
            errors.TransientAdapterError,
        ),
        (
            px.ChannelClosedByBroker(406, "PRECONDITION_FAILED - inequivalent arg"),
            errors.PermanentAdapterError,
        ),
        (
            px.ConnectionClosedByBroker(320, "CONNECTION_FORCED - broker shutdown"),
            errors.BrokerUnavailable,
        ),
        (px.UnroutableError([]), errors.PermanentAdapterError),
        (ConnectionResetError("reset"), errors.BrokerUnavailable),
    ],
)
def test_translation(exc: BaseException, expected: type[errors.AdapterError]) -> None:
    got = translate_pika_error(exc)
    assert type(got) is expected, got
    with pytest.raises(expected) as info, map_pika_errors():
        raise exc
    assert info.value.__cause__ is exc


def test_the_password_is_scrubbed_from_driver_messages() -> None:
    got = translate_pika_error(
        px.AMQPConnectionError("amqp://u:hunter2@h failed"), secret="hunter2"
    )
    assert "hunter2" not in str(got)


def test_the_conformance_suite_asks_for_heartbeats_as_short_as_its_leases() -> None:
    """A frozen consumer loses its deliveries when its connection ends: the crash scenarios'
    1 s leases need 2 s heartbeats, added to a URL that does not say, refused otherwise."""
    from ackwise_conformance.harness import lease_url

    base = "amqp://guest:guest@127.0.0.1:5672/%2F"
    assert RabbitMQAdapter.lease_options(1.0) == {"heartbeat": "2"}
    url, added = lease_url(base, 1.0)
    assert added == {"heartbeat": "2"} and _settings(url).heartbeat == 2.0
    assert lease_url(f"{base}?heartbeat=2", 1.0) == (f"{base}?heartbeat=2", {})
    assert lease_url(f"{base}?prefix=x", 2.0)[0] == f"{base}?prefix=x&heartbeat=4"
    with pytest.raises(errors.ConfigurationError, match=r"need heartbeat=2 .* sets heartbeat=60"):
        lease_url(f"{base}?heartbeat=60", 1.0)
    assert lease_url("sqlite:///x.db", 1.0) == ("sqlite:///x.db", {})


def test_in_flight_counts_every_consumer_only_through_the_management_api() -> None:
    # AMQP counts ready messages only: without the management API stats().in_flight is this
    # connection's own, and the capability says so (the suite then reads the journal).
    base = "amqp://guest:guest@127.0.0.1:5672/%2F"
    assert open_adapter(base).capabilities.global_in_flight is False
    managed = open_adapter(f"{base}?management=http://127.0.0.1:15672")
    assert managed.capabilities.global_in_flight is True


def _ackwise(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "ackwise", *args], capture_output=True, text=True, timeout=120
    )


def test_refused_credentials_are_one_line_from_ackwise(rabbitmq_broker: BrokerHandle) -> None:
    # pika logs the refusal at ERROR from several modules, with a traceback; ackwise says it
    # once, with pika's detail (docs/observability.md, "Broker errors").
    parts = urlsplit(rabbitmq_broker.url)
    wrong = parts._replace(netloc=f"guest:n0t-the-password@{parts.hostname}:{parts.port}")
    proc = _ackwise("stats", "--broker", urlunsplit(wrong), "-Q", f"q-{uuid.uuid4().hex[:8]}")
    assert proc.returncode == 2
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1, proc.stderr
    assert lines[0].startswith("ackwise: error: ") and "refused the credentials" in lines[0]
    assert "n0t-the-password" not in proc.stderr


def test_a_command_prints_no_driver_chatter(rabbitmq_broker: BrokerHandle) -> None:
    queue = f"q-{uuid.uuid4().hex[:8]}"
    adapter = open_adapter(rabbitmq_broker.url)
    adapter.open()
    adapter.declare(QueueSpec(queue))
    adapter.close()
    proc = _ackwise("stats", "--broker", rabbitmq_broker.url, "-Q", queue, "--json")
    assert proc.returncode == 0, proc.stderr
    assert proc.stderr == ""  # pika's INFO lines (~20 per connection) stay out
    assert json.loads(proc.stdout)["queues"][0]["queue"] == queue
    chatty = _ackwise(
        "--driver-loglevel", "INFO", "stats", "--broker", rabbitmq_broker.url, "-Q", queue
    )
    assert " INFO pika." in chatty.stderr  # unless asked for


def test_an_unreachable_broker_names_the_socket_error() -> None:
    # pika's AMQPConnectionError prints as nothing; its cause is the detail worth a line.
    proc = _ackwise(
        "stats", "--broker", f"amqp://guest:guest@127.0.0.1:{free_port()}/%2F", "-Q", "q"
    )
    assert proc.returncode == 2
    [line] = proc.stderr.strip().splitlines()
    assert "cannot reach RabbitMQ: ConnectionRefusedError: [Errno 111] Connection refused" in line
