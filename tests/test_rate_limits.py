"""Rate limits per task, shared by every worker of the broker (docs/rate-limits.md)."""

from __future__ import annotations

import importlib
import itertools
import logging
import sqlite3
import threading
import time
import uuid
from pathlib import Path

import pytest

from ackwise import App, Worker, WorkerConfig, open_rate_limiter
from ackwise.app._execution import Job, Result, Runner
from ackwise.backends.memory._ratelimit import MemoryRateLimiter
from ackwise.contract._spi import BrokerURL
from ackwise.errors import ConfigurationError
from ackwise.stores._ratelimit import MARGIN_CAP, StartGate, next_slot, parse_rate
from ackwise.testing import run_worker
from ackwise_conformance import eventually


@pytest.mark.parametrize(
    ("rate", "interval"),
    [("50/s", 0.02), ("100/m", 0.6), ("10/h", 360.0), ("0.5/s", 2.0), (" 2 / s ", 0.5)],
)
def test_a_rate_is_the_interval_between_two_starts(rate: str, interval: float) -> None:
    assert parse_rate(rate) == pytest.approx(interval)


@pytest.mark.parametrize("rate", ["fast", "10", "10/d", "0/s", "-1/s", "/s", 10])
def test_a_bad_rate_is_refused_when_the_task_is_declared(rate: object) -> None:
    app = App("rl", broker=f"memory://{uuid.uuid4().hex}")
    with pytest.raises(ConfigurationError, match=r"task 'rl\.bad': rate_limit must be 'N/s'"):
        app.task(name="rl.bad", rate_limit=rate)(lambda: None)  # type: ignore[arg-type]


def test_slots_follow_each_other_and_a_late_one_starts_now() -> None:
    assert next_slot(None, 100.0, 0.5) == (0.0, 100.5)
    assert next_slot(100.5, 100.1, 0.5) == pytest.approx((0.4, 101.0))
    assert next_slot(90.0, 100.0, 0.5) == (0.0, 100.5)  # no burst banked from the quiet time


@pytest.mark.parametrize("scheme", ["sqlite", "memory"])
def test_limiters_of_one_broker_share_the_slots(scheme: str, tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'q.db'}" if scheme == "sqlite" else f"memory://{uuid.uuid4()}"
    a, b = open_rate_limiter(url), open_rate_limiter(url)
    try:
        waits = [a.reserve("t", 1.0), b.reserve("t", 1.0), a.reserve("t", 1.0)]
        assert waits[0] == 0.0
        assert 0.9 < waits[1] <= 1.0 and 1.9 < waits[2] <= 2.0
        assert b.reserve("other", 1.0) == 0.0  # one slot per key
        a.forget("t")
        assert b.reserve("t", 1.0) == 0.0
    finally:
        a.close()
        b.close()


@pytest.mark.parametrize("scheme", ["sqlite", "memory"])
def test_a_start_is_recorded_only_an_interval_after_the_last_one(
    scheme: str, tmp_path: Path
) -> None:
    url = f"sqlite:///{tmp_path / 'q.db'}" if scheme == "sqlite" else f"memory://{uuid.uuid4()}"
    a, b = open_rate_limiter(url), open_rate_limiter(url)
    try:
        assert a.start("t", 1.0) == 0.0
        assert 0.9 < b.start("t", 1.0) <= 1.0
        assert 0.8 < b.start("t", 1.0) <= 1.0  # a refused start records nothing
        assert 0.9 < a.reserve("t", 1.0) <= 1.0  # slots count from the recorded start
        assert b.start("other", 1.0) == 0.0  # one record per key
        a.forget("t")
        assert b.reserve("t", 1.0) == 0.0 and 0.9 < b.reserve("t", 1.0) <= 1.0
        assert b.start("t", 1.0) == 0.0  # the first start; slots reserved ahead stay
        assert 1.9 < a.reserve("t", 1.0) <= 2.0
        a.forget("t")
        assert a.start("t", 1.0, margin=0.5) == 0.0  # recorded as begun half a second on
        assert 1.4 < b.start("t", 1.0) <= 1.5 and 1.4 < b.reserve("t", 1.0) <= 1.5
    finally:
        a.forget("t")
        a.close()
        b.close()


