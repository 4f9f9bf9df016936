"""An option the app's stores or broker cannot serve is refused by the producer — when the app is
made, when the task is declared, or at the first send — in the one line a worker would refuse
it with at start, before anything is published (docs/configuration.md, "Where options are
checked").

The producer and the worker call one check (``ackwise.app._requirements``): the table-driven tests
build each option on each broker both ways and compare the verdicts.  Nothing here needs the
brokers to answer (the check connects nowhere), except the tests that look at a real queue to
show that nothing was published.
"""

from __future__ import annotations

import dataclasses
import socket
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

import ackwise
from ackwise import App, LeaseExtension, Worker, WorkerConfig, chord
from ackwise.backends.memory._adapter import MemoryAdapter
from ackwise.beat._loop import Beat, BeatConfig
from ackwise.errors import ConfigurationError
from ackwise.spi import QueueSpec
from ackwise.testing import eager
from ackwise_conformance.brokers import missing_broker

#: Every broker, at an address nothing listens on (the check must not connect anywhere).
BROKERS = {
    "memory": "memory://refused-{id}",
    "sqlite": "sqlite:///{tmp}/q.db",
    "redis": "redis://:s3cret@127.0.0.1:1/0",
    "rabbitmq": "amqp://guest:s3cret@127.0.0.1:1/%2F",
    "sqs": "sqs://?region=eu-west-1&endpoint_url=http://127.0.0.1:1",
    "postgresql": "postgresql://postgres:s3cret@127.0.0.1:1/test",
    "nats": "nats://app:s3cret@127.0.0.1:1",
}

#: What each broker keeps of its own (docs/configuration.md's table; the plugins register it).
OWN_STORES = {
    "memory": {"result", "idempotency", "rate limit", "worker registry"},
    "sqlite": {"result", "idempotency", "rate limit", "worker registry"},
    "redis": {"result", "idempotency", "rate limit", "worker registry"},
    "postgresql": {"result", "idempotency", "worker registry"},
    "rabbitmq": set(),
    "sqs": set(),
    "nats": set(),
}

#: The App option giving each kind of store, and the attribute holding the URL in use.
STORE_OPTION = {
    "result": ("result_store", "result_store_url"),
    "idempotency": ("idempotency_store", "idempotency_store_url"),
    "rate limit": ("rate_limit_store", "rate_limit_store_url"),
    "worker registry": ("worker_registry", "worker_registry_url"),
}


def _key(*args: Any) -> str:
    return "k"


def _body(*args: Any) -> None:
    return None


#: An option (as its refusal names it), the store it needs, App(...) and @app.task(...) kwargs.
OPTIONS: list[tuple[str, str, dict[str, Any], dict[str, Any]]] = [
    ("store_results=True", "result", {"store_results": True}, {}),
    ("store_results=True", "result", {}, {"store_results": True}),
    ("store_results=True", "result", {}, {"store_results": True, "track_started": True}),
    ("rate_limit='5/s'", "rate limit", {}, {"rate_limit": "5/s"}),
    ("idempotency_key", "idempotency", {}, {"idempotency_key": _key}),
]


def _url(broker: str, tmp_path: Path) -> str:
    return BROKERS[broker].format(id=uuid.uuid4().hex[:8], tmp=tmp_path)


def _refusal(build: Callable[[], object]) -> str | None:
    """The ConfigurationError's text ``build()`` raises, or ``None`` when it raises none."""
    try:
        build()
    except ConfigurationError as exc:
        return str(exc)
    return None


def _producer(url: str, app_kwargs: dict[str, Any], task_kwargs: dict[str, Any]) -> None:
    """What a producer does: make the app, declare the task, send it (eagerly: the first send's
    check runs as on a broker, and nothing needs one)."""
    app = App("matrix", broker=url, **app_kwargs)
    t = app.task(name="matrix.t", **task_kwargs)(_body)
    with eager(app):
        t.delay()


def _worker(app: App) -> None:
    Worker(app, WorkerConfig(pool="threads"))


def _as_plain(app: App, url: str, kind: str) -> App:
    """``app`` given the ``kind`` store URL that ``App(broker=url)`` has (maybe none)."""
    attribute = STORE_OPTION[kind][1]
    setattr(app, attribute, getattr(App("plain", broker=url), attribute))
    return app


def _one_line_naming_the_fix(message: str, option: str, kind: str) -> None:
    assert "\n" not in message
    assert option in message and f"set App({STORE_OPTION[kind][0]}=URL)" in message
    assert "s3cret" not in message  # the broker URL is named, its password is not


