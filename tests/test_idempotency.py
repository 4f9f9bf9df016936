"""Idempotency keys (docs/idempotency.md): stores, and the worker honouring them."""

from __future__ import annotations

import time
import uuid

import pytest

import ackwise
from ackwise import App
from ackwise.errors import ConfigurationError
from ackwise.plugins._manager import open_store
from ackwise.stores._idempotency import KeyState
from ackwise.testing import run_worker


@pytest.fixture(params=["memory", "sqlite", "postgresql", "redis"])
def store(request, tmp_path):
    if request.param == "redis":
        url = request.getfixturevalue("private_redis").url
    elif request.param == "memory":
        url = f"memory://{uuid.uuid4().hex}"
    elif request.param == "sqlite":
        url = f"sqlite:///{tmp_path / 'keys.db'}"
    else:  # a schema of the test's own: the shared database keeps nothing of it
        url = request.getfixturevalue("pg_schema_url")
    s = open_store(url)
    yield s
    s.close()


def _key() -> str:
    return f"test:{uuid.uuid4().hex}"


def test_first_claim_runs_a_second_is_busy_and_a_completed_key_is_done(store):
    key = _key()
    assert store.claim(key, "w1", 30).state is KeyState.RUN
    busy = store.claim(key, "w2", 30)
    assert busy.state is KeyState.BUSY and 25 < busy.retry_after <= 30
    store.complete(key, "w1")
    assert store.claim(key, "w2", 30).state is KeyState.DONE


def test_a_dead_holders_key_is_taken_over_after_its_lease(store):
    key = _key()
    assert store.claim(key, "dead-worker", 0.2).state is KeyState.RUN
    assert store.claim(key, "w2", 30).state is KeyState.BUSY
    time.sleep(0.3)
    assert store.claim(key, "w2", 30).state is KeyState.RUN
    # the old holder can no longer extend or release the new holder's claim
    store.extend([(key, "dead-worker")], 60)
    store.release(key, "dead-worker")
    assert store.claim(key, "w3", 30).state is KeyState.BUSY


def test_extend_keeps_a_claim_and_release_frees_it(store):
    key = _key()
    store.claim(key, "w1", 0.3)
    store.extend([(key, "w1")], 30)
    time.sleep(0.4)
    assert store.claim(key, "w2", 30).state is KeyState.BUSY
    store.release(key, "w1")
    assert store.claim(key, "w2", 30).state is KeyState.RUN


@pytest.fixture(params=["memory", "sqlite"])
def app(request, tmp_path):
    url = (
        f"memory://{uuid.uuid4().hex}"
        if request.param == "memory"
        else f"sqlite:///{tmp_path / 'b.db'}"
    )
    a = App("idem", broker=url)
    yield a
    a.close()


def test_duplicate_publishes_with_one_key_have_one_effect(app):
    effects = []

    @app.task(name="charge", idempotency_key=lambda order_id, cents: f"charge:{order_id}")
    def charge(order_id, cents):
        effects.append(order_id)

    for _ in range(3):
        charge.delay(7, 1999)
    charge.delay(8, 500)
    with run_worker(app, concurrency=2) as w:
        report = w.join(timeout=15)
    assert sorted(effects) == [7, 8]
    assert (
        len(report.of("skipped"))
        + len([e for e in report.of("returned") if e.info.get("reason") == "idempotency_busy"])
        >= 2
    )
    st = app.adapter()
    st.open()
    assert st.stats("default").dead == 0


def test_a_failed_execution_releases_its_key_so_the_retry_runs(app):
    calls = []

    @app.task(
        name="flaky",
        idempotency_key=lambda x: f"flaky:{x}",
        autoretry_for=(ValueError,),
        retry_backoff=0.01,
    )
    def flaky(x):
        calls.append(x)
        if len(calls) == 1:
            raise ValueError("first try fails")

    flaky.delay(1)
    with run_worker(app) as w:
        w.join(timeout=10)
    assert calls == [1, 1]


def test_header_key_from_beat_is_honoured(app):
    effects = []

    @app.task(name="tick")
    def tick():
        effects.append(1)

    for _ in range(2):
        tick.apply_async(headers={"idempotency_key": "nightly:2026-11-29T00:00:00+00:00"})
    with run_worker(app) as w:
        w.join(timeout=10)
    assert effects == [1]


def test_a_failing_key_function_dead_letters_the_message(app):
    @app.task(name="bad", idempotency_key=lambda x: 1 / 0)
    def bad(x):
        raise AssertionError("must not run")

    bad.delay(1)
    with run_worker(app) as w:
        report = w.join(timeout=10)
    [dead] = report.dead_lettered
    assert dead.info["reason"] == "failed" and "ZeroDivisionError" in dead.info["error"]


def test_keyed_task_without_a_store_is_refused_when_declared_and_at_worker_start():
    class NoStore:
        @ackwise.hookimpl
        def ackwise_register_adapters(self, registry):
            registry.add(
                "nostore", "ackwise.backends.memory._adapter:MemoryAdapter", distribution="tests"
            )

    plugins = ackwise.Plugins(autoload=False)
    plugins.register(NoStore(), name="nostore")
    app = App("x", broker="nostore://", plugins=plugins)
    assert app.idempotency_store_url is None

    with pytest.raises(ConfigurationError, match="idempotency_key needs an idempotency store"):

        @app.task(name="k", idempotency_key=lambda: "k")
        def k():
            pass

    app.task(name="k")(lambda: None).idempotency_key = lambda: "k"  # as if it had been declared
    with pytest.raises(ConfigurationError, match="idempotency_key needs an idempotency store"):
        ackwise.Worker(app, ackwise.WorkerConfig(pool="threads"))
    with pytest.raises(ConfigurationError, match="must be a callable"):
        app.task(name="k2", idempotency_key="not callable")(lambda: None)
