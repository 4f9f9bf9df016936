"""URL parsing and the mapping of redis-py's exceptions into ackwise.errors."""

from __future__ import annotations

import inspect
from pathlib import Path

import pytest
import redis.exceptions as rx

from ackwise import BrokerURL, errors, open_adapter
from ackwise_conformance.brokers import BrokerHandle, free_port
from ackwise_redis import ERROR_MAP, RedisAdapter, map_redis_errors, parse_redis_url


def _settings(url: str):  # type: ignore[no-untyped-def]
    return parse_redis_url(BrokerURL.parse(url))


# -- URLs ----------------------------------------------------------------------------------


def test_redis_url_with_credentials_db_and_options() -> None:
    s = _settings(
        "redis://app:p%40ss@cache.internal:6380/3?prefix=shop&strict=true&socket_timeout=2.5"
        "&health_check_interval=0&client_name=w1"
    )
    assert (s.scheme, s.host, s.port, s.db) == ("redis", "cache.internal", 6380, 3)
    assert (s.username, s.password) == ("app", "p@ss")
    assert (s.prefix, s.strict, s.socket_timeout, s.health_check_interval) == (
        "shop",
        True,
        2.5,
        0.0,
    )
    assert s.client_name == "w1"
    assert "p@ss" not in repr(s) and "p@ss" not in s.where


def test_defaults() -> None:
    s = _settings("redis://localhost")
    assert (s.port, s.db, s.prefix, s.strict, s.username, s.password) == (
        6379,
        0,
        "ackwise",
        False,
        None,
        None,
    )
    assert s.connection_kwargs()["socket_keepalive"] is True


def test_password_without_username() -> None:
    s = _settings("redis://:secret@localhost:6379/0")
    assert (s.username, s.password) == (None, "secret")


def test_rediss_url_carries_tls_options() -> None:
    s = _settings("rediss://h:6380/0?ssl_cert_reqs=none&ssl_ca_certs=/etc/ca.pem")
    assert s.tls == {
        "ssl_cert_reqs": "none",
        "ssl_ca_certs": "/etc/ca.pem",
        "ssl_check_hostname": False,
    }
    assert _settings("rediss://h").tls["ssl_check_hostname"] is True


def test_unix_socket_url() -> None:
    s = _settings("unix:///run/redis/redis.sock?db=2&prefix=x")
    assert (s.scheme, s.path, s.db, s.prefix) == ("unix", "/run/redis/redis.sock", 2, "x")
    kwargs = s.connection_kwargs()
    assert kwargs["path"] == "/run/redis/redis.sock" and "host" not in kwargs


@pytest.mark.parametrize(
    ("url", "match"),
    [
        ("redis:///0", "no host"),
        ("redis://h/abc", "database 'abc'"),
        ("redis://h/0?bogus=1", r"unknown redis option\(s\) 'bogus'.*accepted options"),
        ("redis://h/0?ssl_cert_reqs=none", "TLS options need a rediss:// URL"),
        ("rediss://h/0?ssl_cert_reqs=maybe", "ssl_cert_reqs='maybe'"),
        ("redis://h/0?strict=perhaps", "strict='perhaps' must be true or false"),
        ("redis://h/0?socket_timeout=-1", "socket_timeout='-1'"),
        ("redis://h/0?socket_timeout=soon", "socket_timeout='soon'"),
        ("redis://h/0?prefix=a{b}", "prefix="),
        ("redis://h/0?db=1", r"unknown redis option\(s\) 'db'"),
        ("unix://host/sock", "names a socket path, not a host"),
        ("unix:///", "no socket path"),
        ("unix:///s.sock?db=x", "database 'x'"),
        ("redis://h:99999/0", "99999|out of range"),
    ],
)
def test_invalid_urls_are_refused_with_the_reason(url: str, match: str) -> None:
    with pytest.raises(errors.InvalidBrokerURL, match=match):
        open_adapter(url)


def test_invalid_url_error_does_not_show_the_password() -> None:
    with pytest.raises(errors.InvalidBrokerURL) as info:
        open_adapter("redis://u:hunter2@h/0?bogus=1")
    assert "hunter2" not in str(info.value)


def test_all_three_schemes_are_served_by_the_redis_adapter() -> None:
    for url in ("redis://h", "rediss://h", "unix:///s.sock"):
        assert isinstance(open_adapter(url), RedisAdapter)


