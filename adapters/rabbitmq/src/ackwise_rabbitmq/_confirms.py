"""Confirmed publishing on the connection's publishing channel: its confirm state, and the
stream of publish calls whose messages go out while earlier ones await their confirms.

Owned by the I/O thread (:class:`~ackwise_rabbitmq._io.IOThread` holds one), as the channel
is: every method runs on the I/O thread, or on a caller that holds the connection.  What the
messages are and where they go is the publisher's (:mod:`ackwise_rabbitmq._publish`); this
module only sends frames, counts confirms and says how each call ended.

Every publish is ``mandatory``: a message that no queue took comes back, and its call raises
``QueueNotFound``.  A message refused because its exchange (a delay tier) was deleted since
this adapter declared it closes the channel; what RabbitMQ certainly did not store is reported
as :class:`NotStored`, which the publisher sends again once the tiers are declared again.
(Another call's messages sent on the same channel before the refused one, and not yet
confirmed when it closed, are in doubt: that call raises ``TransientAdapterError`` as for any
channel closed under it.)
"""

from __future__ import annotations

import re
import time
from collections.abc import Callable, Sequence
from typing import Any

import pika.spec
from pika.adapters.blocking_connection import BlockingChannel, BlockingConnection
from pika.exceptions import ShortStringTooLong

from ackwise.errors import PermanentAdapterError, QueueNotFound, TransientAdapterError
from ackwise_rabbitmq import _pika_private
from ackwise_rabbitmq._calls import Publish, _Call
from ackwise_rabbitmq._frames import publish_frames
from ackwise_rabbitmq._url import RabbitMQSettings

__all__ = ["Confirms", "NotStored"]

#: RabbitMQ's reason for closing a channel on a publish to an exchange that does not exist.
_NO_EXCHANGE = re.compile(r"no exchange '(.*)' in vhost")


class NotStored(TransientAdapterError):
    """RabbitMQ certainly did not store ``items`` (a delay tier they needed was missing, or
    they came after such a message on the channel it closed): they can be sent again as they
    are, once the tiers are declared, without a duplicate."""

    def __init__(self, message: str, items: Sequence[Publish]) -> None:
        super().__init__(message)
        self.items = list(items)


class Confirms:
    """The publishing channel of the current connection and its confirm state (I/O thread)."""

    def __init__(self, settings: RabbitMQSettings) -> None:
        self.settings = settings
        self._ch: BlockingChannel | None = None
        self._seq = 0
        self._unconfirmed: set[int] = set()
        self._nacked: set[int] = set()
        self._returned: list[tuple[str, str]] = []  # (message id, why), of this stream
        #: Why RabbitMQ closed the publishing channel: (reply code, reply text).
        self._publish_closed: tuple[int, str] | None = None

    def watch(self, ch: BlockingChannel) -> None:
        """Make ``ch`` a publishing channel: confirms and returns reach their callbacks."""
        self._publish_closed = None
        _pika_private.watch_publishing(ch, self._on_confirm, self._on_return)
        _pika_private.on_channel_close(ch, self._on_publish_closed)

    def begin(self, ch: BlockingChannel) -> None:
        """A new connection is up, ``ch`` its publishing channel (watched): sequence numbers
        start again."""
        self._ch = ch
        self._seq = 0
        self._unconfirmed.clear()
        self._nacked.clear()

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
    def stream(
        self,
        conn: BlockingConnection,
        calls: Sequence[_Call],
        more: Callable[[], Sequence[_Call]],
        taking: Callable[[], bool],
        queued: Callable[[], bool],
    ) -> None:
        """Publish the messages of ``calls`` (publish calls, :class:`~._calls._Call`) on
        ``conn``, and of those :meth:`more` hands over while earlier ones await their confirms
        (while ``taking()``; ``queued()``: a publish call waits to be handed over): each call
        is completed the moment its own messages are confirmed, with its own outcome (I/O
        thread, or the caller that holds the connection).  Confirms of several calls share
        round trips, and a call never waits for one sent after it."""
        ch = self._ch
        if ch is None or not ch.is_open:
            ch = self._ch = conn.channel()
            self.watch(ch)
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
                            or (taking() and queued())
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
        """How one call of :meth:`stream` ended: its messages ``items``, their sequence
        numbers ``span``; ``refused_at``: the channel closed on that message's missing
        exchange (:meth:`_refused_at`)."""
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
        for i, (exchange, _key, _body, props) in enumerate(items):
            message_id = str(props.message_id)
            if first + i in unsent or message_id not in returned:
                continue
            if exchange:  # a delay tier (the adapter's other publishes use the default one)
                unsent.add(first + i)
            else:
                # The queue was deleted since, maybe: the publisher has declare() declare it
                # again (:meth:`~ackwise_rabbitmq._publish.Publisher.publish_tiered`).
                lost.append(message_id)
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
            return NotStored(
                f"{self.settings.where}: RabbitMQ did not store {len(unsent)} message(s): a "
                "delay tier they needed does not exist (deleted since this process declared "
                "it?); nothing of them was stored",
                [item for i, item in enumerate(items) if first + i in unsent],
            )
        return None