@pytest.mark.parametrize("broker", sorted(BROKERS))
@pytest.mark.parametrize(
    ("option", "kind", "app_kwargs", "task_kwargs"),
    OPTIONS,
    ids=["App-store_results", "task-store_results", "track_started", "rate_limit", "key"],
)
def test_the_producer_refuses_an_option_exactly_when_a_worker_would(
    broker: str,
    option: str,
    kind: str,
    app_kwargs: dict[str, Any],
    task_kwargs: dict[str, Any],
    tmp_path: Path,
) -> None:
    url = _url(broker, tmp_path)
    producer = _refusal(lambda: _producer(url, app_kwargs, task_kwargs))

    # The worker's verdict on the same configuration: an app the producer accepts (it is given
    # a store of that kind), then left with the store the broker alone gives it.
    store_option = STORE_OPTION[kind][0]
    app = App("matrix", broker=url, **app_kwargs, **{store_option: f"memory://{uuid.uuid4()}"})
    app.task(name="matrix.t", **task_kwargs)(_body)
    worker = _refusal(lambda: _worker(_as_plain(app, url, kind)))

    assert producer == worker  # the same check: the same verdict, in the same words
    assert (producer is not None) == (kind not in OWN_STORES[broker])
    if producer is not None:
        _one_line_naming_the_fix(producer, option, kind)


@pytest.mark.parametrize("broker", sorted(BROKERS))
@pytest.mark.parametrize("kind", sorted(STORE_OPTION))
def test_a_store_url_of_a_scheme_without_that_store_is_refused_by_producer_and_worker_alike(
    broker: str, kind: str, tmp_path: Path
) -> None:
    given = _url(broker, tmp_path)
    store_option, attribute = STORE_OPTION[kind]
    home = f"sqlite:///{tmp_path / 'home.db'}"  # a broker with every store of its own
    producer = _refusal(lambda: App("given", broker=home, **{store_option: given}))

    app = App("given", broker=home)
    setattr(app, attribute, given)
    worker = _refusal(lambda: _worker(app))

    assert producer == worker
    assert (producer is not None) == (kind not in OWN_STORES[broker])
    if producer is not None:
        assert "\n" not in producer and "s3cret" not in producer
        assert producer.startswith(f"app 'given': {store_option}=")
        assert "give a URL of one of: " in producer


@pytest.mark.parametrize("broker", sorted(BROKERS))
def test_track_started_on_a_task_that_stores_no_results_is_refused_everywhere(
    broker: str, tmp_path: Path
) -> None:
    url = _url(broker, tmp_path)
    producer = _refusal(lambda: _producer(url, {}, {"track_started": True}))
    app = App("matrix", broker=url)
    t = app.task(name="matrix.t")(_body)
    t.track_started = True  # as if declared so: the worker's verdict
    worker = _refusal(lambda: _worker(app))
    assert producer == worker
    assert producer == (
        "task 'matrix.t': track_started=True records its start in the result store, but the "
        "task stores no results; set store_results=True on it (or App(store_results=True)), "
        "or drop track_started"
    )


def test_an_explicit_store_of_another_scheme_serves_a_broker_without_one(tmp_path: Path) -> None:
    """NATS keeps no results, limits or keys of its own: stores given elsewhere serve it."""
    stores = f"sqlite:///{tmp_path / 'stores.db'}"
    app = App(
        "given",
        broker="nats://127.0.0.1:1",
        store_results=True,
        result_store=stores,
        rate_limit_store=stores,
        idempotency_store=stores,
    )
    app.task(name="given.t", rate_limit="5/s", idempotency_key=_key, track_started=True)(_body)
    _worker(app)


# -- one test per refused pair, on a real broker: nothing is published ---------------------------
def _answers(port: int, what: str) -> None:
    try:
        socket.create_connection(("127.0.0.1", port), timeout=1).close()
    except OSError:
        missing_broker(f"{what} is not answering on 127.0.0.1:{port}")


@pytest.fixture
def rabbitmq() -> str:
    _answers(5672, "RabbitMQ")
    return "amqp://guest:guest@127.0.0.1:5672/%2F"


