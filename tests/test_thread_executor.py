"""The thread pool's jobs beyond its idle threads: what counts as started, what can be taken back."""

from __future__ import annotations

import queue
import threading
import time

from ackwise import App
from ackwise.app._execution import OK, Job
from ackwise.contract import _envelope
from ackwise.worker import _executors
from ackwise.worker._executors import Completion, ThreadExecutor


def _job(app: App, job_id: int) -> Job:
    env = _envelope.Envelope(
        v=1, id=_envelope.new_id(), task="t", args=[job_id], queue="default", created_at=0.0
    )
    return Job(job_id, 1, _envelope.encode(env))


def _app(ran: list[int], gate: threading.Event | None = None) -> App:
    app = App("pool", broker="memory://pool")

    @app.task(name="t")
    def t(i: int) -> None:
        if gate is not None:
            gate.wait(10)
        ran.append(i)

    return app


def test_a_job_handed_to_an_idle_thread_has_started_and_is_never_taken_back() -> None:
    # Defect: a graceful stop took back (and returned) the job it had just handed to the idle
    # thread, when that thread had not picked it up yet; the task had been reported started.
    ran: list[int] = []
    executor = ThreadExecutor(_app(ran), 1, queue.SimpleQueue())  # threads not started yet
    executor.ahead = 4
    for i in (1, 2, 3):
        executor.submit(_job(executor.app, i))
    assert executor.waiting() == 2  # the first is the idle thread's
    assert executor.withdraw([1, 2, 3]) == [2, 3]
    assert executor.free_slots() == 1 + 4 - 1


def test_withdrawn_jobs_are_skipped_and_the_rest_run_in_order() -> None:
    ran: list[int] = []
    gate = threading.Event()
    completions: queue.SimpleQueue[Completion] = queue.SimpleQueue()
    executor = ThreadExecutor(_app(ran, gate), 1, completions)
    executor.ahead = 8
    executor.start()
    try:
        for i in range(1, 6):
            executor.submit(_job(executor.app, i))
        deadline = time.monotonic() + 5
        while executor.waiting() != 4:  # job 1 runs (held by the gate), 2-5 wait
            assert time.monotonic() < deadline
            time.sleep(0.01)
        assert executor.withdraw([1, 3, 4]) == [3, 4]  # 1 runs: not withdrawn
        gate.set()
        done = [completions.get(timeout=5) for _ in range(3)]
        assert [(kind, job_id) for kind, job_id, _ in done] == [
            ("done", 1),
            ("done", 2),
            ("done", 5),
        ]
        assert all(result.status == OK for *_, result in done)
        assert ran == [1, 2, 5]
        assert executor.free_slots() == 1 + 8
    finally:
        executor.shutdown(cold=False)


def test_let_start_yields_until_the_woken_thread_took_its_job() -> None:
    # A job handed to an idle thread waits for that thread to wake and take the GIL; the
    # consumer yields until it did (a task's start no longer waits for the consumer's next
    # blocking call, a log line's formatting at INFO: ~70 µs), but not forever.
    ran: list[int] = []
    completions: queue.SimpleQueue[Completion] = queue.SimpleQueue()
    executor = ThreadExecutor(_app(ran), 1, completions)
    executor.start()
    try:
        executor.submit(_job(executor.app, 1))
        started = time.perf_counter()
        executor.let_start(1)
        took = time.perf_counter() - started
        assert 1 not in executor._waiting or took >= _executors._HAND_OVER
        assert completions.get(timeout=5)[1] == 1
    finally:
        executor.shutdown(cold=False)


def test_let_start_gives_up_after_its_bound_when_no_thread_takes_the_job() -> None:
    executor = ThreadExecutor(_app([]), 1, queue.SimpleQueue())  # threads not started
    executor.submit(_job(executor.app, 1))
    started = time.perf_counter()
    executor.let_start(1)
    took = time.perf_counter() - started
    assert _executors._HAND_OVER <= took < 1.0
    assert 1 in executor._waiting
