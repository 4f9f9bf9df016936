"""Publishing: messages routed into a queue or its delay tiers, pipelined, and confirmed.

Every publish is ``mandatory`` and returns only once the broker confirmed every message of the
batch (one round trip for it); a message that no queue took raises ``QueueNotFound``.  See the
adapter's overview (:mod:`ackwise_rabbitmq._adapter`), **Delays**.

A delayed message needs its delay tiers, which are declared before the first publish that
needs them (:meth:`_Topology._ensure_tiers`).  This adapter remembers what it declared; when
the tiers were deleted since (``delete_queue``, by another process), RabbitMQ refuses the
publish (it closes the channel on a missing exchange, it returns a message no queue took),
never silently: the tiers are declared again and what RabbitMQ certainly did not store is sent
again (:meth:`_Publishing._publish_tiered`), so a stale memory neither loses nor duplicates a
message.  (Another call's messages sent on the same channel before the refused one, and not yet
confirmed when it closed, are in doubt: that call raises ``TransientAdapterError`` as for any
channel closed under it.)
"""

from __future__ import annotations

import math
import re
import time
from collections.abc import Callable, Sequence
from typing import Any

import pika
import pika.spec
from pika.adapters.blocking_connection import BlockingChannel
from pika.exceptions import ShortStringTooLong

from ackwise.errors import (
    MessageTooLarge,
    PermanentAdapterError,
    QueueNotFound,
    TransientAdapterError,
)
from ackwise.spi import BrokerURL, Outgoing
from ackwise_rabbitmq import _pika_private
from ackwise_rabbitmq._calls import Publish, _Call
from ackwise_rabbitmq._frames import Properties, publish_frames
from ackwise_rabbitmq._messages import H_ATTEMPT, H_DEAD_AT, H_REASON, MAX_MESSAGE_SIZE
from ackwise_rabbitmq._topology import MAX_DELAY_MS, _bits, _tier, _Topology

#: How many times a publish declares the delay tiers again after RabbitMQ found one missing.
_TIER_ATTEMPTS = 3
#: RabbitMQ's reason for closing a channel on a publish to an exchange that does not exist.
_NO_EXCHANGE = re.compile(r"no exchange '(.*)' in vhost")


def _delay_ms(delay: float) -> int:
    """A delay in whole milliseconds: rounded up (never early), at most the longest."""
    return min(MAX_DELAY_MS, math.ceil(delay * 1000))


