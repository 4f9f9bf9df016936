"""DESIGN §1 on the embedded SQLite broker, with real worker processes and real signals.

Each test starts ``ackwise worker`` processes on a fresh database file, publishes journalled
tasks (tests/crashapp), injects the fault at a known point (a task waits on a gate file, so a
kill lands mid-task by construction, not by timing) and checks the journal and the broker's
own stats against the contract.
"""

from __future__ import annotations

import json
import os
import random
import signal
import sys
import time
from pathlib import Path

import pytest

from _crash import HERE, Journal, WorkerProcess, eventually, pid_alive

pytestmark = pytest.mark.slow

sys.path.insert(0, str(HERE))
import crashapp  # noqa: E402

SUFFIX = {"early": "early", "late": "late", "reject_on_lost": "rol"}


class Env:
    def __init__(self, tmp_path: Path) -> None:
        self.db = tmp_path / "broker.db"
        self.url = f"sqlite:///{self.db}"
        self.journal = Journal(tmp_path / "journal.jsonl")
        self.gates = tmp_path / "gates"
        self.gates.mkdir()
        self.tmp = tmp_path
        self.env = dict(os.environ)
        self.env.update(
            ACKWISE_BROKER_URL=self.url,
            CRASH_JOURNAL=str(self.journal.path),
            CRASH_GATES=str(self.gates),
            PYTHONPATH=os.pathsep.join([str(HERE), self.env.get("PYTHONPATH", "")]),
        )
        self.workers: list[WorkerProcess] = []
        self.app = crashapp.build(crashapp.App("crash-producer", broker=self.url))
        self.adapter = self.app.adapter()
        self.adapter.open()

    def worker(self, *args: str) -> WorkerProcess:
        w = WorkerProcess(self.env, self.tmp / f"worker{len(self.workers)}.log", *args)
        self.workers.append(w)
        w.wait_ready()
        return w

    def send(self, task: str, *args: object, **options: object) -> str:
        return self.app.tasks[task].apply_async(args, **options)  # type: ignore[arg-type]

    def open_gate(self, name: str) -> None:
        (self.gates / name).touch()

    def stats(self):
        return self.adapter.stats("default")

    def close(self) -> None:
        for w in self.workers:
            w.stop()
        self.adapter.close()
        self.app.close()


@pytest.fixture
def env(tmp_path):
    e = Env(tmp_path)
    yield e
    e.close()


def _child_pid(env: Env, key: str) -> int:
    starts = eventually(lambda: env.journal.lines(event="start", key=key), timeout=20)
    return int(starts[-1]["pid"])


@pytest.mark.parametrize("mode", ["early", "late", "reject_on_lost"])
def test_executor_sigkill_applies_the_mode_rule(env, mode):
    s = SUFFIX[mode]
    w = env.worker("--pool", "prefork", "-c", "1", "--lease", "2")
    env.send(f"block_{s}", "k")
    child = _child_pid(env, "k")
    assert child != w.pid
    os.kill(child, signal.SIGKILL)
    if mode == "reject_on_lost":
        # Requeued at once and re-run (attempt 2) on a fresh child; then it completes.
        second = eventually(lambda: env.journal.lines(event="start", key="k", attempt=2), 10)
        assert second[0]["pid"] != child
        env.open_gate("k")
        eventually(lambda: env.journal.lines(event="end", key="k"), 10)
        eventually(lambda: env.stats().in_flight == 0 and env.stats().ready == 0, 10)
        assert env.stats().dead == 0
    elif mode == "late":
        # Dead-lettered worker_lost within a second, never re-run.
        eventually(lambda: env.stats().dead == 1, 5)
        [dead] = env.adapter.dead_letters("default")
        assert dead.reason == "worker_lost"
        assert b'"outcome":"worker_lost"' in dead.body
    else:
        # Acked before it started: lost, and counted as such.
        eventually(lambda: "lost (worker_lost)" in w.output(), 5)
        st = env.stats()
        assert (st.ready, st.in_flight, st.dead) == (0, 0, 0)
    # The worker keeps going on a replacement child, and nothing ran twice that should not.
    env.send(f"note_{s}", "after")
    eventually(lambda: env.journal.lines(event="end", key="after"), 15)
    starts = env.journal.lines(event="start", key="k")
    assert len(starts) == (2 if mode == "reject_on_lost" else 1)


