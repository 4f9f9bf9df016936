"""Run a selection of level-2 cases: several at once on the broker they share, alone when they
restart it; every case's broker objects deleted, also when the run is interrupted.

Cases spend most of their time waiting on leases and delays, so running several at once
shortens a run about as many times, up to what the machine's CPUs take.  A case that restarts
the broker (C19) runs after the others, by itself.  Each case has queues and keys of its own
(the run's prefix and a unique part), so concurrent cases never read each other's messages;
a case on an embedded broker (SQLite, memory) has a store of its own in the work directory.
"""

from __future__ import annotations

import os
import queue
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from ackwise import Ack
from ackwise.errors import ConfigurationError
from ackwise_conformance.harness import DEFAULT_PREFIX, Broker, Harness, own_store
from ackwise_conformance.scenarios import SCENARIOS, CaseResult, run_case

__all__ = ["Progress", "default_jobs", "run_cases"]

Case = tuple[str, Ack | None]

#: A case that has not finished after this long (before the time scale) is failed and closed.
CASE_TIMEOUT = 300.0

#: How long an interrupted run waits (before the time scale) for its cases' threads to end.
INTERRUPT_WAIT = 60.0


#: Cases at once on a broker whose workers run in this process (``multi_process=False``).
IN_PROCESS_JOBS = 2


def _multi_process(broker: Broker) -> bool:
    from ackwise import BrokerURL, get_plugins

    scheme = BrokerURL.parse(broker.url).scheme
    return bool(get_plugins().adapters.get(scheme).load().capabilities.multi_process)


def default_jobs() -> int:
    """How many cases run at once by default: ``$ACKWISE_CONFORMANCE_JOBS``, else four per
    CPU, at most 8.

    A case mostly waits (leases of a second, delays, quiet periods); the ones that work hard
    (C01, C21: thousands of messages) are a few among many.  Several runs sharing one host
    (a test suite in parallel processes) share its CPUs: the variable splits them.
    """
    asked = os.environ.get("ACKWISE_CONFORMANCE_JOBS", "").strip()
    if asked:
        try:
            return max(1, int(asked))
        except ValueError:
            raise ConfigurationError(
                f"ACKWISE_CONFORMANCE_JOBS={asked!r}: expected a whole number of cases >= 1"
            ) from None
    return max(1, min(8, 4 * (os.cpu_count() or 1)))


@dataclass
class Progress:
    """What a run has done so far: the counts by status, the cases running, the time."""

    total: int
    started: float = field(default_factory=time.monotonic)
    counts: dict[str, int] = field(default_factory=dict)
    running: list[str] = field(default_factory=list)
    done: int = 0

    @property
    def elapsed(self) -> float:
        return time.monotonic() - self.started

    def line(self) -> str:
        counts = " ".join(f"{k} {self.counts.get(k, 0)}" for k in ("pass", "fail", "n/a"))
        pending = self.counts.get("pending", 0)
        if pending:
            counts += f" pending {pending}"
        running = ", ".join(self.running[:4]) + (" …" if len(self.running) > 4 else "")
        return f"[{self.done:>3}/{self.total}] {counts} | {self.elapsed:5.0f}s" + (
            f" | running {running}" if running else ""
        )


def case_label(case: Case) -> str:
    sid, mode = case
    return f"{sid}-{mode.name if mode else 'any'}"


def run_cases(
    broker: Broker,
    selected: Sequence[Case],
    workdir: Path,
    *,
    time_scale: float = 1.0,
    jobs: int | None = None,
    prefix: str = DEFAULT_PREFIX,
    case_timeout: float | None = None,
    on_result: Callable[[CaseResult, Progress], None] | None = None,
    on_tick: Callable[[Progress], None] | None = None,
) -> list[CaseResult]:
    """Run ``selected`` and return their results in the order given.

    :param jobs: cases at once (default :func:`default_jobs`); 1 runs them one by one.
    :param case_timeout: seconds after which a case that has not finished is failed and
        closed (its workers stopped, its queues deleted); default :data:`CASE_TIMEOUT` times
        the time scale.
    :param on_result: called (on the calling thread) as each case finishes.
    :param on_tick: called about twice a second while cases run (a progress line).
    :raises KeyboardInterrupt: after closing every running case (its workers stopped, its
        queues deleted), when the run was interrupted.
    """
    jobs = default_jobs() if jobs is None else max(1, jobs)
    if not _multi_process(broker):
        # An in-process broker's workers are threads of this interpreter: cases at once share
        # one GIL, and a case's 1 s leases must be renewed while the others drain thousands
        # of messages (C09 on memory ran twice, its renewal 2.7 s late, at 8 at once).
        jobs = min(jobs, IN_PROCESS_JOBS)
    progress = Progress(total=len(selected))
    results: dict[int, CaseResult] = {}
    shared = [i for i, (sid, _) in enumerate(selected) if not SCENARIOS[sid].exclusive]
    alone = [i for i, (sid, _) in enumerate(selected) if SCENARIOS[sid].exclusive]
    limit = CASE_TIMEOUT * time_scale if case_timeout is None else case_timeout
    for batch, width in ((shared, jobs), (alone, 1)):
        if batch:
            _run_batch(
                broker, selected, batch, width, workdir, time_scale, prefix, limit, progress,
                results, on_result, on_tick,
            )  # fmt: skip
    return [results[i] for i in range(len(selected))]


