"""docs/failure-handling.md: retries and their backoff bounds, time limits, dead-letter tooling, bad input."""

from __future__ import annotations

import importlib
import json
import os
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import ackwise
from ackwise import App, RetryPolicy
from ackwise.errors import (
    BrokerUnavailable,
    ConfigurationError,
    SoftTimeLimitExceeded,
    TransientAdapterError,
)
from ackwise.spi import Outgoing, QueueSpec
from ackwise.testing import run_worker

HERE = Path(__file__).parent


# -- backoff ---------------------------------------------------------------------------------
@settings(max_examples=300, deadline=None)
@given(
    base=st.floats(min_value=0.0, max_value=100.0),
    extra=st.floats(min_value=0.0, max_value=10_000.0),
    retries=st.integers(min_value=0, max_value=200),
    jitter=st.booleans(),
    u=st.floats(min_value=0.0, max_value=1.0, exclude_max=True),
)
def test_backoff_delay_stays_within_its_bounds(base, extra, retries, jitter, u):
    policy = RetryPolicy(backoff=base, backoff_max=base + extra, jitter=jitter, max_retries=1000)
    bound = policy.bound(retries)
    assert 0.0 <= bound <= policy.backoff_max
    assert bound == min(policy.backoff_max, base * 2.0 ** min(retries, 62))
    delay = policy.delay_for(retries, rng=lambda: u)
    if jitter:
        assert 0.0 <= delay <= bound  # full jitter: uniform in [0, bound)
    else:
        assert delay == bound
    # the bound never shrinks as retries accumulate
    assert policy.bound(retries + 1) >= bound


@settings(max_examples=100, deadline=None)
@given(retries_done=st.integers(min_value=0, max_value=20), max_retries=st.integers(0, 10))
def test_no_retry_is_due_once_max_retries_is_reached(retries_done, max_retries):
    policy = RetryPolicy(autoretry_for=(ValueError,), max_retries=max_retries)
    delay = policy.retry_delay(ValueError("x"), retries_done)
    assert (delay is None) == (retries_done >= max_retries)


def test_only_transient_errors_are_retried_by_default():
    app = App("t", broker=f"memory://{uuid.uuid4().hex}")

    @app.task(name="t")
    def t():
        pass

    policy = t.retry_policy
    assert policy.retry_delay(ConnectionError("refused"), 0) is not None
    assert policy.retry_delay(TimeoutError(), 0) is not None
    assert policy.retry_delay(TransientAdapterError("broker away"), 0) is not None
    assert policy.retry_delay(ValueError("bug"), 0) is None
    assert policy.retry_delay(KeyError("bug"), 0) is None


@pytest.mark.parametrize(
    ("options", "fragment"),
    [
        ({"max_retries": -1}, "max_retries must be >= 0"),
        ({"retry_backoff": float("nan")}, "retry_backoff must be a finite number"),
        ({"retry_backoff": 5, "retry_backoff_max": 1}, "retry_backoff_max"),
        ({"autoretry_for": (ValueError, "oops")}, "autoretry_for must be a tuple of exception"),
        ({"time_limit": 0}, "time_limit must be a number of seconds > 0"),
        ({"time_limit": 5, "soft_time_limit": 5}, "soft_time_limit (5s) must be shorter"),
    ],
)
def test_bad_retry_and_time_limit_configuration_is_refused(options, fragment):
    app = App("t", broker=f"memory://{uuid.uuid4().hex}")
    with pytest.raises(ConfigurationError) as info:
        app.task(**options)(lambda: None)
    assert fragment in str(info.value)


# -- time limits -----------------------------------------------------------------------------
def test_soft_time_limit_raises_inside_a_thread_task_and_dead_letters_it():
    app = App("t", broker=f"memory://{uuid.uuid4().hex}")
    seen = []

    @app.task(name="slow", soft_time_limit=0.2)
    def slow():
        try:
            for _ in range(500):
                time.sleep(0.01)
        except SoftTimeLimitExceeded:
            seen.append("soft")
            raise

    @app.task(name="quick", soft_time_limit=5)
    def quick():
        seen.append("quick")

    slow.delay()
    quick.delay()
    with run_worker(app) as w:
        report = w.join(timeout=10)
    assert sorted(seen) == ["quick", "soft"]
    [dead] = report.dead_lettered
    assert dead.task == "slow" and dead.info["reason"] == "failed"
    assert "SoftTimeLimitExceeded" in dead.info["error"]


