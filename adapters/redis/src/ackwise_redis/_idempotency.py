"""The idempotency-key store in Redis (``App(idempotency_store="redis://…")``).

One Lua script per operation (``lua/idem_*.lua``); a key is one hash
``{<prefix>:idem:<task>:<key>}`` whose expiry is the running claim's lease (so a dead holder's
claim disappears and the next claim takes it over) or how long a done key is remembered.
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Sequence
from importlib import resources
from typing import Any

import redis

from ackwise import BrokerURL, ClaimResult, IdempotencyStore, KeyState
from ackwise_redis._errors import map_redis_errors
from ackwise_redis._url import RedisSettings, parse_redis_url

__all__ = ["RedisIdempotencyStore"]


def _source(name: str) -> bytes:
    return resources.files("ackwise_redis").joinpath(f"lua/{name}.lua").read_bytes()


def _ms(seconds: float) -> int:
    return max(1, math.ceil(seconds * 1000))


class RedisIdempotencyStore(IdempotencyStore):
    """A :class:`ackwise.IdempotencyStore` in Redis; see the module documentation."""

    scheme = "redis"

    def __init__(self, url: BrokerURL, **kwargs: Any) -> None:
        super().__init__(url, **kwargs)
        self.settings: RedisSettings = parse_redis_url(url)
        self._client: Any = None
        self._scripts: dict[str, Any] = {}

    def _errors(self) -> Any:
        return map_redis_errors(self.settings.where, self.settings.password)

    def open(self) -> None:
        if self._client is not None:
            return
        kwargs = self.settings.connection_kwargs()
        if self.settings.scheme == "unix":
            pool = redis.ConnectionPool(connection_class=redis.UnixDomainSocketConnection, **kwargs)
        elif self.settings.scheme == "rediss":
            pool = redis.ConnectionPool(connection_class=redis.SSLConnection, **kwargs)
        else:
            pool = redis.ConnectionPool(**kwargs)
        client = redis.Redis(connection_pool=pool)
        with self._errors():
            client.ping()
        self._client = client
        for name in ("idem_claim", "idem_extend", "idem_complete", "idem_release"):
            self._scripts[name] = client.register_script(_source(name))

    def close(self) -> None:
        client, self._client = self._client, None
        if client is not None:
            client.close()

    def _key(self, key: str) -> str:
        digest = hashlib.sha1(key.encode()).hexdigest() if len(key) > 200 else key
        return f"{{{self.settings.prefix}:idem:{digest}}}"

    def _run(self, name: str, key: str, *args: Any) -> Any:
        if self._client is None:
            self.open()
        with self._errors():
            return self._scripts[name](keys=[self._key(key)], args=list(args))

    def claim(self, key: str, holder: str, lease: float) -> ClaimResult:
        state, pttl = self._run("idem_claim", key, holder, _ms(lease))
        if state == 1:
            return ClaimResult(KeyState.DONE)
        if state == 2:
            return ClaimResult(KeyState.BUSY, max(0.0, int(pttl) / 1000.0))
        return ClaimResult(KeyState.RUN)

    def extend(self, claims: Sequence[tuple[str, str]], lease: float) -> None:
        for key, holder in claims:
            self._run("idem_extend", key, holder, _ms(lease))

    def complete(self, key: str, holder: str) -> None:
        self._run("idem_complete", key, _ms(self.done_ttl))

    def release(self, key: str, holder: str) -> None:
        self._run("idem_release", key, holder)
