"""A queue's keys, and the quarantine of keys that hold what ackwise never writes there.

See the adapter's overview (:mod:`ackwise_redis._adapter`): the keys of a queue, and what
happens when one of them is of the wrong Redis type.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import redis.exceptions as rx

from ackwise.errors import PermanentAdapterError
from ackwise_redis._connection import Script, load_script
from ackwise_redis._server import Server
from ackwise_redis._url import RedisSettings

__all__ = ["QueueKeys", "is_wrong_storage"]

# The adapter's one logger, named as before it was split into modules.
log = logging.getLogger("ackwise_redis._adapter")

_QUARANTINE = load_script("quarantine")


#: What each key of a queue holds (``counter``: a string of a decimal count), in field order.
_KEY_TYPES = {
    "ready": "list",
    "delayed": "zset",
    "inflight": "zset",
    "data": "hash",
    "seq": "counter",
    "notify": "list",
    "dead": "zset",
    "dead_info": "hash",
    "dead_ids": "hash",
    "early": "zset",
    "urgent": "zset",
}


@dataclass(frozen=True, slots=True)
class _Keys:
    ready: bytes
    delayed: bytes
    inflight: bytes
    data: bytes
    seq: bytes
    notify: bytes
    dead: bytes
    dead_info: bytes
    dead_ids: bytes
    early: bytes
    urgent: bytes
    #: (key, what it must hold) for every key above: what the quarantine checks.
    typed: tuple[tuple[bytes, str], ...]


def _keys(prefix: str, queue: str) -> _Keys:
    tag = f"{{{prefix}:{queue}}}"
    k = {name: f"{tag}:{name.replace('_', '-')}".encode() for name in _KEY_TYPES}
    return _Keys(**k, typed=tuple((k[name], kind) for name, kind in _KEY_TYPES.items()))


def is_wrong_storage(exc: rx.ResponseError) -> bool:
    """Did a script meet a key of the wrong type, or a seq counter that holds no count?"""
    text = str(exc)
    return "WRONGTYPE" in text or "ACKWISE_CORRUPT" in text


class QueueKeys:
    """A queue's keys by name, and the set of queue names; scripts run past a wrong-typed
    key, which is set aside."""

    def __init__(self, settings: RedisSettings, server: Server) -> None:
        self._prefix = settings.prefix
        self._server = server
        self._keys: dict[str, _Keys] = {}
        #: The set of queue names (``declare`` adds to it, ``queues`` lists it).
        self.queues_key = f"{{{settings.prefix}}}:queues".encode()

    # -- keys ------------------------------------------------------------------------------
    def run(self, script: Script, k: _Keys, keys: Sequence[bytes], args: Sequence[Any]) -> Any:
        """Run a script of the queue whose keys are ``k``, past a wrong-typed key of it.

        The failed call wrote nothing (no script writes before its checks), so it runs once more
        after the quarantine, also when another client set the key aside first.
        """
        server = self._server
        try:
            return server.eval(script, keys, args)
        except rx.ResponseError as exc:
            if not is_wrong_storage(exc):
                raise
            self.quarantine(k.typed)
        return server.eval(script, keys, args)

    def quarantine(self, typed: Sequence[tuple[bytes, str]]) -> None:
        """Rename aside the keys that hold what ackwise never writes there, one ERROR each."""
        wants = dict(typed)
        moved = self._server.eval(_QUARANTINE, list(wants), list(wants.values()))
        for i in range(0, len(moved) - 2, 3):
            key, held, aside = moved[i : i + 3]
            want = wants.get(key, "?")
            log.error(
                "Redis key %s held a %s where ackwise keeps a %s: renamed it to %s (kept for "
                "inspection; delete it when done) and went on",
                key.decode("utf-8", "backslashreplace"),
                held.decode(),
                "count" if want == "counter" else want,
                aside.decode("utf-8", "backslashreplace"),
            )

    def keys(self, queue: str) -> _Keys:
        """The Redis keys of ``queue``."""
        k = self._keys.get(queue)
        if k is None:
            if not queue or "{" in queue or "}" in queue:
                raise PermanentAdapterError(
                    f"queue name {queue!r} cannot be used with Redis: it must be non-empty and "
                    "contain no braces (they delimit the keys' hash tag)"
                )
            k = self._keys[queue] = _keys(self._prefix, queue)
        return k

    def forget(self, queue: str) -> None:
        """Forget ``queue``'s keys (its queue was deleted)."""
        self._keys.pop(queue, None)

    def registry(self, *command: Any) -> Any:
        """A command on the set of queue names, past a wrong-typed key (set aside, as queues')."""
        server, key = self._server, self.queues_key
        server.connection(key)  # the idle check first
        try:
            return server.link.command(*command, key=key)
        except rx.ResponseError as exc:
            if not is_wrong_storage(exc):
                raise
            self.quarantine(((key, "set"),))
        return server.link.command(*command, key=key)
