"""The connection: one asyncio event loop in a daemon thread of the adapter's own, a nats-py
client on it, and the few JetStream requests the adapter makes.

nats-py is asyncio-only while the SPI is synchronous: every operation is a coroutine run on
the adapter's loop with :meth:`Client.run` (``run_coroutine_threadsafe(...).result()``).  The
client never reconnects by itself: a lost connection fails the operation with
:class:`~ackwise.errors.BrokerUnavailable` and the worker reconnects (``close()``, ``open()``).
"""

from __future__ import annotations

import asyncio
import base64
import concurrent.futures
import itertools
import json
import ssl
import threading
from collections.abc import Coroutine, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any, TypeVar

import nats
from nats.aio.client import Client as NATS
from nats.aio.msg import Msg

from ackwise.errors import TransientAdapterError
from ackwise_nats._errors import JetStreamError
from ackwise_nats._url import NatsSettings

__all__ = ["Client", "Pulled", "StoredMsg", "parse_time"]

T = TypeVar("T")

_API = "$JS.API"


@dataclass(frozen=True)
class StoredMsg:
    """A message read from a stream by sequence (``STREAM.MSG.GET``)."""

    seq: int
    subject: str
    headers: dict[str, str]
    data: bytes
    time: float


@dataclass(frozen=True)
class Pulled:
    """One message of a pull: the message and its ack subject's facts."""

    msg: Msg
    stream_seq: int
    num_delivered: int
    stored_at: float  # when the stream stored it (epoch seconds)


def parse_time(text: str) -> float:
    """Epoch seconds of JetStream's RFC 3339 time with nanoseconds."""
    head, _, frac = text.rstrip("Z").partition(".")
    base = datetime.fromisoformat(head + "+00:00").timestamp()
    return base + (float("0." + frac) if frac else 0.0)


def _headers(raw: str | None) -> dict[str, str]:
    """Headers of ``STREAM.MSG.GET`` (base64 of ``NATS/1.0\\r\\nKey: value\\r\\n...``)."""
    if not raw:
        return {}
    out: dict[str, str] = {}
    for line in base64.b64decode(raw).decode("utf-8", "replace").split("\r\n")[1:]:
        key, sep, value = line.partition(":")
        if sep:
            out.setdefault(key.strip(), value.strip())
    return out


