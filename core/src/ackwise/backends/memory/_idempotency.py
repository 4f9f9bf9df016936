"""The idempotency store of ``memory://`` apps (docs/idempotency.md): keys in the process."""

from __future__ import annotations

import threading
import time
from collections.abc import Sequence

from ackwise.backends.memory._named import Named
from ackwise.stores._idempotency import ClaimResult, IdempotencyStore, KeyState

__all__ = ["MemoryIdempotencyStore"]


class _MemoryState:
    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.keys: dict[str, tuple[str, str | None, float]] = {}  # key -> (status, holder, until)


_memory: Named[_MemoryState] = Named(_MemoryState)


class MemoryIdempotencyStore(IdempotencyStore):
    """In-process store for ``memory://`` apps (shared by every store of the same name)."""

    scheme = "memory"

    def open(self) -> None:
        self._state = _memory.get(self.url.in_process_name)

    def close(self) -> None:
        pass

    def claim(self, key: str, holder: str, lease: float) -> ClaimResult:
        now = time.time()
        with self._state.lock:
            current = self._state.keys.get(key)
            if current is not None:
                status, _, until = current
                if status == "done" and until > now:
                    return ClaimResult(KeyState.DONE)
                if status == "running" and until > now:
                    return ClaimResult(KeyState.BUSY, until - now)
            self._state.keys[key] = ("running", holder, now + lease)
            return ClaimResult(KeyState.RUN)

    def extend(self, claims: Sequence[tuple[str, str]], lease: float) -> None:
        until = time.time() + lease
        with self._state.lock:
            for key, holder in claims:
                current = self._state.keys.get(key)
                if current and current[0] == "running" and current[1] == holder:
                    self._state.keys[key] = ("running", holder, until)

    def complete(self, key: str, holder: str) -> None:
        with self._state.lock:
            self._state.keys[key] = ("done", None, time.time() + self.done_ttl)

    def release(self, key: str, holder: str) -> None:
        with self._state.lock:
            current = self._state.keys.get(key)
            if current and current[0] == "running" and current[1] == holder:
                del self._state.keys[key]

    def forget(self, keys: Sequence[str]) -> None:
        with self._state.lock:
            for key in keys:
                self._state.keys.pop(key, None)