class _LateFirstAnswer(MemoryRateLimiter):
    """The memory store, whose first answer to :meth:`start` reaches its caller ``late``
    seconds after the store recorded it: a thread woken late from its wait for the reply."""

    def __init__(self, late: float) -> None:
        super().__init__(BrokerURL.parse(f"memory://{uuid.uuid4()}"))
        self.late = late
        self.answering = threading.Event()

    def start(self, key: str, interval: float, margin: float = 0.0) -> float:
        wait = super().start(key, interval, margin)
        if not self.answering.is_set():
            self.answering.set()
            time.sleep(self.late)
        return wait


def test_a_start_whose_answer_comes_back_late_is_asked_again() -> None:
    """A's start is recorded, but its answer reaches A an interval later, just when B's start
    (an interval after A's record) comes: begun then, A and B would start together.  A gives
    its start up and asks again: one of them starts then, the other an interval later."""
    interval = 0.2
    limiter = _LateFirstAnswer(late=interval + 0.01)
    limiter.open()
    gate = StartGate(limiter)
    begun: dict[str, float] = {}

    def begin(name: str) -> None:
        gate("t", interval)
        begun[name] = time.monotonic()

    a = threading.Thread(target=begin, args=("a",))
    a.start()
    assert limiter.answering.wait(10)
    b = threading.Thread(target=begin, args=("b",))
    b.start()
    a.join(10)
    b.join(10)
    # Timed a few instructions after the gate let each begin: half an interval is room.
    assert abs(begun["a"] - begun["b"]) >= interval / 2, begun