@pytest.fixture
def queue_of(tmp_path: Path) -> Iterator[Callable[[str], str]]:
    """``queue_of(url)``: a new queue, declared on that broker, and deleted after the test."""
    made: list[tuple[ackwise.Adapter, str]] = []

    def make(url: str) -> str:
        adapter = App("watch", broker=url).adapter()
        adapter.open()
        queue = f"refused-{uuid.uuid4().hex[:12]}"
        adapter.declare(QueueSpec(queue))
        made.append((adapter, queue))
        return queue

    yield make
    for adapter, queue in made:
        adapter.delete_queue(queue)
        adapter.close()


def _nothing_published(url: str, queue: str) -> None:
    adapter = App("watch", broker=url).adapter()
    adapter.open()
    try:
        stats = adapter.stats(queue)
        assert (stats.ready, stats.delayed, stats.in_flight) == (0, 0, 0)
    finally:
        adapter.close()


def test_a_task_storing_results_on_rabbitmq_without_a_result_store_is_refused_when_declared(
    rabbitmq: str, queue_of: Callable[[str], str]
) -> None:
    queue = queue_of(rabbitmq)
    app = App("shop", broker=rabbitmq, default_queue=queue)
    with pytest.raises(ConfigurationError) as refused:

        @app.task(name="shop.add", store_results=True)
        def add(a: int, b: int) -> int:
            return a + b

        add.delay(1, 2)
    assert str(refused.value) == (
        "task 'shop.add': store_results=True needs a result store, and broker "
        "amqp://guest:***@127.0.0.1:5672/%2F keeps no results of its own; set "
        "App(result_store=URL) with a URL of one of: "
        + ", ".join(app.plugins.adapters.store_schemes("result"))
    )
    assert "shop.add" not in app.tasks
    _nothing_published(rabbitmq, queue)
    app.close()


def test_a_keyed_task_on_rabbitmq_without_an_idempotency_store_is_refused_when_declared(
    rabbitmq: str, queue_of: Callable[[str], str]
) -> None:
    queue = queue_of(rabbitmq)
    app = App("shop", broker=rabbitmq, default_queue=queue)
    with pytest.raises(ConfigurationError) as refused:

        @app.task(name="shop.charge", idempotency_key=lambda order: f"charge:{order}")
        def charge(order: int) -> None:
            pass

        charge.delay(7)
    message = str(refused.value)
    assert "\n" not in message
    assert message.startswith(
        "task 'shop.charge': idempotency_key needs an idempotency store, and broker "
        "amqp://guest:***@127.0.0.1:5672/%2F keeps no idempotency keys of its own; set "
        "App(idempotency_store=URL) with a URL of one of: "
    )
    _nothing_published(rabbitmq, queue)
    app.close()


def test_a_rate_limited_task_on_postgresql_without_a_rate_limit_store_is_refused_when_declared(
    pg_schema_url: str, queue_of: Callable[[str], str]
) -> None:
    """PostgreSQL keeps results, keys and workers, not rate limits."""
    queue = queue_of(pg_schema_url)
    app = App("api", broker=pg_schema_url, default_queue=queue)
    with pytest.raises(ConfigurationError) as refused:

        @app.task(name="api.call", rate_limit="5/s")
        def call() -> None:
            pass

        call.delay()
    message = str(refused.value)
    assert "\n" not in message
    assert message.startswith(
        "task 'api.call': rate_limit='5/s' needs a rate limit store, and broker postgresql://"
    )
    assert "keeps no shared rate limits of its own; set App(rate_limit_store=URL)" in message
    _nothing_published(pg_schema_url, queue)
    app.close()


def test_track_started_without_results_is_refused_when_declared(
    tmp_path: Path, queue_of: Callable[[str], str]
) -> None:
    url = f"sqlite:///{tmp_path / 'q.db'}"
    queue = queue_of(url)
    app = App("shop", broker=url, default_queue=queue)
    with pytest.raises(ConfigurationError, match=r"^task 'shop.ship': track_started=True"):

        @app.task(name="shop.ship", track_started=True)
        def ship() -> None:
            pass

        ship.delay()
    _nothing_published(url, queue)
    app.close()


def test_a_result_store_url_that_keeps_no_results_is_refused_when_the_app_is_made(
    tmp_path: Path, queue_of: Callable[[str], str]
) -> None:
    url = f"sqlite:///{tmp_path / 'q.db'}"
    queue = queue_of(url)
    with pytest.raises(ConfigurationError) as refused:
        app = App(
            "shop",
            broker=url,
            default_queue=queue,
            result_store="amqp://guest:s3cret@127.0.0.1:5672/%2F",
        )
        app.task(name="shop.add")(_body).delay()
    assert str(refused.value) == (
        "app 'shop': result_store='amqp://guest:***@127.0.0.1:5672/%2F' cannot keep results: "
        "no installed plugin provides a result store for amqp:// URLs; give a URL of one of: "
        + ", ".join(ackwise.get_plugins().adapters.store_schemes("result"))
    )
    _nothing_published(url, queue)


