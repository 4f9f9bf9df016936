"""Looking into a queue: stats, the dead letters (listed, replayed, deleted by stream
sequence), purge, deletion and the list of queues."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Sequence
from typing import Any

from ackwise.spi import DeadLetter, QueueStats
from ackwise_nats._client import Client, StoredMsg
from ackwise_nats._connection import Connection
from ackwise_nats._errors import JetStreamError
from ackwise_nats._headers import H_ATTEMPT, H_DEAD_AT, H_ID, H_REASON
from ackwise_nats._names import READY_CONSUMER, QueueNames, decode

__all__ = ["Browser"]

#: JetStream's "stream not found" and "consumer not found".
_MISSING = (10059, 10014)
_DEAD_HEADERS = (H_REASON, H_DEAD_AT, H_ATTEMPT, "Nats-Msg-Id")


def _missing(exc: JetStreamError) -> bool:
    return exc.code == 404 and exc.err_code in _MISSING


class Browser:
    """Stats, dead letters, purge, deletion and the list of queues."""

    def __init__(self, connection: Connection) -> None:
        self._connection = connection
        self.settings = connection.settings

    # -- stats -----------------------------------------------------------------------------
    def stats(self, queue: str) -> QueueStats:
        result: QueueStats = self._connection.call(
            "stats", queue, self._stats, self._connection.names(queue)
        )
        return result

    async def _stats(self, client: Client, names: QueueNames) -> QueueStats:
        try:
            info, consumer = await asyncio.gather(
                client.api(f"STREAM.INFO.{names.stream}", {"subjects_filter": names.delayed}),
                client.api(f"CONSUMER.INFO.{names.stream}.{READY_CONSUMER}"),
            )
        except JetStreamError as exc:
            if not _missing(exc):
                raise
            return QueueStats(names.queue, 0, 0, 0, await self._dead_count(client, names), 0.0)
        delayed = int((info["state"].get("subjects") or {}).get(names.delayed, 0))
        ready = int(consumer["num_pending"])
        oldest = 0.0
        if ready:
            first = await client.get_msg(
                names.stream,
                {"seq": int(consumer["delivered"]["stream_seq"]) + 1, "next_by_subj": names.ready},
            )
            if first is not None:
                oldest = max(0.0, time.time() - first.time)
        return QueueStats(
            queue=names.queue,
            ready=ready,
            delayed=delayed,
            in_flight=int(consumer["num_ack_pending"]),
            dead=await self._dead_count(client, names),
            oldest_age=oldest,
        )

    @staticmethod
    async def _dead_count(client: Client, names: QueueNames) -> int:
        try:
            info = await client.api(f"STREAM.INFO.{names.dead_stream}")
        except JetStreamError as exc:
            if _missing(exc):
                return 0
            raise
        return int(info["state"]["messages"])

    # -- dead letters ----------------------------------------------------------------------
    @staticmethod
    async def _scan(
        client: Client, stream: str, subject: str, first: int = 1, limit: int | None = None
    ) -> list[StoredMsg]:
        """The messages of ``subject`` from sequence ``first`` on, oldest first."""
        out: list[StoredMsg] = []
        seq = first
        while limit is None or len(out) < limit:
            try:
                m = await client.get_msg(stream, {"seq": seq, "next_by_subj": subject})
            except JetStreamError as exc:
                if _missing(exc):
                    break
                raise
            if m is None:
                break
            out.append(m)
            seq = m.seq + 1
        return out

    @staticmethod
    def _dead_id(m: StoredMsg) -> str:
        return m.headers.get(H_ID) or f"corrupt-{m.seq}"

    def dead_letters(self, queue: str, *, limit: int = 100) -> Sequence[DeadLetter]:
        names = self._connection.names(queue)
        found: list[StoredMsg] = self._connection.call(
            "dead_letters", queue, self._scan, names.dead_stream, names.dead, 1, limit
        )
        out = []
        for m in found:
            try:
                dead_at = float(m.headers.get(H_DEAD_AT, ""))
            except ValueError:
                dead_at = m.time
            attempt = m.headers.get(H_ATTEMPT, "1")
            out.append(
                DeadLetter(
                    queue=queue,
                    message_id=self._dead_id(m),
                    body=m.data,
                    reason=m.headers.get(H_REASON, "unknown"),
                    dead_at=dead_at,
                    attempt=int(attempt) if attempt.isdigit() else 1,
                )
            )
        return out

    def requeue_dead(self, queue: str, message_ids: Sequence[str]) -> int:
        count: int = self._connection.call(
            "requeue_dead", queue, self._requeue, self._connection.names(queue), message_ids
        )
        return count

    async def _requeue(self, client: Client, names: QueueNames, ids: Sequence[str]) -> int:
        wanted = set(ids)
        dead = await self._scan(client, names.dead_stream, names.dead)
        count = 0
        for m in dead:
            if self._dead_id(m) not in wanted:
                continue
            headers = {k: v for k, v in m.headers.items() if k not in _DEAD_HEADERS}
            # Deduplicated by the dead letter's sequence: replayed once even when a crash
            # between the copy and the delete makes a second replay copy it again.
            headers["Nats-Msg-Id"] = f"replay-{m.seq}"
            await client.publish_all([(names.ready, m.data, headers)])
            if await self._delete(client, names.dead_stream, m.seq):
                count += 1
        return count

    @staticmethod
    async def _delete(client: Client, stream: str, seq: int) -> bool:
        try:
            answer = await client.api(f"STREAM.MSG.DELETE.{stream}", {"seq": seq})
        except JetStreamError as exc:
            if exc.code in (400, 404):  # gone already (another replay or delete)
                return False
            raise
        return bool(answer.get("success"))

    def delete_dead(self, queue: str, message_ids: Sequence[str] | None = None) -> int:
        count: int = self._connection.call(
            "delete_dead", queue, self._delete_dead, self._connection.names(queue), message_ids
        )
        return count

    async def _delete_dead(
        self, client: Client, names: QueueNames, ids: Sequence[str] | None
    ) -> int:
        if ids is None:
            return await self._purge(client, names.dead_stream, {})
        wanted = set(ids)
        count = 0
        for m in await self._scan(client, names.dead_stream, names.dead):
            if self._dead_id(m) in wanted and await self._delete(client, names.dead_stream, m.seq):
                count += 1
        return count

    # -- purge and deletion ----------------------------------------------------------------
    @staticmethod
    async def _purge(client: Client, stream: str, request: dict[str, Any]) -> int:
        try:
            answer = await client.api(f"STREAM.PURGE.{stream}", request)
        except JetStreamError as exc:
            if _missing(exc):
                return 0
            raise
        return int(answer.get("purged", 0))

    def purge(self, queue: str) -> int:
        count: int = self._connection.call(
            "purge", queue, self._purge_queue, self._connection.names(queue)
        )
        return count

    async def _purge_queue(self, client: Client, names: QueueNames) -> int:
        count = await self._purge(client, names.stream, {"filter": names.delayed})
        try:
            consumer = await client.api(f"CONSUMER.INFO.{names.stream}.{READY_CONSUMER}")
        except JetStreamError as exc:
            if _missing(exc):
                return count
            raise
        if int(consumer["num_ack_pending"]) == 0:
            return count + await self._purge(client, names.stream, {"filter": names.ready})
        # Messages in flight stay: only those past the consumer's delivered sequence go.
        first = int(consumer["delivered"]["stream_seq"]) + 1
        for m in await self._scan(client, names.stream, names.ready, first):
            if await self._delete(client, names.stream, m.seq):
                count += 1
        return count

    def delete_queue(self, queue: str) -> None:
        self._connection.call(
            "delete_queue", queue, self._delete_queue, self._connection.names(queue)
        )

    async def _delete_queue(self, client: Client, names: QueueNames) -> None:
        for stream in (names.stream, names.dead_stream):
            try:
                await client.api(f"STREAM.DELETE.{stream}")
            except JetStreamError as exc:
                if not _missing(exc):
                    raise

    def queues(self) -> Sequence[str]:
        names: list[str] = self._connection.call("queues", None, self._queues)
        return names

    async def _queues(self, client: Client) -> list[str]:
        prefix = self.settings.prefix
        out: list[str] = []
        offset = 0
        while True:
            answer = await client.api(
                "STREAM.NAMES", {"subject": f"{prefix}.q.*.ready", "offset": offset}
            )
            streams = answer.get("streams") or []
            for stream in streams:
                if stream.startswith(f"{prefix}-q-"):
                    name = decode(stream[len(prefix) + 3 :])
                    if name is not None:
                        out.append(name)
            offset += len(streams)
            if not streams or offset >= int(answer.get("total", 0)):
                return sorted(out)