class _NotStored(TransientAdapterError):
    """RabbitMQ certainly did not store ``items`` (a delay tier they needed was missing, or
    they came after such a message on the channel it closed): they can be sent again as they
    are, once the tiers are declared, without a duplicate."""

    def __init__(self, message: str, items: Sequence[Publish]) -> None:
        super().__init__(message)
        self.items = list(items)


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
        #: Why RabbitMQ closed the publishing channel: (reply code, reply text).
        self._publish_closed: tuple[int, str] | None = None

    def _begin_generation(self) -> None:
        self._seq = 0
        self._unconfirmed.clear()
        self._nacked.clear()
        super()._begin_generation()

    def _watch_publishing(self, ch: BlockingChannel) -> None:
        self._publish_closed = None
        _pika_private.watch_publishing(ch, self._on_confirm, self._on_return)
        _pika_private.on_channel_close(ch, self._on_publish_closed)

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

    def _on_publish_closed(self, _ch: Any, reason: BaseException) -> None:
        code = getattr(reason, "reply_code", 0)
        self._publish_closed = (int(code), str(getattr(reason, "reply_text", reason)))

    def _refused_at(self, inflight: Sequence[tuple[_Call, set[int], float]]) -> int | None:
        """The sequence number of the message RabbitMQ closed the publishing channel on, when
        it did so because that message's exchange does not exist (a delay tier deleted since
        this adapter declared it).  RabbitMQ handles a channel's publishes in order and drops
        what follows its close: the messages before it went their way, none after it did."""
        closed = self._publish_closed
        found = _NO_EXCHANGE.search(closed[1]) if closed and closed[0] == 404 else None
        if found is None:
            return None
        missing = found.group(1)
        for call, span, _ in inflight:
            if not span & self._unconfirmed:
                continue
            first = min(span)
            for i, (exchange, *_) in enumerate(call.publish or ()):
                # The first unconfirmed one (one that was confirmed went through before the
                # exchange was deleted).
                if exchange == missing and first + i in self._unconfirmed:
                    return first + i
        return None

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

        number = ch.channel_number
        most = _pika_private.body_max(ch)

        def send(batch: Sequence[_Call]) -> None:
            deadline = time.monotonic() + timeout
            for call in batch:
                first = self._seq + 1
                items = call.publish or ()
                if not items:
                    inflight.append((call, set(), deadline))
                    continue
                try:
                    data = b"".join(
                        publish_frames(number, e, k, b, p, mandatory=True, body_max=most)
                        for e, k, b, p in items
                    )
                except ShortStringTooLong as exc:  # nothing of the call was sent
                    call.error = PermanentAdapterError(
                        f"{self.settings.where}: a message id, exchange or routing key is "
                        f"longer than AMQP's 255 bytes ({exc!r}); nothing was published"
                    )
                    call.done.set()
                    continue
                _pika_private.send_frames(ch, data)
                self._seq += len(items)
                span = set(range(first, self._seq + 1))
                self._unconfirmed |= span
                inflight.append((call, span, deadline))

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
                refused_at = self._refused_at(inflight) if closed else None
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
                            call.publish or (),
                            span,
                            closed,
                            unconfirmed,
                            nacked,
                            returned,
                            refused_at,
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
        refused_at: int | None = None,
    ) -> BaseException | None:
        """How one call of :meth:`_publish_stream` ended: its messages ``items``, their
        sequence numbers ``span``; ``refused_at``: the channel closed on that message's
        missing exchange (:meth:`_refused_at`)."""
        first = min(span) if span else 0
        if closed and refused_at is None:
            return TransientAdapterError(
                f"{self.settings.where}: the publishing channel closed before RabbitMQ "
                "confirmed; whether the messages were stored is unknown"
            )
        # The messages RabbitMQ certainly did not store: from the refused one on (the channel
        # closed on it), and delayed ones that no queue took (a tier's queue deleted).
        unsent = {s for s in span if refused_at is not None and s >= refused_at}
        unknown = (span & unconfirmed) - unsent
        if unknown:
            if closed:
                return TransientAdapterError(
                    f"{self.settings.where}: the publishing channel closed before RabbitMQ "
                    f"confirmed {len(unknown)} message(s); whether they were stored is unknown"
                )
            return TransientAdapterError(
                f"{self.settings.where}: RabbitMQ did not confirm {len(span)} message(s) within "
                f"{self.settings.confirm_timeout}s; whether they were stored is unknown"
            )
        lost: list[str] = []
        for i, (exchange, key, _body, props) in enumerate(items):
            message_id = str(props.message_id)
            if first + i in unsent or message_id not in returned:
                continue
            if exchange:  # a delay tier (the adapter's other publishes use the default one)
                unsent.add(first + i)
            else:
                lost.append(message_id)
                self._declared.discard(key)  # deleted since, maybe: declare() declares it again
        if lost:
            ids = sorted(set(lost))
            return QueueNotFound(
                f"{self.settings.where}: RabbitMQ could not route message(s) {', '.join(ids)} "
                f"({returned[ids[0]]}): the queue does not exist (declare it first); nothing "
                "was stored"
            )
        if span & nacked - unsent:
            return PermanentAdapterError(
                f"{self.settings.where}: RabbitMQ refused (nacked) {len(span & nacked)} message(s)"
            )
        if unsent:
            return _NotStored(
                f"{self.settings.where}: RabbitMQ did not store {len(unsent)} message(s): a "
                "delay tier they needed does not exist (deleted since this process declared "
                "it?); nothing of them was stored",
                [item for i, item in enumerate(items) if first + i in unsent],
            )
        return None

    # -- producing -------------------------------------------------------------------------
    def _properties(
        self, message_id: str, headers: dict[str, Any] | None = None, priority: int = 0
    ) -> Properties:
        return Properties(message_id, int(time.time()), headers or None, priority)

    def _route(
        self, queue: str, m: Outgoing, headers: dict[str, Any] | None = None
    ) -> tuple[str, str, bytes, Any]:
        props = self._properties(m.id, headers, m.priority)
        if m.delay > 0:
            delay_ms = _delay_ms(m.delay)
            return (self._aux(queue, f"delay.{_tier(delay_ms)}"), _bits(delay_ms), m.body, props)
        return ("", queue, m.body, props)

    def _publish_tiered(
        self, queue: str, items: Sequence[Publish], top: int, *, io_thread: bool = False
    ) -> None:
        """Publish ``items`` (confirmed), declaring ``queue``'s delay tiers 0 to ``top``
        first unless this adapter did (``top`` -1: no delay).  What RabbitMQ did not store
        because a tier was deleted since (:class:`_NotStored`) is sent again once the tiers
        are declared again.  ``io_thread``: the caller runs on the I/O thread."""
        for _ in range(_TIER_ATTEMPTS):
            if top >= 0 and not self._has_tiers(queue, top):
                if io_thread:
                    self._declare_tiers(queue, top)
                else:
                    self._ensure_tiers(queue, top)
            try:
                if io_thread:
                    self._publish_now(items)
                else:
                    self.publish_call(items)
                return
            except _NotStored as exc:
                self._forget_tiers(queue)
                items = exc.items
        raise TransientAdapterError(
            f"{self.settings.where}: the delay tiers of queue {queue!r} were deleted again "
            f"each of {_TIER_ATTEMPTS} times they were declared (is another process deleting "
            f"the queue?); {len(items)} message(s) were not stored: publish them again"
        )

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
        delayed = [m for m in messages if m.delay > 0]
        if not delayed:
            self._publish_tiered(queue, [self._route(queue, m) for m in messages], -1)
            return
        # Delayed messages go out first (each has its own time; the others keep their order):
        # should RabbitMQ refuse one for a tier deleted since, none before it is left in doubt.
        ordered = [*delayed, *(m for m in messages if m.delay <= 0)]
        top = max(_tier(_delay_ms(m.delay)) for m in delayed)
        self._publish_tiered(queue, [self._route(queue, m) for m in ordered], top)

    def publish_dead(self, queue: str, messages: Sequence[Outgoing], *, reason: str) -> None:
        if not messages:
            return
        self._check_name(queue)
        self._check(messages)
        now = time.time()
        dead = self._aux(queue, "dead")
        self._publish_tiered(
            queue,
            [
                ("", dead, m.body, self._dead_props(m.id, reason, now, 1, m.priority))
                for m in messages
            ],
            -1,
        )

    def _dead_props(
        self, message_id: str, reason: str, at: float, attempt: int, priority: int = 0
    ) -> Any:
        """A dead letter's properties; its priority is kept for a replay."""
        return self._properties(
            message_id, {H_REASON: reason, H_DEAD_AT: repr(at), H_ATTEMPT: attempt}, priority
        )
