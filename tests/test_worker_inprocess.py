"""The worker, run in-process (ackwise.testing) on memory:// and sqlite://."""

from __future__ import annotations

import asyncio
import threading
import time
import uuid
from typing import Any, ClassVar

import pytest

import ackwise
from ackwise import Ack, App, Retry
from ackwise.backends.memory._adapter import MemoryAdapter
from ackwise.spi import Outgoing, QueueSpec
from ackwise.testing import run_worker


@pytest.fixture(params=["memory", "sqlite"])
def app(request, tmp_path):
    if request.param == "memory":
        url = f"memory://{uuid.uuid4().hex}"
    else:
        url = f"sqlite:///{tmp_path / 'broker.db'}"
    a = App("inproc", broker=url)
    yield a
    a.close()


def _adapter(app: App, queue: str = "default"):
    adapter = app.adapter()
    adapter.open()
    adapter.declare(QueueSpec(queue))
    return adapter


def test_tasks_run_and_the_report_says_so(app):
    seen = []

    @app.task(name="add")
    def add(a, b):
        seen.append(a + b)

    @app.task(name="aadd")
    async def aadd(a, b):
        await asyncio.sleep(0)
        seen.append(a * b)

    for i in range(20):
        add.delay(i, 1)
    aadd.delay(3, 4)
    with run_worker(app, concurrency=4) as w:
        report = w.join()
    assert sorted(seen) == sorted([i + 1 for i in range(20)] + [12])
    assert len(report.succeeded) == 21 and not report.failed and not report.dead_lettered
    st = _adapter(app).stats("default")
    assert (st.ready, st.in_flight, st.dead) == (0, 0, 0)


@pytest.mark.parametrize(
    ("body", "reason"),
    [
        (b"\xff\xfe not json", "decode_error"),
        (b'{"v":1,"id":"x"}', "decode_error"),
        (b'{"v":99,"id":"x","task":"add"}', "unknown_envelope_version"),
        (
            b'{"v":1,"id":"m1","task":"no.such.task","queue":"default","created_at":1.0}',
            "unknown_task",
        ),
    ],
)
def test_bad_message_is_dead_lettered_with_reason_and_the_worker_keeps_going(app, body, reason):
    ran = []

    @app.task(name="add")
    def add(a, b):
        ran.append(a + b)

    adapter = _adapter(app)
    adapter.publish("default", [Outgoing("bad-1", body)])
    add.delay(1, 2)
    with run_worker(app) as w:
        report = w.join()
        assert w.is_alive() and w.error is None
    assert ran == [3]
    [dead] = adapter.dead_letters("default")
    assert dead.reason == reason
    assert dead.message_id == "bad-1" or reason == "unknown_task"
    if reason != "unknown_task":
        assert dead.body == body  # the body is kept as it came: nothing is lost
    assert [e.info["reason"] for e in report.dead_lettered] == [reason]
    st = adapter.stats("default")
    assert (st.ready, st.in_flight, st.dead) == (0, 0, 1)


def test_is_alive_and_error_say_whether_the_worker_runs_and_what_stopped_it(app, monkeypatch):
    w = ackwise.testing.InProcessWorker(app)
    assert not w.is_alive() and w.error is None
    w.start()
    try:
        assert w.is_alive() and w.error is None
    finally:
        assert w.stop() == 0
    assert not w.is_alive() and w.error is None

    broken = ackwise.testing.InProcessWorker(app)
    boom = RuntimeError("boom")

    def run() -> int:
        raise boom

    monkeypatch.setattr(broken.worker, "run", run)
    with pytest.raises(RuntimeError, match="boom"):
        broken.start()
    assert not broken.is_alive() and broken.error is boom


@pytest.mark.parametrize("mode", list(Ack))
def test_task_failing_three_times_then_succeeding_runs_four_times(app, mode):
    calls = []

    @app.task(
        name="flaky",
        ack=mode,
        autoretry_for=(ValueError,),
        max_retries=5,
        retry_backoff=0.01,
        retry_backoff_max=0.05,
    )
    def flaky():
        calls.append(1)
        if len(calls) <= 3:
            raise ValueError(f"failure {len(calls)}")

    msg_id = flaky.delay()
    with run_worker(app) as w:
        report = w.join()
    assert len(calls) == 4
    assert len(report.retried) == 3 and len(report.succeeded) == 1
    assert {e.message_id for e in report.started} == {msg_id}  # retries keep the message id
    st = _adapter(app).stats("default")
    assert (st.ready, st.delayed, st.in_flight, st.dead) == (0, 0, 0, 0)


