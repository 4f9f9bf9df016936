"""The result store of ``memory://`` apps (docs/results.md): records in the process."""

from __future__ import annotations

import threading
import time
from collections.abc import Sequence

from ackwise.backends.memory._named import Named
from ackwise.stores._results import ResultStore, TaskResult

__all__ = ["MemoryResultStore"]


class _MemoryState:
    def __init__(self) -> None:
        self.changed = threading.Condition()
        self.records: dict[str, tuple[TaskResult, float]] = {}  # id -> (record, expires)
        self.chords: dict[str, set[int]] = {}


_memory: Named[_MemoryState] = Named(_MemoryState)


class MemoryResultStore(ResultStore):
    """In-process store for ``memory://`` apps (shared by every store of the same name)."""

    scheme = "memory"

    def open(self) -> None:
        self._state = _memory.get(self.url.in_process_name)

    def close(self) -> None:
        pass

    def put(self, records: Sequence[TaskResult]) -> None:
        expires = time.time() + self.ttl
        with self._state.changed:
            for r in records:
                if r.replaces(self._current(r.id)):
                    self._state.records[r.id] = (r, expires)
            self._state.changed.notify_all()

    def get(self, message_id: str) -> TaskResult | None:
        with self._state.changed:
            return self._current(message_id)

    def forget(self, message_ids: Sequence[str]) -> None:
        with self._state.changed:
            for mid in message_ids:
                self._state.records.pop(mid, None)
                self._state.chords.pop(mid, None)

    def join(self, chord_id: str, member: int) -> int:
        with self._state.changed:
            members = self._state.chords.setdefault(chord_id, set())
            members.add(member)
            return len(members)

    def _current(self, message_id: str) -> TaskResult | None:
        found = self._state.records.get(message_id)
        if found is None or found[1] <= time.time():
            return None
        return found[0]

    def wait(self, message_id: str, timeout: float | None) -> TaskResult | None:
        deadline = None if timeout is None else time.monotonic() + timeout
        with self._state.changed:
            while True:
                record = self._current(message_id)
                if record is not None and record.final:
                    return record
                left = None if deadline is None else deadline - time.monotonic()
                if left is not None and left <= 0:
                    return record
                self._state.changed.wait(left)
