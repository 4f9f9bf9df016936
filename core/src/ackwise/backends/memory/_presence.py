"""The worker registry of ``memory://`` apps (docs/workers.md): records in the process."""

from __future__ import annotations

import threading
import time
from collections.abc import Sequence

from ackwise.stores._presence import FORGET_AFTER, WorkerInfo, WorkerRegistry, ordered

__all__ = ["MemoryWorkerRegistry"]

_memory: dict[str, dict[str, WorkerInfo]] = {}
_memory_lock = threading.Lock()


class MemoryWorkerRegistry(WorkerRegistry):
    """For ``memory://`` apps: shared by every registry of the same name in the process."""

    scheme = "memory"

    def open(self) -> None:
        pass

    def close(self) -> None:
        pass

    @property
    def _records(self) -> dict[str, WorkerInfo]:
        """The records of the name (called with ``_memory_lock`` held)."""
        return _memory.setdefault(self.url.in_process_name, {})

    def beat(self, info: WorkerInfo) -> None:
        with _memory_lock:
            self._records[info.id] = info

    def workers(self) -> list[WorkerInfo]:
        old = time.time() - FORGET_AFTER
        with _memory_lock:
            records = self._records
            for key in [k for k, w in records.items() if w.last_seen < old]:
                del records[key]
            return ordered(list(records.values()))

    def forget(self, worker_ids: Sequence[str]) -> None:
        with _memory_lock:
            records = self._records
            for wid in worker_ids:
                records.pop(wid, None)
            if not records:  # the name itself goes too (a test's own name, used once)
                del _memory[self.url.in_process_name]
