"""What the executor reports, handled: a task that returned or raised, an executor lost.

Each report of a running job ends its idempotency claim first (done on success, released
otherwise: :mod:`ackwise.worker._claims`), then counts it, tells the listeners and has it
settled (:class:`~ackwise.worker._settlement.Settler`).  The reports come on the queue the
executor was given (:mod:`ackwise.worker._executors`); when to read them is the consumer
loop's (:mod:`ackwise.worker._loop`).
"""

from __future__ import annotations

import queue
from collections.abc import Callable

from ackwise.app._execution import FAILED, Result
from ackwise.contract._semantics import Outcome
from ackwise.worker._claims import Claims
from ackwise.worker._events import Events, Failed, Interrupted, Succeeded
from ackwise.worker._executors import Completion
from ackwise.worker._holdings import WorkerCounters
from ackwise.worker._ledger import Ledger
from ackwise.worker._settlement import Settler

__all__ = ["Completions", "Fatal"]


class Fatal(Exception):
    """The executor cannot go on (its ``fatal`` report): the worker stops cold."""


class Completions:
    """Handles the reports of ``reports`` about the running jobs of ``ledger``.

    :param adapt: told the duration of every success (the prefetch follows the pace).
    :param killed: jobs killed past their time limit, and why (taken as their ``lost``
        report's reason).
    """

    def __init__(
        self,
        reports: queue.SimpleQueue[Completion],
        ledger: Ledger,
        settler: Settler,
        claims: Claims,
        events: Events,
        counters: WorkerCounters,
        *,
        adapt: Callable[[float], None],
        killed: dict[int, str],
    ) -> None:
        self.reports = reports
        self.ledger = ledger
        self.settler = settler
        self.claims = claims
        self.events = events
        self.counters = counters
        self.adapt = adapt
        self.killed = killed

    def drain(self, block: float) -> None:
        """Handle every report there is, waiting up to ``block`` seconds for the first.

        :raises Fatal: the executor reported that it cannot go on.
        """
        try:
            item = self.reports.get(timeout=block) if block > 0 else self.reports.get_nowait()
        except queue.Empty:
            return
        while True:
            kind, job_id, payload = item
            if kind == "done":
                self.finished(job_id, payload)
            elif kind == "lost":
                self.executor_lost(job_id, payload)
            elif kind == "fatal":
                raise Fatal(payload)
            try:
                item = self.reports.get_nowait()
            except queue.Empty:
                return

    def finished(self, job_id: int, result: Result) -> None:
        """The task of ``job_id`` returned or raised."""
        running = self.ledger.running
        h = running.get(job_id)
        if h is None:  # pragma: no cover - a job the loop no longer tracks
            return
        task, d = h.task, h.delivery
        if result.status == FAILED:
            self.counters.failed += 1
            self.counters.finished(d.queue, failed=True)
            self.events.emit(
                Failed(
                    task.name,
                    d.message_id,
                    d.queue,
                    d.attempt,
                    error=result.error,
                    duration=result.duration,
                )
            )
            self.claims.done(h, completed=False)
            try:
                # Held until settled: an early-acked message is at the broker again only
                # once its retry is published.
                # keep: a broker error keeps what is left of it for after the reconnect (a
                # retry is published then, not dropped).
                self.settler.settle_held(
                    h,
                    Outcome.FAILED,
                    label="failed",
                    result=result,
                    retry_delay=result.retry_delay,
                    keep=True,
                )
            finally:
                del running[job_id]
            return
        del running[job_id]
        self.claims.done(h, completed=True)
        self.counters.succeeded += 1
        self.counters.finished(d.queue, failed=False)
        self.adapt(result.duration)
        if Succeeded in self.events.heard:
            self.events.emit(
                Succeeded(task.name, d.message_id, d.queue, d.attempt, result.duration)
            )
        self.settler.settle_held(h, Outcome.SUCCEEDED, label="succeeded", result=result, keep=True)

    def executor_lost(self, job_id: int, reason: str) -> None:
        """The process running ``job_id`` died (prefork), or was killed past a time limit."""
        reason = self.killed.pop(job_id, reason)
        h = self.ledger.running.get(job_id)
        if h is None:  # pragma: no cover
            return
        self.claims.done(h, completed=False)  # its holder is dead: the next delivery may run
        d = h.delivery
        self.events.emit(Interrupted(h.task.name, d.message_id, d.queue, d.attempt, reason=reason))
        try:
            self.settler.settle_held(
                h, Outcome.EXECUTOR_LOST, label=reason, reason=reason, keep=True
            )
        finally:
            del self.ledger.running[job_id]
