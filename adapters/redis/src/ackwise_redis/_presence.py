"""The worker registry in Redis (the default on Redis; docs/workers.md).

One hash ``{<prefix>}:workers``: a field per worker (``host:pid``), its record as JSON.
Reading it drops the records older than ``FORGET_AFTER``; each write sets the hash to expire
``FORGET_AFTER`` after it, so a hash nobody reads does not outlive its newest record.
"""

from __future__ import annotations

import time
from collections.abc import Sequence

from ackwise.spi import WorkerInfo, WorkerRegistry
from ackwise_redis._store import RedisStoreBase

__all__ = ["RedisWorkerRegistry"]

#: Records are forgotten this long after their last write (as ackwise's own registries).
FORGET_AFTER = 3600.0
_FORGET_AFTER_MS = str(int(FORGET_AFTER * 1000))


class RedisWorkerRegistry(RedisStoreBase, WorkerRegistry):
    """A :class:`ackwise.WorkerRegistry` in Redis; see the module documentation."""

    scheme = "redis"

    @property
    def _key(self) -> str:
        return f"{{{self.settings.prefix}}}:workers"

    def beat(self, info: WorkerInfo) -> None:
        with self._mutex, self._link.errors():
            self._link.command("HSET", self._key, info.id, info.to_json(), key=self._key)
            self._link.command("PEXPIRE", self._key, _FORGET_AFTER_MS, key=self._key)

    def forget(self, worker_ids: Sequence[str]) -> None:
        if worker_ids:
            with self._mutex, self._link.errors():
                self._link.command("HDEL", self._key, *worker_ids, key=self._key)

    def workers(self) -> list[WorkerInfo]:
        with self._mutex, self._link.errors():
            raw = self._link.command("HGETALL", self._key, key=self._key)
        fields = dict(zip(raw[::2], raw[1::2], strict=True)) if isinstance(raw, list) else raw
        infos = [WorkerInfo.from_json(v) for v in fields.values()]
        old = [w.id for w in infos if w.last_seen < time.time() - FORGET_AFTER]
        if old:
            with self._mutex, self._link.errors():
                self._link.command("HDEL", self._key, *old, key=self._key)
        return sorted((w for w in infos if w.id not in old), key=lambda w: (w.started_at, w.id))
