"""The rate limiter of ``memory://`` apps (docs/rate-limits.md): start times in the process."""

from __future__ import annotations

import threading
import time

from ackwise.stores._ratelimit import RateLimiter, next_slot, start_wait

__all__ = ["MemoryRateLimiter"]

_memory: dict[str, dict[str, float]] = {}  # name -> key -> next free start (monotonic)
_memory_starts: dict[str, dict[str, float]] = {}  # name -> key -> last start (monotonic)
_memory_lock = threading.Lock()


class MemoryRateLimiter(RateLimiter):
    """For ``memory://`` apps: shared by every limiter of the same name in the process."""

    scheme = "memory"

    def open(self) -> None:
        name = self.url.in_process_name
        with _memory_lock:
            self._slots = _memory.setdefault(name, {})
            self._starts = _memory_starts.setdefault(name, {})

    def close(self) -> None:
        pass

    def reserve(self, key: str, interval: float) -> float:
        with _memory_lock:
            wait, self._slots[key] = next_slot(self._slots.get(key), time.monotonic(), interval)
        return wait

    def start(self, key: str, interval: float, margin: float = 0.0) -> float:
        with _memory_lock:
            now = time.monotonic()
            wait = start_wait(self._starts.get(key), now, interval)
            if wait == 0.0:
                begun = now + margin
                self._starts[key] = begun
                self._slots[key] = max(self._slots.get(key, now), begun + interval)
        return wait

    def forget(self, key: str) -> None:
        with _memory_lock:
            self._slots.pop(key, None)
            self._starts.pop(key, None)
