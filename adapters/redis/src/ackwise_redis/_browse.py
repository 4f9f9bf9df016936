"""Inspection: a queue's stats, and listing, replaying and deleting its dead letters; purging.

See the adapter's overview (:mod:`ackwise_redis._adapter`).
"""

from __future__ import annotations

from collections.abc import Sequence

from ackwise.spi import DeadLetter, QueueStats
from ackwise_redis._connection import load_script
from ackwise_redis._keys import QueueKeys
from ackwise_redis._records import _dead_letter_of, _seq_time
from ackwise_redis._server import PUBLISH_CHUNK, PURGE_CHUNK, Server, chunks

__all__ = ["Browser"]

_DEAD_LETTERS = load_script("dead_letters")
_REQUEUE_DEAD = load_script("requeue_dead", lib=True)
_DELETE_DEAD = load_script("delete_dead", lib=True)
_PURGE = load_script("purge")
_STATS = load_script("stats")


def _glob_escape(raw: bytes) -> bytes:
    """``raw`` matched literally by SCAN's glob pattern."""
    out = bytearray()
    for byte in raw:
        if byte in b"*?[]\\":
            out += b"\\"
        out.append(byte)
    return bytes(out)


class Browser:
    """Counts, dead-letter listing, replay and deletion, purging: one script call each."""

    def __init__(self, server: Server, keys: QueueKeys) -> None:
        self._server = server
        self._keys = keys

    # -- inspection ------------------------------------------------------------------------
    def stats(self, queue: str) -> QueueStats:
        k = self._keys.keys(queue)
        with self._server.errors():
            reply = self._keys.run(
                _STATS, k, (k.ready, k.delayed, k.inflight, k.dead, k.urgent), ()
            )
        ready, delayed, in_flight, dead = (int(x) for x in reply[:4])
        now = float(reply[4])
        times = [t for t in map(_seq_time, reply[5:]) if t is not None]
        oldest = min(times) if times and ready else None
        return QueueStats(
            queue,
            ready=ready,
            delayed=delayed,
            in_flight=in_flight,
            dead=dead,
            oldest_age=max(0.0, now - oldest) if oldest is not None else 0.0,
        )

    def dead_letters(self, queue: str, *, limit: int = 100) -> Sequence[DeadLetter]:
        if limit < 1:
            return []
        k = self._keys.keys(queue)
        with self._server.errors():
            reply = self._keys.run(_DEAD_LETTERS, k, (k.dead, k.data, k.dead_info), (limit,))
        return [_dead_letter_of(queue, *reply[i : i + 4]) for i in range(0, len(reply) - 3, 4)]

    def requeue_dead(self, queue: str, message_ids: Sequence[str]) -> int:
        if not message_ids:
            return 0
        k = self._keys.keys(queue)
        keys = (k.dead, k.dead_info, k.dead_ids, k.data, k.ready, k.seq, k.notify, k.urgent)
        moved = 0
        with self._server.errors():
            for chunk in chunks(list(message_ids), PUBLISH_CHUNK):
                moved += int(self._keys.run(_REQUEUE_DEAD, k, keys, chunk))
        return moved

    def delete_dead(self, queue: str, message_ids: Sequence[str] | None = None) -> int:
        k = self._keys.keys(queue)
        keys = (k.dead, k.dead_info, k.dead_ids, k.data)
        with self._server.errors():
            if message_ids is None:
                return int(self._keys.run(_DELETE_DEAD, k, keys, ("*",)))
            deleted = 0
            for chunk in chunks(list(message_ids), PUBLISH_CHUNK):
                deleted += int(self._keys.run(_DELETE_DEAD, k, keys, ("=", *chunk)))
            return deleted

    def delete_queue(self, queue: str) -> None:
        """Delete the queue's keys, any of them set aside by the quarantine, and its name."""
        k = self._keys.keys(queue)
        tag = k.ready.rsplit(b":", 1)[0]
        pattern = _glob_escape(tag) + b":*:quarantined:*"
        server = self._server
        with server.errors():
            server.connection(k.ready)
            doomed = [key for key, _ in k.typed]
            cursor = b"0"
            while True:  # in a cluster: on the node of the queue's slot, where they all are
                cursor, found = server.link.command(
                    "SCAN", cursor, "MATCH", pattern, "COUNT", 1000, key=k.ready
                )
                doomed += found
                if cursor in (b"0", 0):
                    break
            server.link.command("DEL", *doomed, key=k.ready)  # keys of one slot: one DEL
            self._keys.registry("SREM", self._keys.queues_key, queue)
        self._keys.forget(queue)

    def purge(self, queue: str) -> int:
        k = self._keys.keys(queue)
        keys = (k.ready, k.delayed, k.data, k.urgent)
        total = 0
        with self._server.errors():
            while True:
                counts = [int(n) for n in self._keys.run(_PURGE, k, keys, (PURGE_CHUNK,))]
                total += sum(counts)
                if max(counts) < PURGE_CHUNK:
                    return total