class _Running:
    """The cases running now: their harnesses (to close from here) and start times."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.harness: dict[int, Harness] = {}
        self.since: dict[int, float] = {}


def _run_batch(
    broker: Broker,
    selected: Sequence[Case],
    batch: list[int],
    width: int,
    workdir: Path,
    time_scale: float,
    prefix: str,
    limit: float,
    progress: Progress,
    results: dict[int, CaseResult],
    on_result: Callable[[CaseResult, Progress], None] | None,
    on_tick: Callable[[Progress], None] | None,
) -> None:
    todo: queue.SimpleQueue[int] = queue.SimpleQueue()
    # Longest first: the run ends about when its longest case does, not one long case later.
    for i in sorted(batch, key=lambda i: -SCENARIOS[selected[i][0]].cost):
        todo.put(i)
    finished: queue.SimpleQueue[tuple[int, CaseResult]] = queue.SimpleQueue()
    running = _Running()
    stop = threading.Event()

    def work() -> None:
        while not stop.is_set():
            try:
                i = todo.get_nowait()
            except queue.Empty:
                return
            sid, mode = selected[i]
            with running.lock:
                running.since[i] = time.monotonic()

            def opened(h: Harness, i: int = i) -> None:
                with running.lock:
                    running.harness[i] = h
                if stop.is_set():  # opened while the run was being interrupted
                    h.close()

            result = run_case(
                own_store(broker, workdir / "stores" / case_label(selected[i])),
                sid,
                mode,
                workdir,
                time_scale=time_scale,
                prefix=prefix,
                opened=opened,
            )
            with running.lock:
                running.harness.pop(i, None)
                running.since.pop(i, None)
            finished.put((i, result))

    threads = [
        threading.Thread(target=work, name=f"conformance-case-{n}", daemon=True)
        for n in range(min(width, len(batch)))
    ]
    for t in threads:
        t.start()
    try:
        while any(i not in results for i in batch):
            try:
                i, result = finished.get(timeout=0.5)
            except queue.Empty:
                _fail_overdue(selected, running, results, progress, limit, on_result)
            else:
                if i not in results:  # not already failed as overdue
                    _record(i, result, results, progress, on_result)
            with running.lock:
                progress.running = [case_label(selected[j]) for j in sorted(running.since)]
            if on_tick is not None:
                on_tick(progress)
    except BaseException:
        stop.set()
        with running.lock:
            open_now = list(running.harness.values())
        for h in open_now:
            h.close()
        # A case may be between declaring its queue and telling us of its harness: wait for
        # every thread (each closes what it opened; a closed case's waits end at once).
        deadline = time.monotonic() + INTERRUPT_WAIT * time_scale
        for t in threads:
            t.join(max(0.0, deadline - time.monotonic()))
        raise


def _record(
    i: int,
    result: CaseResult,
    results: dict[int, CaseResult],
    progress: Progress,
    on_result: Callable[[CaseResult, Progress], None] | None,
) -> None:
    results[i] = result
    progress.done += 1
    progress.counts[result.status] = progress.counts.get(result.status, 0) + 1
    if on_result is not None:
        on_result(result, progress)


def _fail_overdue(
    selected: Sequence[Case],
    running: _Running,
    results: dict[int, CaseResult],
    progress: Progress,
    limit: float,
    on_result: Callable[[CaseResult, Progress], None] | None,
) -> None:
    now = time.monotonic()
    with running.lock:
        overdue = [
            (i, running.harness.get(i))
            for i, since in running.since.items()
            if now - since > limit and i not in results
        ]
    for i, h in overdue:
        sid, mode = selected[i]
        if h is not None:
            h.close()  # its workers stop: the scenario's thread finishes soon after
        _record(
            i,
            CaseResult(sid, mode, "fail", f"the case did not finish within {limit:.0f}s", limit),
            results,
            progress,
            on_result,
        )
