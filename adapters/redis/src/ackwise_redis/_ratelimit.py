"""Task rate limits in Redis (the default on Redis; docs/rate-limits.md).

One string ``{<prefix>:rate:<key>}`` per rate-limited task: its next free start on the Redis
server's clock, moved on by ``lua/rate_reserve.lua`` in one atomic step per start.
"""

from __future__ import annotations

from ackwise import RateLimiter
from ackwise_redis._connection import load_script
from ackwise_redis._store import RedisStoreBase

__all__ = ["RedisRateLimiter"]

_RESERVE = load_script("rate_reserve")


class RedisRateLimiter(RedisStoreBase, RateLimiter):
    """A :class:`ackwise.RateLimiter` in Redis; see the module documentation."""

    scheme = "redis"

    def _key(self, key: str) -> str:
        return f"{{{self.settings.prefix}:rate:{key}}}"

    def reserve(self, key: str, interval: float) -> float:
        with self._mutex, self._link.errors():
            wait = self._link.eval(_RESERVE, [self._key(key)], [repr(float(interval))])
        return max(0.0, float(wait))

    def forget(self, key: str) -> None:
        with self._mutex, self._link.errors():
            self._link.delete([self._key(key)])
