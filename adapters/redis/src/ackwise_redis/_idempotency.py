"""The idempotency-key store in Redis (``App(idempotency_store="redis://…")``).

One Lua script per operation (``lua/idem_*.lua``); a key is one hash
``{<prefix>:idem:<task>:<key>}`` whose expiry is the running claim's lease (so a dead holder's
claim disappears and the next claim takes it over) or how long a done key is remembered.
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Sequence
from typing import Any

from ackwise.spi import ClaimResult, IdempotencyStore, KeyState
from ackwise_redis._connection import Script, load_script
from ackwise_redis._store import RedisStoreBase

__all__ = ["RedisIdempotencyStore"]


_CLAIM = load_script("idem_claim")
_EXTEND = load_script("idem_extend")
_COMPLETE = load_script("idem_complete")
_RELEASE = load_script("idem_release")


def _ms(seconds: float) -> int:
    return max(1, math.ceil(seconds * 1000))


class RedisIdempotencyStore(RedisStoreBase, IdempotencyStore):
    """A :class:`ackwise.IdempotencyStore` in Redis; see the module documentation."""

    scheme = "redis"

    def _key(self, key: str) -> str:
        digest = hashlib.sha1(key.encode()).hexdigest() if len(key) > 200 else key
        return f"{{{self.settings.prefix}:idem:{digest}}}"

    def _run(self, script: Script, key: str, *args: Any) -> Any:
        with self._mutex, self._link.errors():
            return self._link.eval(script, [self._key(key)], args)

    def claim(self, key: str, holder: str, lease: float) -> ClaimResult:
        state, pttl = self._run(_CLAIM, key, holder, _ms(lease))
        if state == 1:
            return ClaimResult(KeyState.DONE)
        if state == 2:
            return ClaimResult(KeyState.BUSY, max(0.0, int(pttl) / 1000.0))
        return ClaimResult(KeyState.RUN)

    def extend(self, claims: Sequence[tuple[str, str]], lease: float) -> None:
        for key, holder in claims:
            self._run(_EXTEND, key, holder, _ms(lease))

    def complete(self, key: str, holder: str) -> None:
        self._run(_COMPLETE, key, _ms(self.done_ttl))

    def release(self, key: str, holder: str) -> None:
        self._run(_RELEASE, key, holder)

    def forget(self, keys: Sequence[str]) -> None:
        with self._mutex, self._link.errors():
            for key in keys:  # one slot per key: one DEL each (a cluster takes no cross-slot DEL)
                self._link.delete([self._key(key)])