def test_plugin_module_imports_no_driver() -> None:
    import subprocess
    import sys

    code = (
        "import sys, ackwise; ackwise.get_plugins().adapters.get('redis'); "
        "print('redis' in sys.modules, 'ackwise_redis._adapter' in sys.modules)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.split() == ["False", "False"]


# -- error mapping -------------------------------------------------------------------------


def _redis_exception_classes() -> list[type[BaseException]]:
    return [
        cls
        for _, cls in inspect.getmembers(rx, inspect.isclass)
        if issubclass(cls, BaseException) and cls.__module__ == rx.__name__
    ]


def test_every_redis_py_exception_class_is_mapped() -> None:
    """Fails when redis-py grows an exception class that map_redis_errors does not list."""
    unmapped = [c.__name__ for c in _redis_exception_classes() if c not in ERROR_MAP]
    assert not unmapped, f"add these redis-py exceptions to ERROR_MAP: {unmapped}"


@pytest.mark.parametrize("cls", _redis_exception_classes(), ids=lambda c: c.__name__)
def test_each_redis_py_exception_becomes_an_adapter_error_from_it(
    cls: type[BaseException],
) -> None:
    # Cluster redirects parse their text ("<slot> <host>:<port>").
    exc = cls("3999 127.0.0.1:6381" if issubclass(cls, rx.AskError) else "boom")
    with pytest.raises(errors.AdapterError) as info:
        with map_redis_errors("redis://h:6379/0"):
            raise exc
    assert info.value.__cause__ is exc
    assert isinstance(info.value, ERROR_MAP[cls][0])


@pytest.mark.parametrize(
    ("exc", "expected"),
    [
        (rx.ConnectionError("Connection refused"), errors.BrokerUnavailable),
        (rx.TimeoutError("Timeout reading"), errors.TransientAdapterError),
        (rx.BusyLoadingError("Redis is loading the dataset in memory"), errors.BrokerUnavailable),
        (rx.AuthenticationError("invalid username-password pair"), errors.AuthenticationFailed),
        (rx.ResponseError("BUSY Redis is busy running a script"), errors.TransientAdapterError),
        (
            rx.ResponseError("MISCONF Redis is configured to save RDB snapshots"),
            errors.TransientAdapterError,
        ),
        (rx.ResponseError("WRONGTYPE Operation against a key"), errors.PermanentAdapterError),
        (
            rx.OutOfMemoryError("command not allowed when used memory > 'maxmemory'"),
            errors.TransientAdapterError,
        ),
        (rx.NoPermissionError("this user has no permissions"), errors.PermanentAdapterError),
        (ConnectionResetError(104, "reset by peer"), errors.BrokerUnavailable),
        (TimeoutError("timed out"), errors.BrokerUnavailable),
    ],
)
def test_transient_and_permanent_errors(
    exc: BaseException, expected: type[errors.AdapterError]
) -> None:
    with pytest.raises(expected) as info:
        with map_redis_errors("redis://h:6379/0"):
            raise exc
    assert info.value.__cause__ is exc
    assert type(info.value) is expected


def test_a_password_echoed_by_the_driver_is_blanked() -> None:
    with pytest.raises(errors.AuthenticationFailed) as info:
        with map_redis_errors("redis://h:6379/0", secret="hunter2"):
            raise rx.AuthenticationError("bad password hunter2")
    assert "hunter2" not in str(info.value)


def test_unreachable_redis_is_broker_unavailable() -> None:
    adapter = open_adapter(f"redis://127.0.0.1:{free_port()}/0?socket_connect_timeout=2")
    with pytest.raises(errors.BrokerUnavailable, match=r"127\.0\.0\.1"):
        adapter.open()


def test_wrong_password_is_authentication_failed_without_the_password(
    own_redis: BrokerHandle,
) -> None:
    admin = open_adapter(own_redis.url)
    admin.open()
    conn = admin._server.connection()  # type: ignore[attr-defined]
    conn.send_command("ACL", "SETUSER", "worker", "on", ">right-pw", "~*", "+@all")
    conn.read_response()
    admin.close()
    wrong = open_adapter(f"redis://worker:wrong-pw-123@{own_redis.host}:{own_redis.port}/0")
    with pytest.raises(errors.AuthenticationFailed) as info:
        wrong.open()
    text = str(info.value) + repr(info.value) + str(info.value.__cause__)
    assert "wrong-pw-123" not in text and "right-pw" not in text
    right = open_adapter(f"redis://worker:right-pw@{own_redis.host}:{own_redis.port}/0")
    right.open()
    right.close()


def test_unix_socket_connection(own_redis_with_socket: Path) -> None:
    adapter = open_adapter(f"unix://{own_redis_with_socket}?db=1")
    adapter.open()
    assert adapter.queues() == []
    adapter.close()
