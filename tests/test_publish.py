"""Publishing: arguments are checked before any I/O, and bad input is a clear error."""

from __future__ import annotations

import datetime as dt
import uuid

import pytest

import ackwise
from ackwise import App
from ackwise.errors import (
    ConfigurationError,
    InvalidBrokerURL,
    InvalidSchedule,
    MessageTooLarge,
    NotSerializable,
    PublishError,
    UnknownBrokerScheme,
)
from ackwise.spi import QueueSpec


@pytest.fixture
def app():
    a = App("pub", broker=f"memory://{uuid.uuid4().hex}")
    yield a
    a.close()


def _stats(app: App, queue: str = "default"):
    adapter = app.adapter()
    adapter.open()
    adapter.declare(QueueSpec(queue))
    return adapter.stats(queue)


@pytest.mark.parametrize(
    ("args", "kwargs", "path", "type_name"),
    [
        ((1, {1, 2}), {}, "args[1]", "set"),
        ((1, {"a": [1, object()]}), {}, "args[1]['a'][1]", "object"),
        ((), {"when": dt.datetime.now()}, "kwargs['when']", "datetime.datetime"),
        ((b"raw",), {}, "args[0]", "bytes"),
        ((float("nan"),), {}, "args[0]", "float"),
        (({1: "int key"},), {}, "args[0] key 1", "int"),
        ((2**70,), {}, "args[0]", "int"),
    ],
)
def test_non_serializable_argument_names_its_path_and_publishes_nothing(
    app, args, kwargs, path, type_name
):
    @app.task(name="t")
    def t(*a, **k):
        pass

    with pytest.raises(NotSerializable) as info:
        t.apply_async(args, kwargs)
    assert info.value.path == path
    assert info.value.type_name == type_name
    assert path in str(info.value) and "nothing was published" in str(info.value)
    assert _stats(app).ready == 0


def test_one_bad_call_in_a_batch_publishes_none(app):
    @app.task(name="t")
    def t(x):
        pass

    with pytest.raises(NotSerializable):
        app.send_many([t.s(1), t.s(2), t.s({3})])
    assert _stats(app).ready == 0
    ids = t.map([(i,) for i in range(50)])
    assert len(set(ids)) == 50
    assert _stats(app).ready == 50


def test_too_deeply_nested_argument_is_refused_not_a_recursion_error(app):
    @app.task(name="t")
    def t(x):
        pass

    value: list = []
    for _ in range(5000):
        value = [value]
    with pytest.raises(NotSerializable, match="nested deeper than 200 levels"):
        t.delay(value)
    value = []
    for _ in range(150):
        value = [value]
    t.delay(value)
    assert _stats(app).ready == 1


@pytest.mark.parametrize(
    ("options", "fragment"),
    [
        ({"countdown": -1}, "countdown must be a finite number of seconds >= 0"),
        ({"countdown": float("inf")}, "countdown must be a finite number"),
        ({"eta": dt.datetime(2030, 1, 1)}, "is naive"),
        ({"countdown": 5, "eta": dt.datetime.now(dt.UTC)}, "not both"),
    ],
)
def test_bad_schedule_is_refused_before_any_io(app, options, fragment):
    @app.task(name="t")
    def t():
        pass

    with pytest.raises(InvalidSchedule, match=fragment):
        t.apply_async(**options)
    assert _stats(app).ready + _stats(app).delayed == 0


def test_aware_eta_and_countdown_become_native_delays(app):
    @app.task(name="t")
    def t():
        pass

    t.apply_async(countdown=60)
    t.apply_async(eta=dt.datetime.now(dt.UTC) + dt.timedelta(minutes=5))
    t.apply_async(eta=dt.datetime.now(dt.UTC) - dt.timedelta(minutes=5))  # past: due now
    st = _stats(app)
    assert (st.ready, st.delayed) == (1, 2)


def test_unknown_scheme_is_an_error_listing_installed_schemes_and_never_falls_back(
    tmp_path, monkeypatch
):
    monkeypatch.chdir(tmp_path)
    # Only the built-in adapters (as on a machine without ackwise-redis installed):
    core_only = ackwise.Plugins(autoload=False)
    with pytest.raises(UnknownBrokerScheme) as info:
        App("x", broker="redis://localhost:6379/0", plugins=core_only)
    message = str(info.value)
    assert "'redis'" in message and "memory, sqlite" in message
    assert "pip install 'ackwise[redis]'" in message
    with pytest.raises(UnknownBrokerScheme, match="'kafka'"):
        App("x", broker="kafka://somewhere")
    assert not list(tmp_path.iterdir()), "no sqlite file may be created as a fallback"