def test_a_chord_on_rabbitmq_without_a_result_store_is_refused_when_sent(
    rabbitmq: str, queue_of: Callable[[str], str]
) -> None:
    queue = queue_of(rabbitmq)
    app = App("wf", broker=rabbitmq, default_queue=queue)
    one = app.task(name="wf.one")(_body)
    with pytest.raises(ConfigurationError) as refused:
        chord([one.s(), one.s()], one.s()).delay()
    message = str(refused.value)
    assert "\n" not in message
    assert message.startswith(
        "app 'wf': a chord, which counts its members there, needs a result store, and broker "
        "amqp://guest:***@127.0.0.1:5672/%2F keeps no results of its own; set "
        "App(result_store=URL)"
    )
    _nothing_published(rabbitmq, queue)
    app.close()


def test_an_app_changed_after_it_was_made_is_refused_at_its_first_send_as_by_a_worker(
    rabbitmq: str, queue_of: Callable[[str], str]
) -> None:
    queue = queue_of(rabbitmq)
    app = App("shop", broker=rabbitmq, default_queue=queue)
    add = app.task(name="shop.add")(_body)
    app.store_results = True  # after the app was made: its construction did not see it
    sent = _refusal(lambda: add.delay())
    assert sent is not None and sent.startswith("app 'shop': store_results=True needs")
    assert _refusal(lambda: _worker(app)) == sent
    _nothing_published(rabbitmq, queue)
    app.close()


class _FixedLeaseMemory(MemoryAdapter):
    """A memory broker whose leases cannot be extended (as a third-party adapter may say)."""

    capabilities = dataclasses.replace(
        MemoryAdapter.capabilities, lease_extension=LeaseExtension.NONE
    )


def test_a_task_without_a_time_limit_on_a_broker_that_cannot_extend_leases_is_refused(
    plugins_serving: Callable[[str, str], ackwise.Plugins],
) -> None:
    plugins = plugins_serving("fixedlease", f"{__name__}:_FixedLeaseMemory")
    url = f"fixedlease://{uuid.uuid4().hex[:8]}"
    app = App("fixed", broker=url, plugins=plugins)
    with pytest.raises(ConfigurationError) as refused:

        @app.task(name="fixed.open_ended")
        def open_ended() -> None:
            pass

        open_ended.delay()
    assert str(refused.value) == (
        f"task 'fixed.open_ended': broker {url} cannot extend leases, and the task has no "
        "time_limit, so it may outlive its delivery's lease; give it a time_limit within the "
        "workers' --lease"
    )
    bounded = app.task(name="fixed.bounded", time_limit=5.0)(_body)
    bounded.delay()  # a time_limit: accepted, and the worker checks it against its --lease
    adapter = app.adapter()
    adapter.open()
    assert adapter.stats(app.default_queue).ready == 1  # the bounded call alone
    adapter.close()
    app.close()
    with pytest.raises(ConfigurationError, match=r"may run longer than --lease 2\.0s"):
        Worker(app, WorkerConfig(pool="prefork", app_path="x:app", lease=2.0))


def test_beat_refuses_a_lock_url_without_a_leader_lock_and_the_app_does_not() -> None:
    """The app cannot know where its beats take their lock (``--lock``): ``ackwise beat``
    refuses at start, before it connects anywhere, naming the URL and the option."""
    app = App("nightly", broker="amqp://guest:s3cret@127.0.0.1:1/%2F")
    app.periodic(app.task(name="nightly.report")(_body), every=60)  # accepted
    with pytest.raises(ConfigurationError) as refused:
        Beat(app)
    assert str(refused.value) == (
        "ackwise beat: app 'nightly' has periodic schedules, and its lock URL "
        "amqp://guest:***@127.0.0.1:1/%2F (the app's broker; no --lock given) has no leader "
        "lock: no installed plugin provides one for amqp:// URLs; pass --lock with a URL of "
        "one of: " + ", ".join(app.plugins.lock_backends.schemes())
    )
    assert Beat(app, BeatConfig(lock=f"memory://{uuid.uuid4().hex[:8]}")).lock is not None
