"""Run a real worker inside your test process and see what happened.

Like Dramatiq's stub broker and ``join()``, but with the real worker and a real adapter
(``memory://`` by default: in-process, with leases, delays and dead letters)::

    from ackwise.testing import run_worker

    app = App("shop", broker="memory://test-shop")

    def test_receipt_is_sent():
        send_receipt.delay(order_id=7)
        with run_worker(app) as worker:
            report = worker.join()
        assert report.succeeded_tasks == ["shop.tasks.send_receipt"]
        assert not report.dead_lettered

For unit tests of code that sends tasks, :func:`eager` runs every call at once, in the
sending thread, with no broker and no worker (checked and encoded as a real publish; not a
test of delivery)::

    from ackwise.testing import eager

    def test_checkout_sends_a_receipt():
        with eager(app) as mode:
            checkout(order_id=7)               # calls send_receipt.delay(7): it has run
        assert mode.tasks_sent == ["shop.tasks.send_receipt"]
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

from ackwise.app._app import App
from ackwise.app._eager import EagerFailure, EagerMode, eager
from ackwise.errors import ConfigurationError
from ackwise.worker._loop import Worker, WorkerConfig

__all__ = ["EagerFailure", "EagerMode", "Event", "InProcessWorker", "Report", "eager", "run_worker"]


@dataclass(frozen=True)
class Event:
    """One thing the worker did with one delivery."""

    kind: str  # started, succeeded, failed, retried, dead_lettered, lost, returned, stale
    task: str | None
    message_id: str
    queue: str
    attempt: int
    info: dict[str, Any] = field(default_factory=dict)


@dataclass
class Report:
    """Everything the worker did, in order."""

    events: list[Event] = field(default_factory=list)

    def of(self, kind: str) -> list[Event]:
        """The events of one ``kind`` (``started``, ``succeeded``, ``retried`` ...), in order."""
        return [e for e in self.events if e.kind == kind]

    @property
    def started(self) -> list[Event]:
        return self.of("started")

    @property
    def succeeded(self) -> list[Event]:
        return self.of("succeeded")

    @property
    def failed(self) -> list[Event]:
        return self.of("failed")

    @property
    def retried(self) -> list[Event]:
        return self.of("retried")

    @property
    def dead_lettered(self) -> list[Event]:
        return self.of("dead_lettered")

    @property
    def lost(self) -> list[Event]:
        return self.of("lost")

    @property
    def succeeded_tasks(self) -> list[str | None]:
        return [e.task for e in self.succeeded]


class InProcessWorker:
    """A real :class:`Worker` (threads pool) running on a background thread of this process.

    Differences from ``ackwise worker`` defaults, for fast tests: a message of an unknown task is
    offered again without delay (``unknown_task_delay=0``) before it is dead-lettered.

    :meth:`is_alive` tells whether the worker still runs (a test that fed it something bad
    asserts that it kept going), and :attr:`error` what it stopped on, if it raised.
    """

    def __init__(
        self,
        app: App,
        *,
        queues: Sequence[str] = (),
        concurrency: int = 1,
        lease: float = 30.0,
        prefetch: int = 0,
        unknown_task_delay: float = 0.0,
    ) -> None:
        if app.diversion is not None:
            raise ConfigurationError(
                f"app {app.name!r} is in eager mode: its sends run at once and never reach a "
                "worker; run the worker outside the eager(app) block"
            )
        self.app = app
        self.report = Report()
        self._lock = threading.Lock()
        self.worker = Worker(
            app,
            WorkerConfig(
                queues=queues,
                concurrency=concurrency,
                pool="threads",
                lease=lease,
                prefetch=prefetch,
                poll=0.05,
                grace=30.0,
                unknown_task_delay=unknown_task_delay,
            ),
            listeners=[self._record],
        )
        self._thread: threading.Thread | None = None
        self._status: int | None = None
        self._error: BaseException | None = None

    def _record(self, kind: str, info: dict[str, Any]) -> None:
        extra = {
            k: v for k, v in info.items() if k not in ("task", "message_id", "queue", "attempt")
        }
        with self._lock:
            self.report.events.append(
                Event(kind, info["task"], info["message_id"], info["queue"], info["attempt"], extra)
            )

    def start(self) -> InProcessWorker:
        """Start the worker on a thread of this process; return once it consumes (or raise
        what stopped it from starting)."""

        def target() -> None:
            try:
                self._status = self.worker.run()
            except BaseException as exc:
                self._error = exc

        self._thread = threading.Thread(target=target, name="ackwise-test-worker", daemon=True)
        self._thread.start()
        while not self.worker.wait_ready(0.05):
            if not self._thread.is_alive():
                self._raise()
        return self

    def is_alive(self) -> bool:
        """Whether the worker's thread runs: started, and neither stopped nor crashed."""
        return self._thread is not None and self._thread.is_alive()

    @property
    def error(self) -> BaseException | None:
        """What the worker's thread raised, if it ended on an exception (else ``None``)."""
        return self._error

    def _raise(self) -> None:
        if self._error is not None:
            raise self._error

    def join(self, timeout: float = 10.0, *, include_delayed: bool = True) -> Report:
        """Wait until every queue of the worker is idle; return the report so far.

        Idle means: nothing ready, nothing in flight, nothing held by the worker (and nothing
        delayed, unless ``include_delayed`` is false).

        :raises TimeoutError: naming what was still pending.
        """
        adapter = self.app.adapter()
        adapter.open()
        deadline = time.monotonic() + timeout
        try:
            while True:
                self._raise()
                stats = [adapter.stats(q) for q in self.worker.config.queues]
                pending = [
                    s for s in stats if s.ready or s.in_flight or (include_delayed and s.delayed)
                ]
                if not pending and self.worker.held == 0:
                    # Settle-then-check: a second look after a beat closes the gap between
                    # a completion and its settlement.
                    time.sleep(0.02)
                    stats = [adapter.stats(q) for q in self.worker.config.queues]
                    if (
                        all(
                            not (s.ready or s.in_flight or (include_delayed and s.delayed))
                            for s in stats
                        )
                        and self.worker.held == 0
                    ):
                        return self.report
                if time.monotonic() >= deadline:
                    raise TimeoutError(
                        f"queues not idle after {timeout}s: "
                        + "; ".join(
                            f"{s.queue}: ready={s.ready} delayed={s.delayed} in_flight={s.in_flight}"
                            for s in pending
                        )
                        + f"; held by the worker: {self.worker.held}"
                    )
                time.sleep(0.01)
        finally:
            adapter.close()

    def stop(self, timeout: float = 30.0) -> int | None:
        """Stop gracefully (unless a stop is under way already) and wait for the worker thread."""
        if not self.worker.stopping:
            self.worker.request_stop()
        if self._thread is not None:
            self._thread.join(timeout)
        self._raise()
        return self._status


@contextmanager
def run_worker(
    app: App,
    *,
    queues: Sequence[str] = (),
    concurrency: int = 1,
    lease: float = 30.0,
    prefetch: int = 0,
) -> Iterator[InProcessWorker]:
    """Run an :class:`InProcessWorker` for the duration of the ``with`` block."""
    worker = InProcessWorker(
        app, queues=queues, concurrency=concurrency, lease=lease, prefetch=prefetch
    ).start()
    try:
        yield worker
    finally:
        worker.stop()