@pytest.mark.parametrize("mode", list(Ack))
def test_non_retryable_error_is_dead_lettered_failed_after_one_execution(app, mode):
    calls = []

    @app.task(name="boom", ack=mode, autoretry_for=(ValueError,), dont_autoretry_for=(KeyError,))
    def boom():
        calls.append(1)
        raise KeyError("not retryable")

    boom.delay()
    with run_worker(app) as w:
        report = w.join()
    assert len(calls) == 1
    adapter = _adapter(app)
    [dead] = adapter.dead_letters("default")
    assert dead.reason == "failed"
    env = ackwise.contract._envelope.decode(dead.body)
    assert env.history[-1].outcome == "failed"
    assert "KeyError" in (env.history[-1].error or "")
    assert "Traceback" in (env.history[-1].traceback or "")
    assert [e.info["reason"] for e in report.dead_lettered] == ["failed"]
    st = adapter.stats("default")
    assert (st.ready, st.in_flight, st.dead) == (0, 0, 1)


def test_exhausted_retries_dead_letter_with_the_whole_history(app):
    @app.task(name="always", bind=True, max_retries=2)
    def always(self):
        raise self.retry(delay=0.01)

    always.delay()
    with run_worker(app) as w:
        w.join()
    [dead] = _adapter(app).dead_letters("default")
    env = ackwise.contract._envelope.decode(dead.body)
    assert [h.outcome for h in env.history] == ["retry", "retry", "failed"]


def test_explicit_retry_with_delay_goes_through_the_broker_delay(app):
    calls = []

    @app.task(name="later")
    def later():
        calls.append(1)
        if len(calls) == 1:
            raise Retry(delay=0.3)

    later.delay()
    with run_worker(app) as w:
        report = w.join(include_delayed=True)
    assert len(calls) == 2
    assert report.retried[0].info["delay"] == 0.3


def test_graceful_stop_returns_prefetched_messages(app):
    import threading

    release = threading.Event()

    @app.task(name="hold")
    def hold(i):
        release.wait(10)

    for i in range(5):
        hold.delay(i)
    w = ackwise.testing.InProcessWorker(app, concurrency=1, prefetch=5, lease=60).start()
    adapter = _adapter(app)
    try:
        import time

        deadline = time.monotonic() + 5
        while adapter.stats("default").in_flight < 5 and time.monotonic() < deadline:
            time.sleep(0.01)
        w.worker.request_stop()
        deadline = time.monotonic() + 2
        while adapter.stats("default").ready < 4 and time.monotonic() < deadline:
            time.sleep(0.01)
        assert adapter.stats("default").ready == 4
    finally:
        release.set()
        w.stop()
    st = adapter.stats("default")
    assert (st.ready, st.in_flight) == (4, 0)


def test_message_redelivered_past_max_deliveries_is_dead_lettered_without_running(app):
    """A task that kills its whole worker every time: the count ends the loop (C15)."""
    ran = []

    @app.task(name="crashy", max_deliveries=3)
    def crashy():
        ran.append(1)

    crashy.delay()
    adapter = _adapter(app)
    # Three deliveries whose worker "died": leased, never settled, lease expired.
    import time

    for expected in (1, 2, 3):
        deadline = time.monotonic() + 5
        got = []
        while not got and time.monotonic() < deadline:
            got = adapter.receive("default", max_messages=1, wait=0.1, lease=0.05)
        assert [d.attempt for d in got] == [expected]
        time.sleep(0.06)
    with run_worker(app) as w:
        report = w.join()
    assert ran == []
    [dead] = adapter.dead_letters("default")
    assert dead.reason == "max_deliveries"
    assert [e.info["reason"] for e in report.dead_lettered] == ["max_deliveries"]


def test_worker_refuses_impossible_configuration(app):
    from ackwise.errors import ConfigurationError

    with pytest.raises(ConfigurationError, match="--pool must be one of"):
        ackwise.Worker(app, ackwise.WorkerConfig(pool="gevent"))
    with pytest.raises(ConfigurationError, match="--lease must be > 0"):
        ackwise.Worker(app, ackwise.WorkerConfig(pool="threads", lease=0))
    with pytest.raises(ConfigurationError, match="prefork needs the app's import path"):
        ackwise.Worker(app, ackwise.WorkerConfig(pool="prefork"))
    with pytest.raises(ConfigurationError, match="solo runs one task at a time"):
        ackwise.Worker(app, ackwise.WorkerConfig(pool="solo", concurrency=4))


