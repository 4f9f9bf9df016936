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

Each lock object has its own connection (no pool, no retries inside the driver: a retried
script may already have run).  Its socket timeouts are capped by :attr:`LeaderLock.timeout`,
which the beat sets to a third of the TTL, so a leader cut off from Redis learns it within
that time and steps down.
"""

from __future__ import annotations

import dataclasses
import hashlib
import math
import os
from collections.abc import Sequence
from dataclasses import dataclass
from importlib import resources
from typing import Any

import redis
import redis.exceptions as rx
from redis.backoff import NoBackoff
from redis.retry import Retry

from ackwise import BrokerURL, Claim, LeaderLock, LockInfo
from ackwise.errors import ConfigurationError
from ackwise_redis._errors import map_redis_errors
from ackwise_redis._url import RedisSettings, parse_redis_url

__all__ = ["KEEP_FIRES", "RedisLeaderLock"]

#: Claimed fires kept per schedule (the newest); the beat only ever needs the newest one.
KEEP_FIRES = 64


@dataclass(frozen=True)
class _Script:
    source: bytes
    sha: str


def _script(name: str) -> _Script:
    source = resources.files("ackwise_redis").joinpath(f"lua/{name}.lua").read_bytes()
    return _Script(source, hashlib.sha1(source).hexdigest())


_ACQUIRE = _script("lock_acquire")
_RENEW = _script("lock_renew")
_RELEASE = _script("lock_release")
_CLAIM = _script("lock_claim")
_LAST_FIRES = _script("lock_last_fires")
_INFO = _script("lock_info")

_CLAIMS = {1: Claim.CLAIMED, 0: Claim.TAKEN, -1: Claim.NOT_HOLDER}


def _ms(seconds: float) -> int:
    # Rounded up: the store must never expire the lock before the holder's own deadline.
    return max(1, math.ceil(seconds * 1000))


class RedisLeaderLock(LeaderLock):
    """A :class:`ackwise.LeaderLock` in Redis; see the module documentation."""

    def __init__(self, url: BrokerURL) -> None:
        super().__init__(url)
        self.settings: RedisSettings = parse_redis_url(url)
        self._conn: Any = None
        self._pid = 0

    def __repr__(self) -> str:
        return f"<RedisLeaderLock {self.settings.where} prefix={self.settings.prefix!r}>"

    def _errors(self) -> Any:
        return map_redis_errors(self.settings.where, self.settings.password)

    def open(self) -> None:
        if self._conn is not None and self._pid == os.getpid():
            return
        self._conn = None  # inherited through fork(): never touch the parent's socket
        s = self.settings
        if self.timeout is not None:
            s = dataclasses.replace(
                s,
                socket_timeout=min(s.socket_timeout, self.timeout),
                socket_connect_timeout=min(s.socket_connect_timeout, self.timeout),
            )
        kwargs = s.connection_kwargs()
        kwargs["retry"] = Retry(NoBackoff(), 0)
        kwargs["protocol"] = 2
        cls: Any
        if s.scheme == "unix":
            cls = redis.UnixDomainSocketConnection
        elif s.scheme == "rediss":
            cls = redis.SSLConnection
        else:
            cls = redis.Connection
        conn = cls(**kwargs)
        try:
            with self._errors():
                conn.connect()
        except BaseException:
            conn.disconnect()
            raise
        self._conn, self._pid = conn, os.getpid()

    def close(self) -> None:
        conn, self._conn = self._conn, None
        if conn is not None and self._pid == os.getpid():
            try:
                conn.disconnect()
            except Exception:  # closing a broken socket
                pass

    def _eval(self, script: _Script, keys: Sequence[str], args: Sequence[Any]) -> Any:
        if self._conn is None or self._pid != os.getpid():
            self.open()
        conn = self._conn
        with self._errors():
            try:
                try:
                    conn.send_command("EVALSHA", script.sha, len(keys), *keys, *args)
                    return conn.read_response()
                except rx.NoScriptError:
                    # NOSCRIPT: the script did not run, so loading it and running it again
                    # cannot run it twice.
                    conn.send_command("SCRIPT", "LOAD", script.source)
                    conn.read_response()
                    conn.send_command("EVALSHA", script.sha, len(keys), *keys, *args)
                    return conn.read_response()
            except (rx.ConnectionError, rx.TimeoutError, OSError):
                # A late reply must never be read as the answer to the next command.
                conn.disconnect()
                raise

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
            [f"{base}:lock", f"{base}:fires:{schedule}", f"{base}:schedules"],
            [token, schedule, int(fire_time), KEEP_FIRES],
        )
        return _CLAIMS[int(reply)]

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