@pytest.mark.parametrize("url", ["not a url", "sqlite:/one-slash.db", "http://[::1"])
def test_malformed_broker_url_is_a_clear_error(url):
    with pytest.raises((InvalidBrokerURL, UnknownBrokerScheme)):
        App("x", broker=url)


def test_password_never_appears_in_errors_or_repr():
    with pytest.raises(UnknownBrokerScheme) as info:
        App("x", broker="amqp://user:s3cret@host/vhost", plugins=ackwise.Plugins(autoload=False))
    assert "s3cret" not in str(info.value)
    url = ackwise.BrokerURL.parse("amqp://user:s3cret@host/vhost")
    assert "s3cret" not in str(url) and "s3cret" not in repr(url)


def test_broker_defaults_to_env_then_embedded_sqlite(monkeypatch):
    monkeypatch.setenv("ACKWISE_BROKER_URL", "memory://from-env")
    assert App("x").broker_url == "memory://from-env"
    monkeypatch.delenv("ACKWISE_BROKER_URL")
    assert App("x").broker_url == "sqlite:///ackwise.db"


def test_task_name_defaults_to_module_and_function(app):
    @app.task
    def hello():
        pass

    assert hello.name == f"{__name__}.test_task_name_defaults_to_module_and_function.<locals>.hello"
    assert hello.ack is ackwise.Ack.LATE and hello.max_deliveries == 5


def test_bad_task_options_are_configuration_errors(app):
    with pytest.raises(ConfigurationError, match="ack must be"):
        app.task(ack="late")(lambda: None)
    with pytest.raises(ConfigurationError, match="max_deliveries"):
        app.task(max_deliveries=0)(lambda: None)
    with pytest.raises(ConfigurationError, match="retry_backoff_max"):
        app.task(retry_backoff=10, retry_backoff_max=1)(lambda: None)
    with pytest.raises(PublishError, match="invalid queue name"):
        app.task(queue="has space")(lambda: None)


def test_oversize_payload_is_refused_before_any_io(app, monkeypatch):
    caps = app.adapter_class.capabilities
    monkeypatch.setattr(
        app.adapter_class,
        "capabilities",
        ackwise.Capabilities(**{**vars(caps), "max_message_size": 1000}),
    )

    @app.task(name="t")
    def t(x):
        pass

    with pytest.raises(MessageTooLarge, match="accepts at most 1000"):
        t.delay("x" * 2000)
    assert _stats(app).ready == 0


def test_envelope_round_trip_and_version():
    from ackwise.contract import _envelope

    env = _envelope.Envelope(
        v=1,
        id="i",
        task="t",
        args=[1, "a"],
        kwargs={"k": [1.5]},
        queue="q",
        created_at=1.0,
        headers={"h": 1},
    )
    body = _envelope.encode(env)
    assert b'"v":1' in body
    assert _envelope.decode(body) == env
    from ackwise.errors import DecodeError, UnknownEnvelopeVersion

    with pytest.raises(UnknownEnvelopeVersion):
        _envelope.decode(body.replace(b'"v":1', b'"v":2'))
    with pytest.raises(DecodeError):
        _envelope.decode(b"\x00garbage")
    with pytest.raises(DecodeError):
        _envelope.decode(b'{"v":1,"id":"x"}')


def test_message_ids_ignore_random_seed_and_differ_in_a_forked_child() -> None:
    import os
    import random

    from ackwise.contract import _envelope

    random.seed(0)
    first = _envelope.new_id()
    random.seed(0)
    assert _envelope.new_id() != first  # the app's seeding does not repeat our ids
    assert len(first) == 32 and int(first, 16) >= 0
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child
        os.write(w, _envelope.new_id().encode())
        os._exit(0)
    os.waitpid(pid, 0)
    child = os.read(r, 64).decode()
    os.close(r)
    os.close(w)
    assert child != _envelope.new_id()  # the child's generator was seeded again