def test_automatic_prefetch_deepens_for_short_tasks_only_where_the_adapter_asks(app):
    """memory:// takes what is ready per receive at no cost: no deepening.  On sqlite://
    every receive and every batch of acks is a write transaction: while tasks are short the
    budget deepens (up to 64), so that one transaction carries many messages."""

    @app.task(name="quick")
    def quick():
        pass

    for _ in range(200):
        quick.delay()
    with run_worker(app, concurrency=2) as w:
        w.join()
        deep = app.adapter_class.capabilities.deep_prefetch
        assert deep == app.broker_url.startswith("sqlite")
        assert w.worker.budget == (64 if deep else 4 * 2)


def test_an_early_acked_task_is_not_lease_renewed_while_it_runs(app):
    # Defect: the worker renewed the leases of running EARLY tasks after their ack; the broker
    # had forgotten them, so every renewal was a "stale receipt … may run again elsewhere"
    # warning (and a wasted broker call) for a task that cannot run again.
    lease = 0.6

    @app.task(name="slow_early", ack=Ack.EARLY)
    def slow_early():
        import time

        time.sleep(lease * 2.5)  # several renewal rounds (every lease / 3)

    @app.task(name="slow_late", ack=Ack.LATE)
    def slow_late():
        import time

        time.sleep(lease * 2.5)

    slow_early.delay()
    with run_worker(app, lease=lease) as w:
        report = w.join(timeout=20)
        early_extended = w.worker.counters.extended
        slow_late.delay()
        report = w.join(timeout=20)
        late_extended = w.worker.counters.extended - early_extended
    assert not report.of("stale"), [e.info for e in report.of("stale")]
    assert w.worker.counters.stale == 0
    assert early_extended == 0
    assert late_extended >= 3  # a LATE task's lease is still renewed
    assert [e.task for e in report.succeeded] == ["slow_early", "slow_late"]


class _EarlyAckCutOnce(MemoryAdapter):
    """The memory broker, but its first early ack fails as a cut connection would (nothing
    recorded).  Counts opens, to see the worker reconnect."""

    cuts = 1
    opens = 0

    def open(self):
        type(self).opens += 1
        super().open()

    def ack_before_start(self, deliveries):
        if type(self).cuts:
            type(self).cuts -= 1
            raise ackwise.errors.TransientAdapterError("connection reset (test)")
        super().ack_before_start(deliveries)


def test_an_early_batch_whose_ack_was_cut_runs_after_the_reconnect_not_a_lease_later(
    plugins_serving,
):
    plugins = plugins_serving("cutonce", f"{__name__}:_EarlyAckCutOnce")
    _EarlyAckCutOnce.cuts, _EarlyAckCutOnce.opens = 1, 0
    app = App("cut", broker=f"cutonce://{uuid.uuid4().hex[:8]}", plugins=plugins)
    ran = []

    @app.task(name="e", ack=Ack.EARLY)
    def e(n):
        ran.append(n)

    @app.task(name="l", ack=Ack.LATE)
    def late(n):
        ran.append(-n)

    e.delay(1)
    late.delay(2)
    # The lease is far longer than the test may take: the batch must not wait for it.
    with run_worker(app, lease=60.0, concurrency=2) as w:
        report = w.join(timeout=10)
    assert sorted(ran) == [-2, 1]
    assert _EarlyAckCutOnce.opens >= 2  # it reconnected
    assert not report.of("stale")
    app.close()


class _HeldWatchingMemory(MemoryAdapter):
    """The memory broker, noting how many deliveries the worker says it holds whenever a
    message is published while the worker runs (a retry's republish)."""

    worker: Any = None
    held_at_publish: ClassVar[list[int]] = []

    def publish(self, queue, messages):
        if type(self).worker is not None:
            type(self).held_at_publish.append(type(self).worker.held)
        super().publish(queue, messages)


@pytest.mark.parametrize("mode", [Ack.EARLY, Ack.LATE])
def test_a_failed_task_is_held_until_its_retry_is_published(plugins_serving, mode):
    # Regression: the worker forgot a failed job before its retry was published; an early
    # acked message was then nowhere for a moment (not held, not at the broker), and
    # ``InProcessWorker.join`` could return before the retry ran (a CI flake).
    plugins = plugins_serving("heldwatch", f"{__name__}:_HeldWatchingMemory")
    _HeldWatchingMemory.worker, _HeldWatchingMemory.held_at_publish = None, []
    app = App("held", broker=f"heldwatch://{uuid.uuid4().hex[:8]}", plugins=plugins)
    calls = []

    @app.task(name="once_failing", ack=mode, autoretry_for=(ValueError,), max_retries=2)
    def once_failing():
        calls.append(1)
        if len(calls) == 1:
            deadline = time.monotonic() + 5
            while _HeldWatchingMemory.worker is None and time.monotonic() < deadline:
                time.sleep(0.01)  # the test has not handed the worker over yet
            raise ValueError("first attempt fails")

    once_failing.delay()
    with run_worker(app) as w:
        _HeldWatchingMemory.worker = w.worker
        w.join(timeout=10)
    _HeldWatchingMemory.worker = None
    assert len(calls) == 2
    assert _HeldWatchingMemory.held_at_publish == [1]
    app.close()


