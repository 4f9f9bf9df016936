"""The leader lock of ``ackwise beat`` in Redis (``redis://``, ``rediss://``, ``unix://``).

One Lua script per operation (``lua/lock_*.lua``, each with its key schema at the top); the
keys of one lock share the hash tag ``{<prefix>:beat:<lock name>}``:

``lock`` (hash, expires)
    ``token``, ``owner``, ``fence``.  ``SET NX PX`` in spirit: taken only when absent, its
    expiry set with ``PEXPIRE`` by Redis' clock; renewed and deleted only by the same token.
``fence`` (counter)
    never expires, so fencing numbers keep rising across releases and expiries.
``fires:<schedule>`` (sorted set), ``schedules`` (set)
    claimed fire times (microseconds since the epoch), the newest ``KEEP_FIRES`` kept.
``fences:<schedule>`` (hash)
    fire time -> the fencing number of the holder that claimed it, written by the claim and
    pruned with it.  Claims recorded by a version without it have no field: who made them is
    unknown (:meth:`RedisLeaderLock.claimed_by` answers ``None``).

Each lock object has its own connection (no pool, no retries inside the driver: a retried
script may already have run).  Its socket timeouts are capped by :attr:`LeaderLock.timeout`,
which the beat sets to a third of the TTL, so a leader cut off from Redis learns it within
that time and steps down.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

from ackwise.errors import ConfigurationError
from ackwise.spi import BrokerURL, Claim, LeaderLock, LockInfo
from ackwise_redis._connection import Link, Script, load_script
from ackwise_redis._url import RedisSettings, parse_redis_url

__all__ = ["KEEP_FIRES", "RedisLeaderLock"]

#: Claimed fires kept per schedule (the newest); the beat only ever needs the newest one.
KEEP_FIRES = 64


_ACQUIRE = load_script("lock_acquire")
_RENEW = load_script("lock_renew")
_RELEASE = load_script("lock_release")
_CLAIM = load_script("lock_claim")
_CLAIMED_BY = load_script("lock_claimed_by")
_LAST_FIRES = load_script("lock_last_fires")
_INFO = load_script("lock_info")
_DELETE = load_script("lock_delete")

_CLAIMS = {1: Claim.CLAIMED, 0: Claim.TAKEN, -1: Claim.NOT_HOLDER}


def _ms(seconds: float) -> int:
    # Rounded up: the store must never expire the lock before the holder's own deadline.
    return max(1, math.ceil(seconds * 1000))


class RedisLeaderLock(LeaderLock):
    """A :class:`ackwise.LeaderLock` in Redis; see the module documentation."""

    def __init__(self, url: BrokerURL) -> None:
        super().__init__(url)
        self.settings: RedisSettings = parse_redis_url(url)
        self._link = Link(self.settings)

    def __repr__(self) -> str:
        return f"<RedisLeaderLock {self.settings.where} prefix={self.settings.prefix!r}>"

    def open(self) -> None:
        self._link.timeout = self.timeout  # set between creation and open
        with self._link.errors():
            self._link.connection()

    def close(self) -> None:
        self._link.close()

    def _eval(self, script: Script, keys: Sequence[str], args: Sequence[Any]) -> Any:
        self._link.timeout = self.timeout
        with self._link.errors():
            return self._link.eval(script, keys, args)

    def _base(self, name: str) -> str:
        if not name or "{" in name or "}" in name:
            raise ConfigurationError(
                f"lock name {name!r} cannot be used with Redis: it must be non-empty and "
                "contain no braces (they delimit the keys' hash tag)"
            )
        return f"{{{self.settings.prefix}:beat:{name}}}"

    def acquire(self, name: str, token: str, ttl: float, owner: str) -> int | None:
        base = self._base(name)
        fence = self._eval(_ACQUIRE, [f"{base}:lock", f"{base}:fence"], [token, _ms(ttl), owner])
        return None if fence is None else int(fence)

    def renew(self, name: str, token: str, ttl: float) -> bool:
        base = self._base(name)
        return bool(self._eval(_RENEW, [f"{base}:lock"], [token, _ms(ttl)]))

    def release(self, name: str, token: str) -> bool:
        base = self._base(name)
        return bool(self._eval(_RELEASE, [f"{base}:lock"], [token]))

    def claim(self, name: str, token: str, schedule: str, fire_time: int) -> Claim:
        base = self._base(name)
        reply = self._eval(
            _CLAIM,
            [
                f"{base}:lock",
                f"{base}:fires:{schedule}",
                f"{base}:schedules",
                f"{base}:fences:{schedule}",
            ],
            [token, schedule, int(fire_time), KEEP_FIRES],
        )
        return _CLAIMS[int(reply)]

    def claimed_by(self, name: str, schedule: str, fire_time: int) -> int | None:
        base = self._base(name)
        reply = self._eval(
            _CLAIMED_BY,
            [f"{base}:fires:{schedule}", f"{base}:fences:{schedule}"],
            [int(fire_time)],
        )
        return None if reply is None else int(reply)

    def last_fires(self, name: str) -> dict[str, int]:
        base = self._base(name)
        flat = self._eval(_LAST_FIRES, [f"{base}:schedules"], [f"{base}:fires:"])
        return {flat[i].decode(): int(flat[i + 1]) for i in range(0, len(flat), 2)}

    def info(self, name: str) -> LockInfo | None:
        base = self._base(name)
        reply = self._eval(_INFO, [f"{base}:lock"], [])
        if reply is None:
            return None
        owner, fence, pttl = reply
        return LockInfo(
            name,
            owner.decode() if owner is not None else "?",
            int(fence),
            max(0.0, int(pttl) / 1000),
        )

    def delete(self, name: str) -> None:
        base = self._base(name)
        self._eval(
            _DELETE,
            [f"{base}:lock", f"{base}:fence", f"{base}:schedules"],
            [f"{base}:fires:", f"{base}:fences:"],
        )