def test_soft_time_limit_of_an_async_task():
    app = App("t", broker=f"memory://{uuid.uuid4().hex}")

    @app.task(name="aslow", soft_time_limit=0.1)
    async def aslow():
        import asyncio

        await asyncio.sleep(5)

    aslow.delay()
    with run_worker(app) as w:
        report = w.join(timeout=10)
    assert "SoftTimeLimitExceeded" in report.dead_lettered[0].info["error"]


def test_hard_time_limit_is_refused_under_the_threads_pool():
    app = App("t", broker=f"memory://{uuid.uuid4().hex}")

    @app.task(name="hard", time_limit=1)
    def hard():
        pass

    with pytest.raises(ConfigurationError, match="only the prefork pool can enforce"):
        ackwise.Worker(app, ackwise.WorkerConfig(pool="threads"))


@pytest.mark.slow
@pytest.mark.parametrize(
    ("mode", "expected"),
    [("late", "time_limit"), ("reject_on_lost", "max_deliveries"), ("early", None)],
)
def test_hard_time_limit_kills_the_executor_and_applies_the_mode_rule(tmp_path, mode, expected):
    url = f"sqlite:///{tmp_path / 'b.db'}"
    name = f"limited_app_{mode}_{uuid.uuid4().hex[:8]}"
    module = tmp_path / f"{name}.py"
    module.write_text(
        "import time\n"
        "from ackwise import Ack, App\n"
        f"app = App('limited', broker={url!r})\n"
        f"@app.task(name='stuck', ack=Ack.{mode.upper()}, time_limit=0.5, max_deliveries=2)\n"
        "def stuck():\n"
        "    time.sleep(60)\n"
    )
    env = {**os.environ, "PYTHONPATH": str(tmp_path)}
    sys.path.insert(0, str(tmp_path))
    try:
        limited_app = importlib.import_module(name)
    finally:
        sys.path.remove(str(tmp_path))
    limited_app.app.tasks["stuck"].delay()
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "ackwise",
            "worker",
            f"{name}:app",
            "--pool",
            "prefork",
            "-c",
            "1",
            "--lease",
            "2",
        ],
        env=env,
        cwd=tmp_path,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
    )
    adapter = limited_app.app.adapter()
    adapter.open()
    try:
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            st_ = adapter.stats("default")
            if expected and st_.dead == 1:
                break
            if not expected and st_.ready == st_.in_flight == 0:
                time.sleep(1.0)
                break
            time.sleep(0.05)
        dead = adapter.dead_letters("default")
        if expected:
            assert [d.reason for d in dead] == [expected]
        else:
            assert dead == []
            st_ = adapter.stats("default")
            assert (st_.ready, st_.in_flight) == (0, 0)
    finally:
        proc.kill()
        out = proc.communicate()[0].decode()
        adapter.close()
    assert "exceeded its time_limit" in out


# -- bad input and the broker going away -----------------------------------------------------
def test_unknown_task_is_offered_again_then_dead_lettered(tmp_path):
    app = App("t", broker=f"sqlite:///{tmp_path / 'b.db'}")
    adapter = app.adapter()
    adapter.open()
    adapter.declare(QueueSpec("default"))
    body = json.dumps(
        {"v": 1, "id": "u1", "task": "not.deployed.yet", "queue": "default", "created_at": 1.0}
    ).encode()
    adapter.publish("default", [Outgoing("u1", body)])
    with run_worker(app) as w:
        report = w.join(timeout=10)
    returned = [e for e in report.of("returned") if e.info.get("reason") == "unknown_task"]
    assert [e.attempt for e in returned] == [1, 2]
    [dead] = adapter.dead_letters("default")
    assert dead.reason == "unknown_task" and dead.attempt == 3