class _AnswersLate(MemoryAdapter):
    """The memory broker, but the first receive that gets messages answers after their lease
    has run out, and by then another consumer has taken them (a slow or stalled broker
    round trip under load)."""

    late = 1
    taken_elsewhere: ClassVar[list[int]] = []

    def receive(self, queue, *, max_messages, wait, lease):
        got = super().receive(queue, max_messages=max_messages, wait=wait, lease=lease)
        if got and type(self).late:
            type(self).late -= 1
            time.sleep(lease * 1.5)
            other = MemoryAdapter(self.url)
            other.open()
            again = other.receive(queue, max_messages=10, wait=0.0, lease=60.0)
            type(self).taken_elsewhere.extend(d.attempt for d in again)
            other.ack(again)
        return got


def test_a_delivery_whose_lease_ran_out_before_it_started_is_not_started(plugins_serving):
    # Defect (SQS C26 under load): a receive answered after the lease of what it brought had
    # run out, the worker started those deliveries anyway, and a second worker that had been
    # given the same message ran it too.
    plugins = plugins_serving("answerslate", f"{__name__}:_AnswersLate")
    _AnswersLate.late, _AnswersLate.taken_elsewhere = 1, []
    app = App("late", broker=f"answerslate://{uuid.uuid4().hex[:8]}", plugins=plugins)
    ran = []

    @app.task(name="t", ack=Ack.LATE)
    def t(n):
        ran.append(n)

    t.delay(1)
    with run_worker(app, lease=0.4) as w:
        deadline = time.monotonic() + 10
        while not _AnswersLate.taken_elsewhere and time.monotonic() < deadline:
            time.sleep(0.05)
        report = w.join(timeout=10)
    assert _AnswersLate.taken_elsewhere == [2]  # the other consumer had it (and ran it)
    assert ran == []  # ... so this worker, whose lease ran out, did not run it too
    stale = report.of("stale")
    assert [e.info.get("operation") for e in stale] == ["start"], [e.info for e in stale]
    assert w.worker.counters.stale == 1
    app.close()


# -- jobs waiting in the thread pool (run-ahead) ---------------------------------------------
def _warm_up(app: App, w: Any, n: int = 200) -> None:
    """Run ``n`` no-op tasks: at their pace the thread pool takes jobs beyond its idle
    threads (``Executor.ahead``)."""

    @app.task(name="warm")
    def warm() -> None:
        pass

    app.send_many([warm.s() for _ in range(n)])
    w.join(timeout=20)
    assert w.worker.ledger.executor.ahead > 0, "no-op tasks should let jobs wait in the pool"


def _blocked_with_waiting(app: App, w: Any, waiting: int) -> None:
    """Wait until the worker's one thread is busy and ``waiting`` jobs wait behind it."""
    deadline = time.monotonic() + 10
    while w.worker.ledger.executor.waiting() < waiting:
        assert time.monotonic() < deadline, f"waiting: {w.worker.ledger.executor.waiting()}"
        time.sleep(0.01)


def _block_and_after(app: App) -> tuple[threading.Event, list[int], Any, Any]:
    """Tasks ``block`` (waits for the event) and ``after(i)`` (records ``i`` in the list)."""
    release = threading.Event()
    ran: list[int] = []

    @app.task(name="block")
    def block() -> None:
        release.wait(10)

    @app.task(name="after")
    def after(i: int) -> None:
        ran.append(i)

    return release, ran, block, after


def _one_running_three_waiting(app: App) -> tuple[threading.Event, list[int], Any]:
    """A worker (one thread, lease 60 s) running ``block`` with three ``after`` jobs waiting
    in its pool: ``(release, ran, worker)``."""
    release, ran, block, after = _block_and_after(app)
    w = ackwise.testing.InProcessWorker(app, concurrency=1, lease=60).start()
    _warm_up(app, w)
    block.delay()
    app.send_many([after.s(i) for i in range(3)])
    _blocked_with_waiting(app, w, 3)
    return release, ran, w


