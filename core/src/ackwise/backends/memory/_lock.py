"""The leader lock of ``memory://`` apps (docs/periodic.md): one process only (tests and
single-process apps)."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

from ackwise.backends.memory._named import Named
from ackwise.contract._spi import BrokerURL
from ackwise.errors import InvalidBrokerURL
from ackwise.stores._locks import KEEP_FIRES, Claim, LeaderLock, LockInfo

__all__ = ["MemoryLeaderLock"]


@dataclass
class _MemoryState:
    token: str | None = None
    fence: int = 0
    expires_at: float = 0.0
    owner: str = ""


class _MemoryStore:
    def __init__(self) -> None:
        self.mutex = threading.Lock()
        self.locks: dict[str, _MemoryState] = {}
        #: (lock, schedule) -> {fire time: fencing number of the holder that claimed it}
        self.fires: dict[tuple[str, str], dict[int, int]] = {}


_memory_stores: Named[_MemoryStore] = Named(_MemoryStore)


class MemoryLeaderLock(LeaderLock):
    """An in-process lock store per ``memory://name`` (tests and single-process apps)."""

    def __init__(self, url: BrokerURL, *, clock: Callable[[], float] = time.monotonic) -> None:
        super().__init__(url)
        if url.query:
            raise InvalidBrokerURL(f"memory:// takes no options, got {sorted(url.query)} in {url}")
        self._store = _memory_stores.get(url.in_process_name)
        self.clock = clock

    def _held(self, name: str, token: str, now: float) -> _MemoryState | None:
        state = self._store.locks.get(name)
        if state is None or state.token != token or state.expires_at <= now:
            return None
        return state

    def acquire(self, name: str, token: str, ttl: float, owner: str) -> int | None:
        with self._store.mutex:
            now = self.clock()
            state = self._store.locks.setdefault(name, _MemoryState())
            if state.token is not None and state.expires_at > now:
                return None
            state.token, state.fence = token, state.fence + 1
            state.expires_at, state.owner = now + ttl, owner
            return state.fence

    def renew(self, name: str, token: str, ttl: float) -> bool:
        with self._store.mutex:
            now = self.clock()
            state = self._held(name, token, now)
            if state is None:
                return False
            state.expires_at = now + ttl
            return True

    def release(self, name: str, token: str) -> bool:
        with self._store.mutex:
            state = self._store.locks.get(name)
            if state is None or state.token != token:
                return False
            state.token, state.expires_at, state.owner = None, 0.0, ""
            return True

    def claim(self, name: str, token: str, schedule: str, fire_time: int) -> Claim:
        with self._store.mutex:
            state = self._held(name, token, self.clock())
            if state is None:
                return Claim.NOT_HOLDER
            fires = self._store.fires.setdefault((name, schedule), {})
            if fire_time in fires:
                return Claim.TAKEN
            fires[fire_time] = state.fence
            if len(fires) > KEEP_FIRES:
                for old in sorted(fires)[:-KEEP_FIRES]:
                    del fires[old]
            return Claim.CLAIMED

    def claimed_by(self, name: str, schedule: str, fire_time: int) -> int | None:
        with self._store.mutex:
            return self._store.fires.get((name, schedule), {}).get(fire_time)

    def last_fires(self, name: str) -> dict[str, int]:
        with self._store.mutex:
            return {s: max(f) for (n, s), f in self._store.fires.items() if n == name and f}

    def delete(self, name: str) -> None:
        with self._store.mutex:
            self._store.locks.pop(name, None)
            for key in [k for k in self._store.fires if k[0] == name]:
                del self._store.fires[key]

    def info(self, name: str) -> LockInfo | None:
        with self._store.mutex:
            state = self._store.locks.get(name)
            now = self.clock()
            if state is None or state.token is None or state.expires_at <= now:
                return None
            return LockInfo(name, state.owner, state.fence, state.expires_at - now)
