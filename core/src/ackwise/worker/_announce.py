"""A worker's record in the worker registry (docs/workers.md): written when it is ready, every
``HEARTBEAT`` seconds on a thread of its own (a loop busy with a long broker call still
announces itself), and a last time, ``stopped``, when it stops."""

from __future__ import annotations

import logging
import os
import socket
import threading
import time
from collections.abc import Callable
from typing import TYPE_CHECKING

from ackwise._version import __version__
from ackwise.errors import AckwiseError
from ackwise.plugins._manager import open_worker_registry
from ackwise.stores._presence import HEARTBEAT, WorkerInfo, WorkerRegistry

if TYPE_CHECKING:
    from ackwise.app._app import App
    from ackwise.app._policy import WorkerConfig
    from ackwise.worker._holdings import WorkerCounters

__all__ = ["Announcer"]

log = logging.getLogger("ackwise.worker")


class Announcer:
    """Keeps one worker's record fresh.

    :param snapshot: ``(state, tasks running now, counters)`` of the worker, read on the
        announcing thread (plain numbers: no lock needed).
    """

    def __init__(
        self,
        app: App,
        worker_id: str,
        config: WorkerConfig,
        snapshot: Callable[[], tuple[str, int, WorkerCounters]],
        *,
        every: float = HEARTBEAT,
    ) -> None:
        self.app = app
        self.worker_id = worker_id
        self.config = config
        self.snapshot = snapshot
        self.every = every
        self.started_at = time.time()
        self.version = __version__
        self._registry: WorkerRegistry | None = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._failing = False

    def start(self) -> None:
        """Write the first record at once, then keep it fresh (nothing without a registry)."""
        if self.app.worker_registry_url is None:
            log.debug("no worker registry for %s: this worker is not announced", self.app.broker)
            return
        self._thread = threading.Thread(target=self._run, name="ackwise-announce", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        """Write the last record (``stopped``) and end the thread."""
        if self._thread is None:
            return
        self._stop.set()
        self._thread.join(timeout=10)
        if not self._failing:  # an unreachable registry must not hold the stop up
            self._beat(state="stopped")
        if self._registry is not None:
            try:
                self._registry.close()
            except AckwiseError:  # pragma: no cover - closing a broken connection
                log.debug("closing the worker registry failed", exc_info=True)

    def _run(self) -> None:
        self._beat()  # here, not in start(): a slow registry must not hold the worker up
        while not self._stop.wait(self.every):
            self._beat()

    def _beat(self, state: str | None = None) -> None:
        now_state, running, counters = self.snapshot()
        cfg = self.config
        info = WorkerInfo(
            id=self.worker_id,
            host=socket.gethostname(),
            pid=os.getpid(),
            app=self.app.name,
            queues=list(cfg.queues),
            pool=cfg.pool,
            concurrency=cfg.concurrency,
            version=self.version,
            started_at=self.started_at,
            last_seen=time.time(),
            state=state or now_state,
            running=0 if state == "stopped" else running,
            counters={k: v for k, v in vars(counters).items() if isinstance(v, int)},
            # dict() copies at once (the worker's thread may add a queue meanwhile).
            by_queue={q: list(n) for q, n in dict(counters.by_queue).items()},
        )
        try:
            if self._registry is None:
                assert self.app.worker_registry_url is not None
                self._registry = open_worker_registry(
                    self.app.worker_registry_url, self.app.plugins
                )
            self._registry.beat(info)
        except AckwiseError as exc:
            if not self._failing:  # once per outage: the worker itself is not affected
                log.warning(
                    "worker registry %s: %s; trying again", self.app.worker_registry_url, exc
                )
            self._failing = True
            self._close_after_error()
        else:
            self._failing = False

    def _close_after_error(self) -> None:
        registry, self._registry = self._registry, None
        if registry is not None:
            try:
                registry.close()
            except AckwiseError:  # pragma: no cover
                pass