@pytest.mark.parametrize("mode", ["early", "late", "reject_on_lost"])
def test_poison_task_that_kills_its_executor_ends_per_mode(env, mode):
    s = SUFFIX[mode]
    env.worker("--pool", "prefork", "-c", "1", "--lease", "2")
    env.send(f"poison_{s}", "p")  # max_deliveries=3
    if mode == "reject_on_lost":
        eventually(lambda: env.stats().dead == 1, 30)
        assert [d.reason for d in env.adapter.dead_letters("default")] == ["max_deliveries"]
        assert [r["attempt"] for r in env.journal.lines(event="start", key="p")] == [1, 2, 3]
    elif mode == "late":
        eventually(lambda: env.stats().dead == 1, 15)
        assert [d.reason for d in env.adapter.dead_letters("default")] == ["worker_lost"]
        assert len(env.journal.lines(event="start", key="p")) == 1
    else:
        eventually(lambda: env.journal.lines(event="start", key="p"), 15)
        env.send("note_early", "after")
        eventually(lambda: env.journal.lines(event="end", key="after"), 15)
        assert len(env.journal.lines(event="start", key="p")) == 1
        assert env.stats().dead == 0
    st = env.stats()
    assert (st.ready, st.in_flight) == (0, 0)


@pytest.mark.parametrize("mode", ["early", "late", "reject_on_lost"])
def test_whole_worker_sigkill_redelivers_after_the_lease(env, mode):
    s = SUFFIX[mode]
    a = env.worker("--pool", "prefork", "-c", "1", "--lease", "1.5")
    env.send(f"block_{s}", "w")
    child = _child_pid(env, "w")
    a.signal(signal.SIGKILL)
    a.wait()
    # The executor child dies with its supervisor: no orphan finishes the task behind our back.
    eventually(lambda: not pid_alive(child), 5)
    env.open_gate("w-2")  # only a second delivery may finish
    b = env.worker("--pool", "prefork", "-c", "1", "--lease", "1.5")
    if mode == "early":
        env.send("note_early", "after")
        eventually(lambda: env.journal.lines(event="end", key="after"), 15)
        assert len(env.journal.lines(event="start", key="w")) == 1
        st = env.stats()
        assert (st.ready, st.in_flight, st.dead) == (0, 0, 0)
    else:
        eventually(lambda: env.journal.lines(event="end", key="w", attempt=2), 15)
        assert env.journal.lines(event="start", key="w", attempt=2)[0]["pid"] != child
        eventually(lambda: env.stats().in_flight == 0, 5)
        st = env.stats()
        assert (st.ready, st.dead) == (0, 0)
    assert b.proc.poll() is None


@pytest.mark.parametrize("mode", ["late", "reject_on_lost"])
def test_stale_ack_after_a_pause_leaves_the_new_delivery_alone(env, mode):
    s = SUFFIX[mode]
    a = env.worker("--pool", "prefork", "-c", "1", "--lease", "1")
    env.send(f"block_{s}", "st")
    eventually(lambda: env.journal.lines(event="start", key="st", attempt=1), 15)
    a.signal(signal.SIGSTOP)  # no more lease renewals from A
    try:
        env.worker("--pool", "prefork", "-c", "1", "--lease", "30")
        # B gets the message once A's lease expires (at least once: it may run again).
        eventually(lambda: env.journal.lines(event="start", key="st", attempt=2), 15)
        env.open_gate("st-1")  # A's execution may finish now; B's may not
        eventually(lambda: env.journal.lines(event="end", key="st", attempt=1), 10)
    finally:
        a.signal(signal.SIGCONT)
    # A's late ack is a stale receipt: reported, and B's delivery is untouched.
    eventually(lambda: "stale receipt" in a.output(), 10)
    st = env.stats()
    assert st.in_flight == 1 and st.ready == 0
    env.open_gate("st-2")
    eventually(lambda: env.journal.lines(event="end", key="st", attempt=2), 10)
    eventually(lambda: env.stats().in_flight == 0, 10)
    assert env.stats().ready == 0
    assert len(env.journal.lines(event="start", key="st")) == 2  # dup <= 1


