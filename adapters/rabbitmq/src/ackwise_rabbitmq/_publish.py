"""Publishing: messages routed into a queue or its delay tiers, pipelined, and confirmed.

Every publish is ``mandatory`` and returns only once the broker confirmed every message of the
batch (one round trip for it); a message that no queue took raises ``QueueNotFound``.  See the
adapter's overview (:mod:`ackwise_rabbitmq._adapter`), **Delays**.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Sequence
from typing import Any

import pika
import pika.spec
from pika.adapters.blocking_connection import BlockingChannel

from ackwise import BrokerURL, Outgoing
from ackwise.errors import (
    MessageTooLarge,
    PermanentAdapterError,
    QueueNotFound,
    TransientAdapterError,
)
from ackwise_rabbitmq import _pika_private
from ackwise_rabbitmq._calls import Publish, _Call
from ackwise_rabbitmq._messages import H_ATTEMPT, H_DEAD_AT, H_REASON, MAX_MESSAGE_SIZE
from ackwise_rabbitmq._topology import MAX_DELAY_MS, _bits, _Topology


class _Publishing(_Topology):
    """Confirmed publishing on the connection's publishing channel (its confirm state: the
    I/O thread's)."""

    def __init__(self, url: BrokerURL) -> None:
        super().__init__(url)
        # Owned by the I/O thread:
        self._seq = 0
        self._unconfirmed: set[int] = set()
        self._nacked: set[int] = set()
        self._returned: list[tuple[str, str]] = []  # (message id, why), of this stream

    def _begin_generation(self) -> None:
        self._seq = 0
        self._unconfirmed.clear()
        self._nacked.clear()
        super()._begin_generation()

    def _watch_publishing(self, ch: BlockingChannel) -> None:
        _pika_private.watch_publishing(ch, self._on_confirm, self._on_return)

    # -- callbacks (I/O thread) ------------------------------------------------------------
    def _on_confirm(self, frame: Any) -> None:
        method = frame.method
        tag = method.delivery_tag
        done = {t for t in self._unconfirmed if t <= tag} if method.multiple else {tag}
        self._unconfirmed -= done
        if isinstance(method, pika.spec.Basic.Nack):
            self._nacked |= done

    def _on_return(self, _ch: Any, method: Any, properties: Any, _body: bytes) -> None:
        self._returned.append((str(properties.message_id), str(method.reply_text)))

    # -- publishing (I/O thread) -----------------------------------------------------------
    def _publish_stream(
        self,
        calls: Sequence[_Call],
        more: Callable[[], Sequence[_Call]],
        taking: Callable[[], bool],
    ) -> None:
        """Publish the messages of ``calls`` (publish calls, :class:`~._io._Call`), and of
        those :meth:`more` hands over while earlier ones await their confirms (while
        ``taking()``): each call is completed the moment its own messages are confirmed, with
        its own outcome (I/O thread, or the caller that holds the connection).  Confirms of
        several calls share round trips, and a call never waits for one sent after it."""
        ch = self._publish_ch
        conn = self._conn
        assert conn is not None
        if ch is None or not ch.is_open:
            ch = self._publish_ch = conn.channel()
            self._watch_publishing(ch)
            self._seq = 0
            self._unconfirmed.clear()
        self._returned.clear()
        timeout = self.settings.confirm_timeout
        inflight: list[tuple[_Call, set[int], float]] = []

        def send(batch: Sequence[_Call]) -> None:
            deadline = time.monotonic() + timeout
            for call in batch:
                first = self._seq + 1
                for exchange, key, body, props in call.publish or ():
                    _pika_private.send_publish(ch, exchange, key, body, props, mandatory=True)
                    self._seq += 1
                    self._unconfirmed.add(self._seq)
                inflight.append((call, set(range(first, self._seq + 1)), deadline))

        def settled() -> bool:
            return any(not (span & self._unconfirmed) for _, span, _ in inflight)

        send(calls)
        timed_out: list[bool] = []
        try:
            while inflight:
                timed_out.clear()
                left = max(0.0, min(d for *_, d in inflight) - time.monotonic())
                with _pika_private.io_timer(conn, left, lambda: timed_out.append(True)):
                    _pika_private.flush(
                        conn,
                        lambda: (
                            settled()
                            or bool(timed_out)
                            or not ch.is_open
                            or (taking() and self._publish_waiting())
                        ),
                    )
                closed, now = not ch.is_open, time.monotonic()
                returned = dict(self._returned) if self._returned else {}
                keep = []
                for call, span, deadline in inflight:
                    if not closed and span & self._unconfirmed and now < deadline:
                        keep.append((call, span, deadline))
                        continue
                    unconfirmed = span & self._unconfirmed
                    self._unconfirmed -= span
                    nacked = span & self._nacked
                    self._nacked -= span
                    if closed or unconfirmed or nacked or returned:
                        call.error = self._outcome(
                            call.publish or (), span, closed, unconfirmed, nacked, returned
                        )
                    call.done.set()
                inflight = keep
                if closed:
                    break
                if taking():
                    send(more())
        except BaseException as exc:
            for call, *_ in inflight:
                call.error = exc
                call.done.set()
            raise
        finally:
            self._returned.clear()

    def _outcome(
        self,
        items: Sequence[Publish],
        span: set[int],
        closed: bool,
        unconfirmed: set[int],
        nacked: set[int],
        returned: dict[str, str],
    ) -> BaseException | None:
        """How one call of :meth:`_publish_stream` ended: its messages ``items``, their
        sequence numbers ``span``."""
        if closed:
            return TransientAdapterError(
                f"{self.settings.where}: the publishing channel closed before RabbitMQ "
                "confirmed; whether the messages were stored is unknown"
            )
        if span & unconfirmed:
            return TransientAdapterError(
                f"{self.settings.where}: RabbitMQ did not confirm {len(span)} message(s) within "
                f"{self.settings.confirm_timeout}s; whether they were stored is unknown"
            )
        ids = sorted({str(props.message_id) for *_, props in items} & returned.keys())
        if ids:
            return QueueNotFound(
                f"{self.settings.where}: RabbitMQ could not route message(s) {', '.join(ids)} "
                f"({returned[ids[0]]}): the queue does not exist (declare it first); nothing "
                "was stored"
            )
        if span & nacked:
            return PermanentAdapterError(
                f"{self.settings.where}: RabbitMQ refused (nacked) {len(span & nacked)} message(s)"
            )
        return None

    # -- producing -------------------------------------------------------------------------
    def _properties(
        self, message_id: str, headers: dict[str, Any] | None = None, priority: int = 0
    ) -> pika.BasicProperties:
        return pika.BasicProperties(
            message_id=message_id,
            delivery_mode=2,
            timestamp=int(time.time()),
            headers=headers or None,
            priority=priority or None,
        )

    def _route(
        self, queue: str, m: Outgoing, headers: dict[str, Any] | None = None
    ) -> tuple[str, str, bytes, Any]:
        props = self._properties(m.id, headers, m.priority)
        if m.delay > 0:
            delay_ms = min(MAX_DELAY_MS, math.ceil(m.delay * 1000))
            top = delay_ms.bit_length() - 1
            return (self._aux(queue, f"delay.{top}"), _bits(delay_ms), m.body, props)
        return ("", queue, m.body, props)

    def _check(self, messages: Sequence[Outgoing]) -> None:
        for m in messages:
            if len(m.body) > MAX_MESSAGE_SIZE:
                raise MessageTooLarge(
                    f"message {m.id}: {len(m.body)} bytes exceeds the RabbitMQ broker's limit "
                    f"of {MAX_MESSAGE_SIZE}; nothing was published"
                )
            if m.delay > 0:
                self.check_delay(m.delay)
        self.check_priorities(messages)

    def publish(self, queue: str, messages: Sequence[Outgoing]) -> None:
        if not messages:
            return
        self._check_name(queue)
        self._check(messages)
        self.publish_call([self._route(queue, m) for m in messages])

    def publish_dead(self, queue: str, messages: Sequence[Outgoing], *, reason: str) -> None:
        if not messages:
            return
        self._check_name(queue)
        self._check(messages)
        now = time.time()
        dead = self._aux(queue, "dead")
        self.publish_call(
            [
                ("", dead, m.body, self._dead_props(m.id, reason, now, 1, m.priority))
                for m in messages
            ]
        )

    def _dead_props(
        self, message_id: str, reason: str, at: float, attempt: int, priority: int = 0
    ) -> Any:
        """A dead letter's properties; its priority is kept for a replay."""
        return self._properties(
            message_id, {H_REASON: reason, H_DEAD_AT: repr(at), H_ATTEMPT: attempt}, priority
        )