class _AlwaysDown(ackwise.Adapter):
    """A broker that is never reachable (registered in-process for this test only)."""

    capabilities = ackwise.Capabilities()
    name = "down"

    def open(self):
        raise BrokerUnavailable("connection refused (test broker is down)")

    def close(self):
        pass

    def _down(self, *a, **k):
        raise BrokerUnavailable("connection refused (test broker is down)")

    declare = publish = receive = ack = nack = extend = dead_letter = publish_dead = _down
    stats = dead_letters = requeue_dead = delete_dead = purge = _down


def test_worker_gives_up_with_a_clear_error_when_the_broker_stays_unreachable(plugins_serving):
    plugins = plugins_serving("down", f"{__name__}:_AlwaysDown")
    app = App("t", broker="down://nowhere", plugins=plugins)

    @app.task(name="t")
    def t():
        pass

    worker = ackwise.Worker(app, ackwise.WorkerConfig(pool="threads", broker_timeout=0.5))
    # open() fails every time: retried with backoff, then a clear error, not a hang
    started = time.monotonic()
    with pytest.raises(BrokerUnavailable, match="test broker is down") as caught:
        worker.run()
    assert 0.5 <= time.monotonic() - started < 5
    assert "unreachable at start" in str(caught.value)


def test_worker_reconnects_then_gives_up_after_broker_timeout(plugins_serving):
    class Flaky(ackwise.Adapter):
        capabilities = ackwise.Capabilities()
        name = "flaky"
        opened = 0

        def open(self):
            type(self).opened += 1
            if type(self).opened > 1:
                raise BrokerUnavailable("refused")

        def close(self):
            pass

        def declare(self, queue):
            pass

        def receive(self, queue, *, max_messages, wait, lease):
            raise TransientAdapterError("connection reset by peer")

        def _unused(self, *a, **k):
            raise AssertionError("not called")

        publish = ack = nack = extend = dead_letter = publish_dead = _unused
        stats = dead_letters = requeue_dead = delete_dead = purge = _unused

    sys.modules[__name__].Flaky = Flaky  # importable by path for the registry

    plugins = plugins_serving("flaky", f"{__name__}:Flaky")
    app = App("t", broker="flaky://x", plugins=plugins)
    worker = ackwise.Worker(app, ackwise.WorkerConfig(pool="threads", broker_timeout=1.0))
    started = time.monotonic()
    result: list[BaseException] = []
    t = threading.Thread(target=lambda: _capture(worker.run, result))
    t.start()
    t.join(30)
    assert not t.is_alive()
    assert isinstance(result[0], BrokerUnavailable)
    assert "unreachable for 1s" in str(result[0])
    assert 1.0 <= time.monotonic() - started < 15


def _capture(fn, out):
    try:
        fn()
    except BaseException as exc:
        out.append(exc)


# -- ackwise dlq ------------------------------------------------------------------------------
def _cli(*args: str, stdin: str | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "ackwise", *args],
        capture_output=True,
        text=True,
        timeout=60,
        input=stdin,
        cwd=HERE,
    )


@pytest.fixture(params=["sqlite", "redis"])
def dead_sqlite(request, tmp_path):
    """A broker (sqlite, redis) with four dead letters of two tasks and two reasons."""
    if request.param == "redis":
        base = request.getfixturevalue("private_redis").url
        url = f"{base}{'&' if '?' in base else '?'}prefix=dlq{uuid.uuid4().hex[:8]}"
    else:
        url = f"sqlite:///{tmp_path / 'b.db'}"
    app = App("dlq", broker=url)

    @app.task(name="shop.charge", autoretry_for=())
    def charge(order):
        raise ValueError(f"card declined for order {order}")

    @app.task(name="shop.mail")
    def mail(order):
        raise KeyError("no address")

    charge.apply_async((1,), headers={"trace": "abc"})
    charge.delay(2)
    mail.delay(3)
    with run_worker(app) as w:
        w.join(timeout=10)
    adapter = app.adapter()
    adapter.open()
    adapter.declare(QueueSpec("default"))
    # one more, by a different reason
    adapter.publish("default", [Outgoing("garbage-1", b"\x00 not json")])
    with run_worker(app) as w:
        w.join(timeout=10)
    yield app, adapter, ("--broker", url, "-Q", "default")
    adapter.close()
    app.close()


