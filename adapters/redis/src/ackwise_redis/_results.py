"""The task result store in Redis (``App(result_store="redis://…")``, the default on Redis).

A record is one string ``{<prefix>:result:<id>}`` (JSON) that expires with the store's TTL,
written by ``lua/result_put.lua`` (a success is never replaced), which also publishes the new
state on a channel of the key's name: ``wait`` subscribes on a connection of its own, then
reads, then sleeps until a publish wakes it (no polling).
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Callable, Iterator, Sequence

from ackwise.spi import ResultStore, TaskResult
from ackwise_redis._connection import load_script
from ackwise_redis._store import RedisStoreBase

__all__ = ["RedisResultStore"]

_PUT = load_script("result_put")


class RedisResultStore(RedisStoreBase, ResultStore):
    """A :class:`ackwise.ResultStore` in Redis; see the module documentation."""

    scheme = "redis"

    def _key(self, message_id: str) -> str:
        return f"{{{self.settings.prefix}:result:{message_id}}}"

    def put(self, records: Sequence[TaskResult]) -> None:
        ttl = str(max(1, math.ceil(self.ttl * 1000)))
        with self._mutex, self._link.errors():
            for r in records:
                self._link.eval(_PUT, [self._key(r.id)], [r.to_json(), r.state, ttl])

    def forget(self, message_ids: Sequence[str]) -> None:
        if message_ids:
            keys = [k for m in message_ids for k in (self._key(m), self._chord(m))]
            with self._mutex, self._link.errors():
                self._link.delete(keys)

    def _chord(self, chord_id: str) -> str:
        return f"{{{self.settings.prefix}:chord:{chord_id}}}"

    def join(self, chord_id: str, member: int) -> int:
        key, ttl = self._chord(chord_id), str(max(1, math.ceil(self.ttl * 1000)))
        with self._mutex, self._link.errors():
            self._link.command("SADD", key, str(member), key=key)
            self._link.command("PEXPIRE", key, ttl, key=key)
            return int(self._link.command("SCARD", key, key=key))

    def get(self, message_id: str) -> TaskResult | None:
        with self._mutex, self._link.errors():
            key = self._key(message_id)
            raw = self._link.command("GET", key, key=key)
        return None if raw is None else TaskResult.from_json(raw)

    @contextlib.contextmanager
    def _listening(self, message_id: str) -> Iterator[Callable[[float | None], None]]:
        with self._link.errors():
            client = self._link.client()
            pubsub = client.pubsub(ignore_subscribe_messages=True)
            try:
                pubsub.subscribe(self._key(message_id))  # before the read: a write is heard

                def pause(left: float | None) -> None:
                    # At most 1 s at a time: a lost subscription costs a second, not the wait.
                    pubsub.get_message(timeout=1.0 if left is None else min(left, 1.0))

                yield pause
            finally:
                pubsub.close()
                client.close()
