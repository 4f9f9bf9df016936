"""Hard time limits: the prefork child running a task past its ``time_limit`` is killed.

The executor then reports the job ``lost``; :class:`~ackwise.worker._completions.Completions`
reads why from :attr:`TimeLimits.killed` (docs/failure-handling.md).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping
from typing import TYPE_CHECKING

from ackwise.worker._executors import Executor, PreforkExecutor
from ackwise.worker._holdings import Held

if TYPE_CHECKING:
    from ackwise.app._app import App

__all__ = ["TimeLimits"]

log = logging.getLogger("ackwise.worker")


class TimeLimits:
    """The hard time limits of the tasks of ``app``."""

    def __init__(self, app: App) -> None:
        #: Some task has a hard time limit (nothing to do otherwise).
        self.active = any(t.time_limit is not None for t in app.tasks.values())
        #: Jobs killed here, and why: the reason their ``lost`` report gives.
        self.killed: dict[int, str] = {}

    def enforce(self, running: Mapping[int, Held], executor: Executor) -> float:
        """Kill executors past their task's hard time limit; return the next deadline (wall)."""
        now = time.time()
        next_deadline = float("inf")
        for job_id, h in running.items():
            limit = h.task.time_limit
            if limit is None or job_id in self.killed:
                continue
            deadline = h.started + limit
            if now >= deadline:
                if isinstance(executor, PreforkExecutor) and executor.kill_job(job_id):
                    self.killed[job_id] = "time_limit"
                    log.warning(
                        "task %s message %s exceeded its time_limit of %.1fs: executor killed",
                        h.task.name,
                        h.delivery.message_id,
                        limit,
                    )
            else:
                next_deadline = min(next_deadline, deadline)
        return next_deadline
