"""Rate limits per task, shared by every worker of the broker (docs/rate-limits.md).

``@app.task(rate_limit="50/s")`` spaces the task's starts at least ``1/50`` s apart across all
workers.  The shared state is one number per task, its next free start time (the generic cell
rate algorithm, GCRA, without a burst): a worker about to start the task reserves the next free
slot in one atomic step of a :class:`RateLimiter` and starts the task when that slot comes.  A
slot reserved by a worker that then dies stays unused: a limit is never exceeded, a crash can
only leave a slot idle.  The store is the broker's own where its adapter has one (memory,
SQLite, Redis), else ``App(rate_limit_store=URL)``.
"""

from __future__ import annotations

import abc
import re
import threading
import time
from typing import ClassVar

from ackwise._spi import BrokerURL
from ackwise._sqlite_file import SQLiteStore
from ackwise.errors import ConfigurationError

__all__ = ["MemoryRateLimiter", "RateLimiter", "SQLiteRateLimiter", "parse_rate"]

_UNITS = {"s": 1.0, "m": 60.0, "h": 3600.0}
_RATE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*/\s*([smh])\s*$")


def parse_rate(rate: str | None, where: str = "rate_limit") -> float | None:
    """The interval between two starts (seconds) of ``"N/s"``, ``"N/m"`` or ``"N/h"``."""
    if rate is None:
        return None
    match = _RATE.match(rate) if isinstance(rate, str) else None
    if match is None or float(match.group(1)) <= 0:
        raise ConfigurationError(
            f"{where} must be 'N/s', 'N/m' or 'N/h' with N > 0 (e.g. '100/m'), got {rate!r}"
        )
    return _UNITS[match.group(2)] / float(match.group(1))


class RateLimiter(abc.ABC):
    """Where rate-limited tasks reserve their start times (one per broker, shared)."""

    scheme: ClassVar[str] = "?"

    def __init__(self, url: BrokerURL) -> None:
        self.url = url

    @abc.abstractmethod
    def open(self) -> None:
        """Connect to the limiter (called once, before any other method)."""

    @abc.abstractmethod
    def close(self) -> None:
        """Release the limiter's connections; safe to call twice."""

    @abc.abstractmethod
    def reserve(self, key: str, interval: float) -> float:
        """Take the next free start of ``key`` (starts ``interval`` s apart) atomically; return
        how many seconds from now it is (0: start now)."""

    @abc.abstractmethod
    def forget(self, key: str) -> None:
        """Delete what is kept for ``key`` (tests and the conformance suite clean up)."""


def next_slot(stored: float | None, now: float, interval: float) -> tuple[float, float]:
    """GCRA without burst: (seconds until the reserved start, the next free start after it)."""
    start = now if stored is None or stored < now else stored
    return start - now, start + interval


# -- in-process ----------------------------------------------------------------------------
_memory: dict[str, dict[str, float]] = {}
_memory_lock = threading.Lock()


class MemoryRateLimiter(RateLimiter):
    """For ``memory://`` apps: shared by every limiter of the same name in the process."""

    scheme = "memory"

    def open(self) -> None:
        name = self.url.in_process_name
        with _memory_lock:
            self._slots = _memory.setdefault(name, {})

    def close(self) -> None:
        pass

    def reserve(self, key: str, interval: float) -> float:
        with _memory_lock:
            wait, self._slots[key] = next_slot(self._slots.get(key), time.monotonic(), interval)
        return wait

    def forget(self, key: str) -> None:
        with _memory_lock:
            self._slots.pop(key, None)


# -- SQLite --------------------------------------------------------------------------------
_SQLITE_SCHEMA = """
CREATE TABLE IF NOT EXISTS ackwise_rate_limits (
    key   TEXT PRIMARY KEY,
    next  REAL NOT NULL          -- the next free start (unix time)
) WITHOUT ROWID
"""


class SQLiteRateLimiter(SQLiteStore, RateLimiter):
    """In the SQLite file of an embedded broker (table ``ackwise_rate_limits``); the workers
    share the host, hence its clock."""

    scheme = "sqlite"
    what = "SQLite rate limits"
    schema = (_SQLITE_SCHEMA,)

    def reserve(self, key: str, interval: float) -> float:
        with self._tx() as db:
            row = db.execute(
                "SELECT next FROM ackwise_rate_limits WHERE key = ?", (key,)
            ).fetchone()
            wait, after = next_slot(None if row is None else row[0], time.time(), interval)
            db.execute(
                "INSERT INTO ackwise_rate_limits (key, next) VALUES (?, ?) "
                "ON CONFLICT (key) DO UPDATE SET next = excluded.next",
                (key, after),
            )
        return wait

    def forget(self, key: str) -> None:
        with self._tx() as db:
            db.execute("DELETE FROM ackwise_rate_limits WHERE key = ?", (key,))
