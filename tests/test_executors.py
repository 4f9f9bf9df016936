"""The prefork executor's children: real child processes, real SIGKILLs."""

from __future__ import annotations

import os
import queue
import signal
import textwrap
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from ackwise.app._execution import OK, Job
from ackwise.contract import _envelope
from ackwise.worker._executors import Completion, PreforkExecutor
from ackwise_conformance import eventually

pytestmark = pytest.mark.slow

APP = """
from ackwise import App

app = App("executors", broker="memory://executors")

@app.task(name="echo")
def echo(n):
    return n
"""


def _body(n: int) -> bytes:
    env = _envelope.Envelope(
        v=1, id=_envelope.new_id(), task="echo", args=[n], queue="default", created_at=time.time()
    )
    return _envelope.encode(env)


def _next_done(completions: queue.SimpleQueue[Completion], timeout: float) -> Completion:
    deadline = time.monotonic() + timeout
    while True:
        item = completions.get(timeout=max(0.01, deadline - time.monotonic()))
        if item[0] != "wake":
            return item


@pytest.fixture
def one_child(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> Iterator[tuple[PreforkExecutor, queue.SimpleQueue[Completion]]]:
    """A started prefork executor of one child, and its completions."""
    (tmp_path / "executors_app.py").write_text(textwrap.dedent(APP))
    monkeypatch.syspath_prepend(str(tmp_path))
    completions: queue.SimpleQueue[Completion] = queue.SimpleQueue()
    executor = PreforkExecutor("executors_app:app", 1, completions)
    executor.start()
    yield executor, completions
    executor.shutdown(cold=False)


def test_a_job_submitted_just_after_its_idle_child_died_runs_on_the_replacement(
    one_child: tuple[PreforkExecutor, queue.SimpleQueue[Completion]],
) -> None:
    # Defect: the worker counts free slots, acks early tasks (a broker round trip), then
    # submits; an idle child killed in between made submit() raise "no idle prefork child"
    # and the whole worker exit, losing the early-acked tasks it had just taken.
    executor, completions = one_child
    assert executor.free_slots() == 1  # what the worker saw
    [pid] = executor.pids()
    os.kill(pid, signal.SIGKILL)
    eventually(lambda: pid not in executor.pids(), 10, description="the child to be reaped")
    executor.submit(Job(7, 1, _body(41), ""))
    assert executor.free_slots() == 0  # the waiting job has the next child
    kind, job_id, result = _next_done(completions, 60)
    assert (kind, job_id, result.status) == ("done", 7, OK)
    assert executor.free_slots() == 1


def test_children_killed_while_starting_stop_the_worker_only_when_they_die_in_a_row(
    one_child: tuple[PreforkExecutor, queue.SimpleQueue[Completion]],
) -> None:
    # Defect (found by the chaos soak): deaths before a child was ready were counted over the
    # worker's whole life, so a few children SIGKILLed while importing the app, hours apart,
    # made a healthy worker exit with "prefork children keep dying at start".
    executor, completions = one_child
    for _ in range(4):  # 3 x concurrency deaths at start, in all, used to be fatal
        _kill_while_starting(executor)
        eventually(lambda: executor.free_slots() == 1, 60, description="a child ready")
    executor.submit(Job(1, 1, _body(1), ""))
    kind, job_id, result = _next_done(completions, 60)
    assert (kind, job_id, result.status) == ("done", 1, OK)


def _kill_while_starting(executor: PreforkExecutor) -> None:
    """SIGKILL the current (ready) child, then its replacement before that one is ready."""
    [pid] = executor.pids()
    os.kill(pid, signal.SIGKILL)
    [new] = eventually(lambda: [p for p in executor.pids() if p != pid], 10, interval=0.001)
    assert executor.free_slots() == 0  # not ready yet: it is still importing the app
    os.kill(new, signal.SIGKILL)
    eventually(lambda: new not in executor.pids(), 10, interval=0.001)