class Client:
    """The adapter's loop thread and NATS connection."""

    def __init__(self, settings: NatsSettings) -> None:
        self.settings = settings
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(
            target=self.loop.run_forever, name="ackwise-nats", daemon=True
        )
        self.thread.start()
        self.nc: NATS | None = None
        self._inbox = ""
        self._ids = itertools.count()
        self._connect_error: Exception | None = None

    # -- the loop ----------------------------------------------------------------------------
    def run(self, coro: Coroutine[Any, Any, T], timeout: float | None = None) -> T:
        """Run ``coro`` on the loop and wait for it (``timeout``: beyond the requests' own)."""
        limit = (timeout or 0.0) + 2 * self.settings.timeout + 1.0
        future = asyncio.run_coroutine_threadsafe(coro, self.loop)
        try:
            # (The coroutine's own TimeoutError comes through here too: mapped by the caller.)
            return future.result(limit)
        except concurrent.futures.TimeoutError:
            if future.done():
                raise
            future.cancel()
            raise TransientAdapterError(
                f"{self.settings.where}: no answer within {limit:.1f}s"
            ) from None

    def stop(self) -> None:
        """Close the connection and end the thread.  Idempotent."""
        if not self.thread.is_alive():
            return
        try:
            self.run(asyncio.wait_for(self._close(), 2.0), timeout=0)
        except Exception:
            pass
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(5.0)
        if not self.thread.is_alive():
            self.loop.close()

    # -- the connection ----------------------------------------------------------------------
    async def connect(self) -> None:
        s = self.settings
        tls: ssl.SSLContext | None = None
        if s.tls:
            tls = ssl.create_default_context(cafile=s.tls_ca)
        # (nats-py annotates the timeouts as int; it passes them to asyncio, floats welcome.)
        timeouts: dict[str, Any] = {
            "connect_timeout": s.connect_timeout,
            "reconnect_time_wait": 0.1,
        }
        nc = NATS()
        try:
            await nc.connect(
                servers=[s.server],
                user=s.user,
                password=s.password,
                tls=tls,
                allow_reconnect=False,
                max_reconnect_attempts=1,  # (0 would try the one server forever)
                name="ackwise",
                error_cb=self._on_error,
                **timeouts,
            )
        except nats.errors.NoServersError as exc:
            # What went wrong with the one server says more ("connection refused").
            if self._connect_error is not None:
                raise self._connect_error from exc
            raise
        if s.tls and not getattr(nc, "_server_info", {}).get("tls_required"):
            # nats-py goes on in plain text with a server that does not ask for TLS.
            await nc.close()
            raise nats.errors.SecureConnWantedError()
        self.nc = nc
        self._inbox = self.nc.new_inbox()

    async def _on_error(self, exc: Exception) -> None:
        # Reported through the operation that fails; a failed connect names this one.
        self._connect_error = exc

    async def _close(self) -> None:
        nc, self.nc = self.nc, None
        if nc is not None and not nc.is_closed:
            await nc.close()

    @property
    def conn(self) -> NATS:
        nc = self.nc
        if nc is None or nc.is_closed:
            raise nats.errors.ConnectionClosedError()
        return nc

    # -- JetStream API -----------------------------------------------------------------------
    async def api(self, subject: str, payload: dict[str, Any] | None = None) -> dict[str, Any]:
        """One JetStream API request; raises :class:`JetStreamError` on an error reply."""
        data = b"" if payload is None else json.dumps(payload).encode()
        reply = await self.conn.request(f"{_API}.{subject}", data, timeout=self.settings.timeout)
        answer: dict[str, Any] = json.loads(reply.data)
        error = answer.get("error")
        if error:
            raise JetStreamError(
                int(error.get("code", 0)),
                int(error.get("err_code", 0)),
                error.get("description", ""),
            )
        return answer

    async def get_msg(self, stream: str, payload: dict[str, Any]) -> StoredMsg | None:
        """``STREAM.MSG.GET`` (by ``seq``, or ``next_by_subj`` from it); ``None`` when none."""
        try:
            answer = await self.api(f"STREAM.MSG.GET.{stream}", payload)
        except JetStreamError as exc:
            if exc.code == 404 and exc.err_code != 10059:  # no message; 10059: no stream
                return None
            raise
        m = answer["message"]
        return StoredMsg(
            seq=int(m["seq"]),
            subject=m["subject"],
            headers=_headers(m.get("hdrs")),
            data=base64.b64decode(m.get("data") or ""),
            time=parse_time(m["time"]),
        )

    async def ack_request(self, reply: str, payload: bytes) -> None:
        """Send one ack (``+ACK``, ``-NAK``, ``+WPI``) and wait for the server's answer."""
        await self.conn.request(reply, payload, timeout=self.settings.timeout)

    async def publish_all(
        self, items: Sequence[tuple[str, bytes, dict[str, str]]]
    ) -> list[dict[str, Any]]:
        """Publish ``(subject, body, headers)`` in order, pipelined; return every PubAck.

        Raises the first error reply (:class:`JetStreamError`) after all answered.
        """
        if not items:
            return []
        nc = self.conn
        inbox = nc.new_inbox()
        answers: dict[int, asyncio.Future[Msg]] = {
            i: self.loop.create_future() for i in range(len(items))
        }

        async def on_ack(msg: Msg) -> None:
            i = int(msg.subject.rsplit(".", 1)[1])
            if i in answers and not answers[i].done():
                answers[i].set_result(msg)

        sub = await nc.subscribe(inbox + ".*", cb=on_ack)
        try:
            for i, (subject, body, headers) in enumerate(items):
                await nc.publish(subject, body, reply=f"{inbox}.{i}", headers=headers)
            await nc.flush(timeout=max(1, round(self.settings.timeout)))
            done = await asyncio.wait_for(
                asyncio.gather(*answers.values()), timeout=self.settings.timeout
            )
        finally:
            await sub.unsubscribe()
        out: list[dict[str, Any]] = []
        for (subject, _, _), msg in zip(items, done, strict=True):
            if msg.headers and msg.headers.get("Status") == "503":
                raise JetStreamError(404, 0, f"no stream takes {subject}: declare the queue first")
            answer: dict[str, Any] = json.loads(msg.data)
            error = answer.get("error")
            if error:
                raise JetStreamError(
                    int(error.get("code", 0)),
                    int(error.get("err_code", 0)),
                    error.get("description", ""),
                )
            out.append(answer)
        return out

    # -- pulls -------------------------------------------------------------------------------
    async def pull(self, stream: str, consumer: str, batch: int) -> tuple[list[Pulled], str | None]:
        """One no-wait pull of up to ``batch`` messages: what is there now, and the status that
        ended it (``None``: the batch is full; 404: nothing there; 408: fewer than asked).

        Never a waiting pull: one that expires as a redelivery comes due loses its answer on
        nats-server 2.9, and the redelivery its delivery count (the receive polls instead).
        """
        nc = self.conn
        # A subscription per request: JetStream delivers under the message's own subject, so
        # only the subscription tells which request a message answers.
        subject = f"{self._inbox}.{next(self._ids)}"
        queue: asyncio.Queue[Msg] = asyncio.Queue()

        async def on_msg(msg: Msg) -> None:
            queue.put_nowait(msg)

        sub = await nc.subscribe(subject, cb=on_msg)
        got: list[Pulled] = []
        status: str | None = None
        try:
            await nc.publish(
                f"{_API}.CONSUMER.MSG.NEXT.{stream}.{consumer}",
                json.dumps({"batch": batch, "no_wait": True}).encode(),
                reply=subject,
            )
            while len(got) < batch:
                msg = await asyncio.wait_for(queue.get(), self.settings.timeout)
                code = msg.headers.get("Status") if msg.headers else None
                if code == "100":  # idle heartbeat
                    continue
                if code is not None:
                    description = (msg.headers or {}).get("Description", "")
                    status = f"{code} {description}".strip()
                    break
                got.append(_pulled(msg))
        finally:
            await sub.unsubscribe()
            # Anything that came for this request after it ended: back to the queue at once.
            while not queue.empty():
                late = queue.get_nowait()
                if late.reply and late.reply.startswith("$JS.ACK.") and not nc.is_closed:
                    await nc.publish(late.reply, b"-NAK")
        return got, status


def _pulled(msg: Msg) -> Pulled:
    meta = msg.metadata
    return Pulled(
        msg=msg,
        stream_seq=meta.sequence.stream,
        num_delivered=meta.num_delivered,
        stored_at=meta.timestamp.timestamp(),
    )
