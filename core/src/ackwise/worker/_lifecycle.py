"""A worker's start-up and stop: its executor, stop requests (a call, SIGTERM / SIGINT), its states.

:class:`Control` holds what other threads and signal handlers read or set: a stop requested
(graceful first, cold on a second request), ready (connected, queues declared), ended (the
loop returned).  A stop request wakes the consumer loop through the queue it waits on, the
executor's reports (:mod:`ackwise.worker._completions`).  :func:`make_executor` and
:func:`log_ready` are the start-up's last steps before the loop's first turn.
"""

from __future__ import annotations

import logging
import queue
import signal
import threading
from typing import TYPE_CHECKING

from ackwise.app._policy import WorkerConfig, max_auto_prefetch
from ackwise.worker._executors import Completion, Executor, PreforkExecutor, ThreadExecutor
from ackwise.worker._pacing import Pacer

if TYPE_CHECKING:
    from ackwise.app._app import App

__all__ = ["Control", "log_ready", "make_executor"]

log = logging.getLogger("ackwise.worker")


class Control:
    """The stop requests and states of one worker of ``config``, whose loop waits on
    ``reports``."""

    def __init__(self, reports: queue.SimpleQueue[Completion], config: WorkerConfig) -> None:
        self.reports = reports
        self.config = config
        #: 0: none; 1: graceful; 2: cold.
        self.requested = 0
        #: Set once the worker consumes (connected, queues declared).
        self.ready = threading.Event()
        #: Set once the worker's loop has ended.
        self.ended = threading.Event()

    def request_stop(self, cold: bool = False) -> None:
        """Ask the loop to stop: graceful first, cold on a second call or with ``cold``.

        Safe to call from a signal handler.
        """
        self.requested = 2 if cold or self.requested else 1
        self.reports.put(("wake", 0, None))

    def asked(self) -> bool:
        """Whether a stop was requested."""
        return bool(self.requested)

    def install_signal_handlers(self) -> None:
        """SIGTERM / SIGINT: graceful stop; a second one: cold stop."""

        def handler(signum: int, frame: object) -> None:
            cold = self.requested > 0
            log.warning(
                "%s received: %s",
                signal.Signals(signum).name,
                "cold stop"
                if cold
                else f"graceful stop (grace {self.config.grace:.0f}s; again for a cold stop)",
            )
            self.request_stop(cold=cold)

        signal.signal(signal.SIGTERM, handler)
        signal.signal(signal.SIGINT, handler)

    def pause(self, seconds: float) -> None:
        """Sleep ``seconds``, or less if a stop is requested (its wake-up ends the wait)."""
        try:
            self.reports.get(timeout=seconds)
        except queue.Empty:
            pass


def make_executor(
    app: App, config: WorkerConfig, reports: queue.SimpleQueue[Completion], pacer: Pacer
) -> Executor:
    """The executor ``config`` asks for, not started yet; it reports on ``reports``."""
    if config.pool == "prefork":
        assert config.app_path is not None
        executor: Executor = PreforkExecutor(config.app_path, config.concurrency, reports)
    else:
        gate = pacer.gate() if pacer.active else None
        executor = ThreadExecutor(app, config.concurrency, reports, gate)
    return executor


def log_ready(worker_id: str, app: App, config: WorkerConfig) -> None:
    """The start-up's last line: what the worker consumes, and how."""
    log.info(
        "worker %s ready: broker %s, queues %s, pool %s x%d, prefetch %s, lease %.1fs",
        worker_id,
        app.broker,
        ",".join(config.queues),
        config.pool,
        config.concurrency,
        f"auto ({config.prefetch} to {max_auto_prefetch(config.concurrency)})"
        if config.prefetch_auto
        else config.prefetch,
        config.lease,
    )