def test_a_start_waits_while_the_store_cannot_record_it(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """The function never begins unrecorded: while another process holds the SQLite file's
    write lock past busy_timeout, the gate asks again; once it is released, it records."""
    limiter = open_rate_limiter(f"sqlite:///{tmp_path / 'q.db'}?busy_timeout=0.05")
    gate = StartGate(limiter)
    blocker = sqlite3.connect(tmp_path / "q.db", isolation_level=None)
    blocker.execute("BEGIN IMMEDIATE")
    begun = threading.Event()
    thread = threading.Thread(target=lambda: (gate("t", 60.0), begun.set()), daemon=True)
    try:
        with caplog.at_level(logging.WARNING, logger="ackwise.stores._ratelimit"):
            thread.start()
            eventually(lambda: "cannot record a start of t" in caplog.text, 10)
            assert not begun.is_set()
            blocker.execute("ROLLBACK")
            assert begun.wait(10)
        assert 59 < limiter.start("t", 60.0) <= 60 + MARGIN_CAP  # recorded, with its margin
    finally:
        if blocker.in_transaction:
            blocker.execute("ROLLBACK")
        blocker.close()
        thread.join(10)
        limiter.close()


def test_a_rate_limit_its_broker_cannot_share_is_refused_when_declared() -> None:
    app = App("rl", broker="amqp://guest:guest@127.0.0.1:1/%2F")
    with pytest.raises(
        ConfigurationError,
        match=r"^task 'rl\.limited': rate_limit='1/s' needs a rate limit store, .*"
        r"set App\(rate_limit_store=URL\)",
    ):
        app.task(name="rl.limited", rate_limit="1/s")(lambda: None)
    given = App("rl", broker="amqp://guest:guest@127.0.0.1:1/%2F", rate_limit_store="memory://x")
    given.task(name="rl.limited", rate_limit="1/s")(lambda: None)
    Worker(given, WorkerConfig(pool="threads"))  # a worker takes it too


def _app(tmp_path: Path) -> tuple[App, dict[str, list[float]]]:
    app = App("rl", broker=f"sqlite:///{tmp_path / 'q.db'}")
    starts: dict[str, list[float]] = {"limited": [], "free": []}
    lock = threading.Lock()

    @app.task(name="rl.limited", rate_limit="20/s")
    def limited(i: int) -> None:
        with lock:
            starts["limited"].append(time.monotonic())

    @app.task(name="rl.free")
    def free(i: int) -> None:
        with lock:
            starts["free"].append(time.monotonic())

    return app, starts


def test_two_workers_together_keep_to_the_limit(tmp_path: Path) -> None:
    app, starts = _app(tmp_path)
    for i in range(30):
        app.tasks["rl.limited"].delay(i)
    with run_worker(app, concurrency=4) as w1, run_worker(app, concurrency=4) as w2:
        w1.join(timeout=30)
        w2.join(timeout=30)
    times = sorted(starts["limited"])
    assert len(times) == 30
    gaps = [b - a for a, b in itertools.pairwise(times)]
    # 20/s: slots 50 ms apart.  A start is timed in its executor thread, a few ms after its
    # slot: the whole run spans the 29 intervals, and no two starts share a slot.
    assert times[-1] - times[0] >= 29 * 0.05 * 0.95, gaps
    assert min(gaps) >= 0.025, gaps
    app.close()


@pytest.mark.parametrize(
    ("scheme", "body"), [("sqlite", "def"), ("memory", "def"), ("memory", "async def")]
)
def test_an_executor_that_starts_late_does_not_bring_the_next_start_closer(
    scheme: str, body: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The first job's executor thread begins it one interval after its slot (as a thread
    the OS or the GIL holds back does), just when the second job's slot comes: the second
    start still comes an interval after the first one, not with it."""
    broker = f"sqlite:///{tmp_path / 'q.db'}" if scheme == "sqlite" else f"memory://{uuid.uuid4()}"
    app = App("rl", broker=broker)
    interval = 0.2
    starts: list[float] = []

    if body == "def":

        @app.task(name="rl.limited", rate_limit="5/s")
        def limited(i: int) -> None:
            starts.append(time.monotonic())

    else:

        @app.task(name="rl.limited", rate_limit="5/s")
        async def limited(i: int) -> None:
            starts.append(time.monotonic())

    run, calls = Runner.run, itertools.count()

    def late_first(self: Runner, job: Job) -> Result:
        if next(calls) == 0:
            time.sleep(interval)  # this thread begins its job one interval late
        return run(self, job)

    monkeypatch.setattr(Runner, "run", late_first)
    for i in range(3):
        app.tasks["rl.limited"].delay(i)
    with run_worker(app, concurrency=2) as w:
        w.join(timeout=30)
    times = sorted(starts)
    gaps = [b - a for a, b in itertools.pairwise(times)]
    # Each start comes an interval after the one before.  A start is timed in the body, a
    # few instructions after the worker let it begin: half an interval is room for that.
    assert len(times) == 3 and min(gaps) >= interval / 2, gaps
    app.close()


_PREFORK_APP = """
import sys
import time

from ackwise import App

from ackwise.contract import _envelope
from ackwise.app._execution import Runner

app = App("paced", broker={broker!r}, store_results=True)


@app.task(name="paced.stamp", rate_limit="5/s")
def stamp(i):
    return time.monotonic()  # the host's clock, the same in every process


_run = Runner.run


def _late_zero(self, job):
    if _envelope.decode(job.body).args == [0]:
        time.sleep(0.2)  # the child that runs job 0 begins it one interval late
    return _run(self, job)


if getattr(sys.modules["__main__"].__spec__, "name", None) == "ackwise.worker._child":
    Runner.run = _late_zero  # in the prefork children only, not in the test's process
"""


@pytest.mark.slow
def test_a_prefork_child_that_starts_late_does_not_bring_the_next_start_closer(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """As with threads: each child records its start right before the function, in the
    shared store, so a child that begins late makes the next start wait."""
    module = f"paced_{uuid.uuid4().hex[:8]}"
    (tmp_path / f"{module}.py").write_text(
        _PREFORK_APP.format(broker=f"sqlite:///{tmp_path / 'q.db'}")
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    app: App = importlib.import_module(module).app
    handles = [app.tasks["paced.stamp"].delay(i) for i in range(3)]
    worker = Worker(
        app, WorkerConfig(pool="prefork", concurrency=2, app_path=f"{module}:app", poll=0.05)
    )
    thread = threading.Thread(target=worker.run, daemon=True)
    thread.start()
    try:
        times = sorted(h.get(timeout=60) for h in handles)
    finally:
        worker.request_stop()
        thread.join(60)
    gaps = [b - a for a, b in itertools.pairwise(times)]
    assert min(gaps) >= 0.1, gaps  # 0.2 s apart, timed in the body: see the test above
    app.close()


def test_a_prefork_worker_refuses_rate_limits_kept_in_its_own_memory() -> None:
    app = App("rl", broker=f"memory://{uuid.uuid4()}")
    app.task(name="rl.limited", rate_limit="5/s")(lambda: None)
    with pytest.raises(
        ConfigurationError,
        match=r"^tasks \['rl\.limited'\] have a rate_limit kept in memory://.*, this "
        r"process's memory, which the prefork pool's children cannot reach; use --pool threads",
    ):
        Worker(app, WorkerConfig(pool="prefork", app_path="x:app"))
    Worker(app, WorkerConfig(pool="threads"))


def test_other_tasks_start_past_a_waiting_one(tmp_path: Path) -> None:
    app = App("rl", broker=f"sqlite:///{tmp_path / 'q.db'}")
    done: list[str] = []

    @app.task(name="rl.slow", rate_limit="1/m")
    def slow(i: int) -> None:
        done.append(f"slow{i}")

    @app.task(name="rl.free")
    def free() -> None:
        done.append("free")

    slow.delay(1)
    slow.delay(2)  # its slot is a minute away
    free.delay()
    with run_worker(app, concurrency=2) as w:
        deadline = time.monotonic() + 10
        while "free" not in done and time.monotonic() < deadline:
            time.sleep(0.01)
        assert sorted(done) == ["free", "slow1"]
        w.stop()
    app.close()


def test_a_delivery_waiting_for_its_slot_keeps_its_lease(tmp_path: Path) -> None:
    """A message held back by its rate limit stays held (its lease renewed): it is not
    delivered again while it waits, here 2 s for a slot with a lease of 0.6 s."""
    app = App("rl", broker=f"sqlite:///{tmp_path / 'q.db'}")
    attempts: list[int] = []

    @app.task(name="rl.slow", rate_limit="0.5/s", bind=True)
    def slow(ctx, i: int) -> None:  # type: ignore[no-untyped-def]
        attempts.append(ctx.attempt)

    slow.delay(1)
    slow.delay(2)
    with run_worker(app, concurrency=2, lease=0.6) as w:
        w.join(timeout=20)
    assert attempts == [1, 1]
    app.close()


def test_a_limiter_written_before_starts_were_recorded_still_limits_and_says_so_once(caplog):
    # A third-party limiter that implements only reserve and forget (the methods of the
    # contract before RateLimiter.start): it keeps working, spaced by its reservations.
    from ackwise import RateLimiter
    from ackwise.backends.memory._ratelimit import MemoryRateLimiter

    class Older(MemoryRateLimiter):
        start = RateLimiter.start

    limiter = Older(BrokerURL.parse(f"memory://{uuid.uuid4().hex}"))
    with caplog.at_level(logging.WARNING, logger="ackwise.stores._ratelimit"):
        assert limiter.start("k", 0.1) == 0.0
        assert limiter.start("k", 0.1) == 0.0
    warned = [r for r in caplog.records if "does not record starts" in r.getMessage()]
    assert len(warned) == 1
