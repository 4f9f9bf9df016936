"""``sqs://`` URL parsing and the mapping of botocore's exceptions into ackwise.errors."""

from __future__ import annotations

import inspect
import logging

import pytest
from botocore import exceptions as bx

from ackwise import BrokerURL, errors, open_adapter
from ackwise_conformance.brokers import free_port
from ackwise_sqs import SQSAdapter, map_botocore_errors, parse_sqs_url, translate_botocore_error


def _settings(url: str):  # type: ignore[no-untyped-def]
    return parse_sqs_url(BrokerURL.parse(url))


# -- URLs ----------------------------------------------------------------------------------


def test_sqs_url_with_every_option() -> None:
    s = _settings(
        "sqs://?region=eu-west-1&endpoint_url=http://127.0.0.1:5000&prefix=shop-&profile=ops"
        "&message_group=orders&max_native_delay=60"
    )
    assert (s.region, s.endpoint_url, s.prefix, s.profile) == (
        "eu-west-1",
        "http://127.0.0.1:5000",
        "shop-",
        "ops",
    )
    assert (s.message_group, s.max_native_delay) == ("orders", 60.0)


def test_defaults() -> None:
    s = _settings("sqs://")
    assert (s.region, s.endpoint_url, s.prefix, s.profile) == (None, None, "", None)
    assert (s.message_group, s.max_native_delay) == ("default", 900.0)


@pytest.mark.parametrize(
    ("url", "says"),
    [
        ("sqs://AKIAEXAMPLE:s3cr3t@", "credentials in the URL are not accepted"),
        ("sqs://queue.example.com", "options in the query string only"),
        ("sqs://?regoin=eu-west-1", "unknown option(s) regoin"),
        ("sqs://?endpoint_url=ftp://x", "endpoint_url must be an http(s) URL"),
        ("sqs://?prefix=bad:prefix", "prefix"),
        ("sqs://?region=EU WEST", "not a region name"),
        ("sqs://?max_native_delay=901", "at most 900 seconds"),
        ("sqs://?max_native_delay=soon", "number of seconds"),
    ],
)
def test_bad_urls_are_refused_with_the_reason(url: str, says: str) -> None:
    with pytest.raises(errors.InvalidBrokerURL) as info:
        open_adapter(url)
    assert says in str(info.value)
    assert "s3cr3t" not in str(info.value)


def test_sqs_scheme_is_served_by_the_plugin() -> None:
    assert isinstance(open_adapter("sqs://?region=us-east-1"), SQSAdapter)


def test_credentials_are_never_logged(
    caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "AKIASECRETKEYID")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "very-secret-value")
    port = free_port()  # nothing listens there
    adapter = open_adapter(f"sqs://?region=us-east-1&endpoint_url=http://127.0.0.1:{port}")
    caplog.set_level(logging.DEBUG)
    with pytest.raises(errors.BrokerUnavailable) as info:
        adapter.stats("jobs")
    text = caplog.text + str(info.value)
    assert "very-secret-value" not in text
    assert "AKIASECRETKEYID" not in str(info.value)
    adapter.close()


# -- error mapping -------------------------------------------------------------------------


def _client_error(code: str, status: int) -> bx.ClientError:
    return bx.ClientError(
        {"Error": {"Code": code, "Message": "m"}, "ResponseMetadata": {"HTTPStatusCode": status}},
        "ReceiveMessage",
    )


@pytest.mark.parametrize(
    ("code", "status", "expected"),
    [
        ("ThrottlingException", 400, errors.TransientAdapterError),
        ("RequestThrottled", 403, errors.TransientAdapterError),
        ("InternalError", 500, errors.TransientAdapterError),
        ("ServiceUnavailable", 503, errors.TransientAdapterError),
        ("SomethingNew", 502, errors.TransientAdapterError),
        ("AccessDenied", 403, errors.AuthenticationFailed),
        ("InvalidClientTokenId", 403, errors.AuthenticationFailed),
        ("SignatureDoesNotMatch", 403, errors.AuthenticationFailed),
        ("AWS.SimpleQueueService.NonExistentQueue", 400, errors.QueueNotFound),
        ("QueueDoesNotExist", 400, errors.QueueNotFound),
        ("InvalidParameterValue", 400, errors.PermanentAdapterError),
    ],
)
def test_client_errors_are_mapped_by_code_and_status(
    code: str, status: int, expected: type[errors.AdapterError]
) -> None:
    with pytest.raises(expected) as info, map_botocore_errors("SQS ReceiveMessage"):
        raise _client_error(code, status)
    assert isinstance(info.value.__cause__, bx.ClientError)
    assert code in str(info.value)
    assert isinstance(info.value, errors.TransientAdapterError) == (
        expected is errors.TransientAdapterError
    )


@pytest.mark.parametrize(
    "exc",
    [
        bx.EndpointConnectionError(endpoint_url="http://x"),
        bx.ConnectionClosedError(endpoint_url="http://x"),
        bx.ReadTimeoutError(endpoint_url="http://x"),
        bx.ConnectTimeoutError(endpoint_url="http://x"),
    ],
)
def test_connection_errors_are_broker_unavailable(exc: Exception) -> None:
    assert isinstance(translate_botocore_error(exc), errors.BrokerUnavailable)


def test_missing_credentials_and_region_are_clear() -> None:
    assert isinstance(
        translate_botocore_error(bx.NoCredentialsError()), errors.AuthenticationFailed
    )
    assert isinstance(translate_botocore_error(bx.NoRegionError()), errors.ConfigurationError)


def _all_botocore_errors() -> list[type[Exception]]:
    return [
        cls
        for _, cls in inspect.getmembers(bx, inspect.isclass)
        if issubclass(cls, bx.BotoCoreError | bx.ClientError)
    ]


def test_no_botocore_error_is_left_unmapped() -> None:
    """Every botocore exception class maps to an ackwise error (a new one would fail here)."""
    for cls in _all_botocore_errors():
        exc = cls.__new__(cls)
        Exception.__init__(exc, "x")
        if isinstance(exc, bx.ClientError):
            exc.response = {"Error": {"Code": "X"}, "ResponseMetadata": {}}
        mapped = translate_botocore_error(exc)
        assert isinstance(mapped, errors.AdapterError | errors.ConfigurationError), cls
