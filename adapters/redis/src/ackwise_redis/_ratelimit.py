"""Task rate limits in Redis (the default on Redis; docs/rate-limits.md).

Two strings per rate-limited task, on the Redis server's clock: ``{<prefix>:rate:<key>}``, its
next free start, moved on by ``lua/rate_reserve.lua`` in one atomic step per reservation; and
``{<prefix>:rate:<key>}:start``, its last start, recorded by ``lua/rate_start.lua`` as an
executor begins the task.  Both expire once they no longer hold anything back.
"""

from __future__ import annotations

from ackwise.spi import RateLimiter
from ackwise_redis._connection import load_script
from ackwise_redis._store import RedisStoreBase

__all__ = ["RedisRateLimiter"]

_RESERVE = load_script("rate_reserve")
_START = load_script("rate_start")


class RedisRateLimiter(RedisStoreBase, RateLimiter):
    """A :class:`ackwise.RateLimiter` in Redis; see the module documentation."""

    scheme = "redis"

    def _key(self, key: str) -> str:
        return f"{{{self.settings.prefix}:rate:{key}}}"

    def reserve(self, key: str, interval: float) -> float:
        with self._mutex, self._link.errors():
            wait = self._link.eval(_RESERVE, [self._key(key)], [repr(float(interval))])
        return max(0.0, float(wait))

    def start(self, key: str, interval: float, margin: float = 0.0) -> float:
        name = self._key(key)
        argv = [repr(float(interval)), repr(float(margin))]
        with self._mutex, self._link.errors():
            wait = self._link.eval(_START, [name, f"{name}:start"], argv)
        return max(0.0, float(wait))

    def forget(self, key: str) -> None:
        name = self._key(key)
        with self._mutex, self._link.errors():
            self._link.delete([name, f"{name}:start"])