def test_a_graceful_stop_returns_jobs_waiting_in_the_pool_unstarted(app):
    adapter = _adapter(app)
    release, ran, w = _one_running_three_waiting(app)
    try:
        assert w.worker.running == 1  # the waiting jobs are not counted as running
        w.worker.request_stop()
        deadline = time.monotonic() + 5  # back at once: not after the running task
        while adapter.stats("default").ready < 3:
            assert time.monotonic() < deadline, adapter.stats("default")
            time.sleep(0.01)
    finally:
        release.set()
        w.stop()
    assert ran == []
    st = adapter.stats("default")
    assert (st.ready, st.in_flight) == (3, 0)


def test_a_cold_stop_returns_jobs_waiting_in_the_pool_and_holds_the_running_one(app):
    adapter = _adapter(app)
    release, ran, w = _one_running_three_waiting(app)
    try:
        w.worker.request_stop(cold=True)
        w.stop()
        assert ran == []
        st = adapter.stats("default")
        # The waiting jobs are back, unstarted; the running LATE task is abandoned: its
        # message stays leased until its lease runs out (docs/semantics.md, cold stop).
        assert (st.ready, st.in_flight) == (3, 1)
    finally:
        release.set()


def test_an_early_acked_task_does_not_wait_in_the_pool(app):
    """At most once: an EARLY task is acked as it starts, so it is handed to the pool only
    when a thread is free; acked and waiting, a crash would lose it unrun."""
    release = threading.Event()

    @app.task(name="block")
    def block() -> None:
        release.wait(10)

    @app.task(name="early", ack=Ack.EARLY)
    def early() -> None:
        pass

    w = ackwise.testing.InProcessWorker(app, concurrency=1, lease=60).start()
    adapter = _adapter(app)
    try:
        _warm_up(app, w)
        block.delay()
        app.send_many([early.s() for _ in range(3)])
        deadline = time.monotonic() + 5
        while w.worker.held < 4:
            assert time.monotonic() < deadline, w.worker.held
            time.sleep(0.01)
        time.sleep(0.1)
        assert w.worker.ledger.executor.waiting() == 0
        assert adapter.stats("default").in_flight == 4  # none of them acked yet
    finally:
        release.set()
        report = w.join(timeout=10)
        w.stop()
    assert len([e for e in report.succeeded if e.task == "early"]) == 3


class _LeasesMoveOn(MemoryAdapter):
    """The memory broker, but once asked (``move_on``), the next renewal finds that another
    consumer took every message this one held (their leases had run out, as after a stall)."""

    move_on = False
    taken_elsewhere: ClassVar[list[str]] = []

    def extend(self, deliveries, *, lease):
        if type(self).move_on:
            type(self).move_on = False
            with self.broker.lock:
                for d in deliveries:
                    msg = self._owned(self.broker.queue(d.queue), d)
                    if msg is not None:
                        msg.deadline = 0.0
            other = MemoryAdapter(self.url)
            other.open()
            again = other.receive("default", max_messages=10, wait=0.0, lease=60.0)
            type(self).taken_elsewhere.extend(d.message_id for d in again)
            other.ack(again)
        super().extend(deliveries, lease=lease)


def test_jobs_waiting_in_the_pool_whose_lease_moved_on_do_not_start(plugins_serving):
    plugins = plugins_serving("leasesmoveon", f"{__name__}:_LeasesMoveOn")
    _LeasesMoveOn.move_on, _LeasesMoveOn.taken_elsewhere = False, []
    app = App("moveon", broker=f"leasesmoveon://{uuid.uuid4().hex[:8]}", plugins=plugins)
    release, ran, block, after = _block_and_after(app)
    w = ackwise.testing.InProcessWorker(app, concurrency=1, lease=0.6).start()
    try:
        _warm_up(app, w)
        block.delay()
        app.send_many([after.s(i) for i in range(3)])
        _blocked_with_waiting(app, w, 3)
        _LeasesMoveOn.move_on = True
        deadline = time.monotonic() + 5
        while w.worker.ledger.executor.waiting():
            assert time.monotonic() < deadline, "the waiting jobs were not withdrawn"
            time.sleep(0.01)
        assert len(_LeasesMoveOn.taken_elsewhere) == 4  # the running one and the 3 waiting
    finally:
        release.set()
        report = w.join(timeout=10)
        w.stop()
    assert ran == []  # taken elsewhere: not run here too
    assert w.worker.counters.stale >= 4
    assert not [e for e in report.succeeded if e.task == "after"]
    app.close()