@pytest.mark.parametrize("mode", ["early", "late", "reject_on_lost"])
def test_graceful_shutdown_returns_prefetched_messages_at_once(env, mode):
    s = SUFFIX[mode]
    env.send(f"block_{s}", "g")
    for i in range(9):
        env.send(f"note_{s}", f"n{i}")
    a = env.worker("--pool", "prefork", "-c", "1", "--prefetch", "10", "--lease", "60")
    eventually(lambda: env.journal.lines(event="start", key="g"), 15)
    running = 0 if mode == "early" else 1  # an early task was acked as it started
    eventually(lambda: env.stats().in_flight == 9 + running, 5)
    a.signal(signal.SIGTERM)
    # The nine unstarted come back at once, not after the 60 s lease.
    eventually(lambda: env.stats().ready == 9, 3)
    assert env.stats().in_flight == running
    env.open_gate("g")  # the running task finishes within the grace period
    assert a.wait(20) == 0
    eventually(lambda: env.journal.lines(event="end", key="g"), 5)
    st = env.stats()
    assert (st.ready, st.in_flight, st.dead) == (9, 0, 0)
    assert not env.journal.lines(event="start", key="n0")


@pytest.mark.parametrize("pool", ["prefork", "threads"])
def test_task_four_times_its_lease_never_runs_twice(env, pool):
    env.send("sleep_late", "long", 4.0)
    env.worker("--pool", pool, "-c", "1", "--lease", "1")
    env.worker("--pool", pool, "-c", "1", "--lease", "1")
    eventually(lambda: env.journal.lines(event="end", key="long"), 15)
    eventually(lambda: env.stats().in_flight == 0, 5)
    assert len(env.journal.lines(event="start", key="long")) == 1
    st = env.stats()
    assert (st.ready, st.dead) == (0, 0)


@pytest.mark.parametrize("mode", ["early", "late", "reject_on_lost"])
def test_grace_exceeded_stops_cold(env, mode):
    s = SUFFIX[mode]
    a = env.worker("--pool", "prefork", "-c", "1", "--lease", "1.5", "--grace", "0.5")
    env.send(f"block_{s}", "cold")
    eventually(lambda: env.journal.lines(event="start", key="cold"), 15)
    a.signal(signal.SIGTERM)
    assert a.wait(10) == 1  # cold stop
    env.open_gate("cold-2")
    env.worker("--pool", "prefork", "-c", "1", "--lease", "1.5")
    if mode == "early":
        env.send("note_early", "after")
        eventually(lambda: env.journal.lines(event="end", key="after"), 15)
        assert len(env.journal.lines(event="start", key="cold")) == 1
    else:
        eventually(lambda: env.journal.lines(event="end", key="cold", attempt=2), 15)
    eventually(lambda: env.stats().in_flight == 0, 5)
    st = env.stats()
    assert (st.ready, st.dead) == (0, 0)


@pytest.mark.parametrize("mode", ["early", "late", "reject_on_lost"])
def test_random_kills_during_a_drain_keep_the_mode_contract(env, mode):
    """Workers and executor children SIGKILLed at random while 400 tasks drain (C03/C04 mixed)."""
    s = SUFFIX[mode]
    rng = random.Random(1234)
    keys = [f"r{i}" for i in range(400)]
    env.app.send_many([env.app.tasks[f"sleep_{s}"].s(k, 0.01) for k in keys])
    args = ("--pool", "prefork", "-c", "2", "--lease", "1", "--prefetch", "4")
    workers = [env.worker(*args) for _ in range(2)]
    for _ in range(6):
        eventually(lambda: len(env.journal.lines(event="start")) > 0, 10)
        victim = rng.choice(workers)
        starts = env.journal.lines(event="start")
        if rng.random() < 0.5 and starts:
            # an executor child of any worker: the most recent starter
            try:
                os.kill(int(starts[-1]["pid"]), signal.SIGKILL)
            except ProcessLookupError:
                pass
        else:
            victim.signal(signal.SIGKILL)
            victim.wait()
            workers.remove(victim)
            workers.append(env.worker(*args))
        time.sleep(0.3)
    eventually(lambda: (lambda st: st.ready == st.in_flight == st.delayed == 0)(env.stats()), 60)
    ended = {r["key"] for r in env.journal.lines(event="end")}
    started = [r["key"] for r in env.journal.lines(event="start")]
    dead = {crashapp_key(d.body) for d in env.adapter.dead_letters("default", limit=1000)}
    if mode == "early":
        assert len(started) == len(set(started)), "an early task ran twice"
    else:
        # At least once: every message completed, or was dead-lettered with a reason
        # (LATE: worker_lost when its executor was killed; nothing is silently dropped).
        missing = set(keys) - ended - dead
        assert not missing, f"lost: {sorted(missing)[:10]}"
        if mode == "reject_on_lost":
            assert set(keys) <= ended or all(
                d.reason == "max_deliveries" for d in env.adapter.dead_letters("default")
            )


def crashapp_key(body: bytes) -> str:
    return json.loads(body)["args"][0]