def test_dlq_list_filters_by_task_reason_and_age(dead_sqlite):
    _, _, where = dead_sqlite
    out = _cli("dlq", "list", *where, "--json")
    assert out.returncode == 0, out.stderr
    rows = json.loads(out.stdout)
    assert sorted(r["reason"] for r in rows) == ["decode_error", "failed", "failed", "failed"]
    charge = json.loads(_cli("dlq", "list", *where, "--task", "shop.charge", "--json").stdout)
    assert len(charge) == 2 and all("card declined" in r["last_error"] for r in charge)
    assert (
        json.loads(_cli("dlq", "list", *where, "--reason", "decode_error", "--json").stdout)[0][
            "id"
        ]
        == "garbage-1"
    )
    assert json.loads(_cli("dlq", "list", *where, "--older-than", "3600", "--json").stdout) == []
    table = _cli("dlq", "list", *where)
    assert "shop.charge" in table.stdout and "4 dead letter(s)" in table.stdout


def test_dlq_show_has_body_headers_history_and_traceback(dead_sqlite):
    _, _, where = dead_sqlite
    out = _cli("dlq", "show", *where, "--task", "shop.charge", "--json")
    entries = json.loads(out.stdout)
    first = next(e for e in entries if e["envelope"]["args"] == [1])
    assert first["envelope"]["headers"] == {"trace": "abc"}
    [attempt] = first["envelope"]["history"]
    assert attempt["outcome"] == "failed" and "ValueError" in attempt["error"]
    assert "Traceback" in attempt["traceback"]
    text = _cli("dlq", "show", *where, "--reason", "decode_error").stdout
    assert "not an envelope" in text


def test_dlq_replay_republishes_exactly_once(dead_sqlite):
    _, adapter, where = dead_sqlite
    out = _cli("dlq", "replay", *where, "--task", "shop.mail")
    assert out.returncode == 0 and "replayed 1" in out.stdout
    again = _cli("dlq", "replay", *where, "--task", "shop.mail")
    assert "nothing to replay" in again.stdout
    assert adapter.stats("default").ready == 1
    refuse = _cli("dlq", "replay", *where)
    assert refuse.returncode == 2 and "or --all" in refuse.stderr


def test_dlq_purge_asks_for_confirmation(dead_sqlite):
    _, adapter, where = dead_sqlite
    no = _cli("dlq", "purge", *where, "--reason", "failed")
    assert no.returncode == 2 and "confirm with --yes" in no.stderr
    assert adapter.stats("default").dead == 4
    yes = _cli("dlq", "purge", *where, "--reason", "failed", "--yes")
    assert yes.returncode == 0 and "deleted 3" in yes.stdout
    assert [d.message_id for d in adapter.dead_letters("default")] == ["garbage-1"]


def test_a_traceback_written_without_marks_keeps_every_frame_and_the_error() -> None:
    """What a task's failure records when Python 3.11 cannot place its ``^^^`` marks (its AST
    constructor raced another thread's, python/cpython#106905): the same traceback, less the
    marks."""
    import traceback

    from ackwise.app._execution import _plain_traceback

    def inner(d: dict[str, int]) -> int:
        return d["missing"] + 1

    try:
        inner({})
    except KeyError as exc:
        plain = _plain_traceback(exc, exc.__traceback__)
        full = "".join(traceback.format_exception(type(exc), exc, exc.__traceback__))
    marks = set("^~ ")
    assert plain.splitlines() == [line for line in full.splitlines() if set(line) - marks]
    assert plain.endswith("KeyError: 'missing'\n")
