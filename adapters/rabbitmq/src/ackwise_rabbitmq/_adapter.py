"""``amqp://``, ``amqps://``: the RabbitMQ adapter, on pika's ``BlockingConnection``.

**Threads.**  pika's ``BlockingConnection`` is not thread-safe and sends heartbeats only while
someone runs its I/O loop.  So the adapter owns an I/O thread that holds the connection and
never stops turning its loop (``process_data_events``): heartbeats keep flowing while a long,
CPU-bound task runs in the worker's executor.  The worker's consumer thread calls the adapter;
every pika call is handed to the I/O thread (a command queue woken by
``add_callback_threadsafe``).

**Receiving**: the first ``receive`` of a queue starts a consumer (``basic.consume``) whose
window (``basic.qos``, per consumer) is what the worker asked for; the broker pushes into an
inbox on the I/O thread and ``receive`` takes from it without a round trip.  A late ack frees
a slot just as the finished task frees room in the worker, so the window tracks the worker's
prefetch budget; a budget that grows gets another consumer for the difference, never a
replacement (a quorum queue takes back, and counts as a delivery, what was on its way to a
cancelled consumer).  An early ack would free a slot while its task still runs, so
:meth:`RabbitMQAdapter.ack_before_start` cancels the full windows first (the next ``receive``
starts one with the room left); a window with room keeps its consumer, for the same reason,
and what it pushes next waits for room.  At a graceful stop,
:meth:`RabbitMQAdapter.stop_receiving` cancels the consumers and rejects what the inbox holds
back to the queue at once.  A worker reading several queues has its windows per queue.

**Topology** of a queue ``q`` (``p`` is the URL's ``prefix``, default ``ackwise``)::

    q                     the queue: durable, quorum (classic with ?queue_type=classic);
                          x-dead-letter-exchange p.q.dlx; x-delivery-limit = max_deliveries;
                          x-dead-letter-strategy at-least-once (quorum)
    p.q.dlx  → p.q.dead   dead letters: a fanout exchange and a durable classic queue
    p.q.deliver → q       a fanout exchange: the last hop of a delay
    p.q.delay.k → p.q.wait.k   delay tier k (0 ≤ k < 32): a topic exchange and a durable
                          classic queue whose messages live 2**k ms, then are dead-lettered
                          to tier k-1's exchange (tier 0: to p.q.deliver)

**Delays** are binary: a delay of ``d`` ms is published with the routing key of its 32 bits
(``"b31.b30.….b0"``) to the exchange of its highest set bit; exchange ``k`` routes a message
whose bit ``k`` is 1 into the wait queue of tier ``k`` and one whose bit is 0 straight on to
exchange ``k-1``.  Each tier has one TTL, so its queue expires in FIFO order; a message visits
only the tiers of its set bits.  Nothing is held unacked in a worker meanwhile, so a delay
longer than the broker's ``consumer_timeout`` is safe.  Resolution: 1 ms (rounded up, never
early); longest delay ``2**32 - 1`` ms (about 49.7 days).

**Receipts.**  AMQP acknowledgements are per channel: a receipt is ``(connection generation,
delivery tag)``.  A receipt from an earlier connection (it closed, so RabbitMQ requeued the
message), or one already settled, is stale: settling it raises
:class:`~ackwise.errors.StaleReceipt` and sends nothing (an unknown tag would make RabbitMQ
close the channel with every other delivery on it).

**Delivery count**: ``x-delivery-count`` of quorum queues, plus ackwise's own
``x-ackwise-deliveries`` header carried by messages that the adapter republishes (a delayed
nack); classic queues have only the ``redelivered`` flag (counted as one more delivery).

**Malformed messages** (another client's): one without a UTF-8 ``message_id``, with a
delivery-count header that is no small non-negative integer, or with headers pika cannot
decode (a timestamp past year 9999; the connection decodes such a frame without its headers)
is handed over as a corrupt delivery (:attr:`~ackwise.Delivery.corrupt`), under a stand-in id
derived from its body where it has none.

**Stats**: ``ready``, ``delayed`` and ``dead`` are exact (``queue.declare`` passive on the
queue, its wait queues and its dead-letter queue).  ``in_flight`` is exact only with the
management API (``?management=http://host:15672``), and then lags by the broker's
``collect_statistics_interval``; without it, it counts this adapter's own unsettled
deliveries.  ``oldest_age`` likewise needs the management API (0.0 without).

**Dead letters** live in a queue, so listing, replaying and deleting some of them reads the
whole dead-letter queue through a channel of its own (``basic.get``) and closes it to put back
what stays: O(size of the dead-letter queue) per call; deleting all is one ``queue.purge``.
"""

from __future__ import annotations

import base64
import collections
import functools
import hashlib
import json
import logging
import math
import struct
import threading
import time
import urllib.parse
import urllib.request
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any, TypeVar

import pika
import pika.exceptions as px
import pika.frame
import pika.spec
from pika.adapters.blocking_connection import BlockingChannel, BlockingConnection

from ackwise import (
    Adapter,
    AttemptCount,
    BrokerURL,
    Capabilities,
    DeadLetter,
    Delivery,
    LeaseExtension,
    Outgoing,
    QueueSpec,
    QueueStats,
)
from ackwise.errors import (
    AdapterError,
    BrokerUnavailable,
    MessageTooLarge,
    PermanentAdapterError,
    QueueNotFound,
    StaleReceipt,
    TransientAdapterError,
    UnsupportedCapability,
)
from ackwise_rabbitmq._errors import map_pika_errors, translate_pika_error
from ackwise_rabbitmq._url import RabbitMQSettings, parse_rabbitmq_url

__all__ = ["DELAY_TIERS", "MAX_MESSAGE_SIZE", "RabbitMQAdapter", "Receipt"]

log = logging.getLogger(__name__)

T = TypeVar("T")

#: RabbitMQ's default ``max_message_size`` (128 MiB); larger messages are refused by the broker.
MAX_MESSAGE_SIZE = 128 * 1024 * 1024
#: Delay tiers: tier k holds a message 2**k milliseconds.
DELAY_TIERS = 32
MAX_DELAY_MS = 2**DELAY_TIERS - 1

H_DELIVERIES = "x-ackwise-deliveries"
H_REASON = "x-ackwise-reason"
H_DEAD_AT = "x-ackwise-dead-at"
H_ATTEMPT = "x-ackwise-attempt"
#: RabbitMQ's delivery count (quorum queues).
H_COUNT = "x-delivery-count"
#: Stands in for the headers of a message that pika cannot decode (see ``_read_frame``).
H_UNREADABLE = "x-ackwise-unreadable-headers"
#: Delivery counts in headers are below this: a larger one is no count ackwise or RabbitMQ
#: wrote, and the attempt written back into a header must fit AMQP's 64-bit integers.
_MAX_COUNT = 2**31
#: What pika's field decoder raises on values RabbitMQ accepts from other clients (a
#: timestamp past year 9999: OverflowError or ValueError).
_FIELD_ERRORS = (ArithmeticError, ValueError, OSError, struct.error, px.InvalidFieldTypeException)

#: How long a call waits for the I/O thread beyond its own timeouts.
_CALL_SLACK = 30.0
#: A late ack is posted without waiting while the I/O loop turned this recently (seconds; the
#: loop turns at least every 0.5 s).
_FRESH_LOOP = 1.0


@dataclass(frozen=True, slots=True)
class Receipt:
    """A delivery's receipt: the connection it came on and its AMQP delivery tag."""

    generation: int
    tag: int
    #: The consumer it came through (its window is freed when the delivery is settled).
    consumer: _Consumer | None = field(default=None, compare=False, repr=False)


@dataclass(slots=True)
class _Raw:
    generation: int
    queue: str
    tag: int
    properties: Any
    body: bytes
    redelivered: bool
    consumer: _Consumer


@dataclass(slots=True, eq=False)
class _Consumer:
    """One ``basic.consume`` of a queue: its window and how much of it is in use."""

    queue: str
    tag: str
    credit: int
    outstanding: int = 0  # pushed and not settled (in the inbox or handed out)


class _Call:
    __slots__ = ("detached", "done", "error", "fn", "result")

    def __init__(self, fn: Callable[[], Any], *, detached: bool = False) -> None:
        self.fn = fn
        self.detached = detached  # nobody waits for it: its error is logged
        self.done = threading.Event()
        self.result: Any = None
        self.error: BaseException | None = None


class _ConnectionLost(Exception):
    """The consuming channel or the connection is gone: every receipt of it is stale."""


# Timers for waits inside pika's I/O loop (``_flush_output``) are the connection impl's:
# ``BlockingConnection.call_later`` callbacks run only from ``process_data_events``.


def _noop() -> None:
    pass


def _noop_frame(_frame: Any) -> None:
    pass


def _bits(delay_ms: int) -> str:
    return ".".join("1" if delay_ms >> k & 1 else "0" for k in range(DELAY_TIERS - 1, -1, -1))


# -- messages ackwise did not write ------------------------------------------------------------
def _read_frame(impl: Any) -> tuple[int, Any]:
    """pika's frame decoder, except that a content header whose headers pika cannot decode
    comes through without them, marked :data:`H_UNREADABLE`.

    Installed on the adapter's connection only.  pika raises on a header timestamp past year
    9999, which RabbitMQ accepts from any client; that raise would cost the connection and
    every delivery on it, and again at each redelivery of the same message.
    """
    try:
        frame: tuple[int, Any] = pika.frame.decode_frame(impl._frame_buffer)
    except _FIELD_ERRORS as exc:
        header = _header_without_headers(impl._frame_buffer, exc)
        if header is None:
            raise
        return header
    return frame


def _header_without_headers(buffer: bytes, error: Exception) -> tuple[int, Any] | None:
    """The content-header frame at the start of ``buffer``, its headers table left out (None:
    it is no such frame, or more than its headers is wrong)."""
    props_type = pika.spec.BasicProperties
    try:
        kind, channel, size = struct.unpack_from(">BHL", buffer)
        if kind != pika.spec.FRAME_HEADER:
            return None
        end = pika.spec.FRAME_HEADER_SIZE + size + pika.spec.FRAME_END_SIZE
        payload = bytes(buffer[pika.spec.FRAME_HEADER_SIZE : end - 1])
        body_size = struct.unpack_from(">Q", payload, 4)[0]
        encoded = payload[12:]
        flags = struct.unpack_from(">H", encoded)[0]
        # Basic's 14 properties fit one flag word: a continuation bit means something else.
        if not flags & props_type.FLAG_HEADERS or flags & 1:
            return None
        table = 2  # the headers table follows content_type and content_encoding (short strings)
        for flag in (props_type.FLAG_CONTENT_TYPE, props_type.FLAG_CONTENT_ENCODING):
            if flags & flag:
                table += 1 + encoded[table]
        after = table + 4 + struct.unpack_from(">I", encoded, table)[0]
        flags_without = struct.pack(">H", flags & ~props_type.FLAG_HEADERS)
        props = props_type().decode(flags_without + encoded[2:table] + encoded[after:])
    except (*_FIELD_ERRORS, IndexError):
        return None
    props.headers = {H_UNREADABLE: f"{type(error).__name__}: {error}"}
    return end, pika.frame.Header(channel, body_size, props)


def _count(value: object) -> int | None:
    """A delivery count as ackwise and RabbitMQ write it into a header, or None.

    pika reads an AMQP long (RabbitMQ's ``x-delivery-count``) as its own subclass of int.
    """
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value < _MAX_COUNT:
        return None
    return int(value)


def _text(value: object) -> str | None:
    """A header's text: pika gives AMQP strings as str, or as bytes when not UTF-8."""
    if isinstance(value, bytes):
        return value.decode("utf-8", "replace")
    return value if isinstance(value, str) else None


def _brief(value: object) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def _stand_in_id(body: bytes) -> str:
    """An id for a message without a usable ``message_id``: derived from the body, so that a
    dead letter is listed, replayed and deleted under the same id every time."""
    return "corrupt-" + hashlib.sha256(body).hexdigest()[:16]


def _message_id(props: Any, body: bytes) -> str:
    mid = props.message_id
    return mid if isinstance(mid, str) and mid else _stand_in_id(body)


def _malformed(props: Any, headers: dict[Any, Any]) -> str | None:
    """What makes a message one that ackwise did not write (None: nothing does)."""
    if H_UNREADABLE in headers:
        return f"its headers cannot be decoded ({headers[H_UNREADABLE]})"
    mid = props.message_id
    if mid is None or mid == "":
        return "it has no message_id property"
    if not isinstance(mid, str):
        return f"its message_id is not UTF-8 text: {_brief(mid)}"
    for name in (H_DELIVERIES, H_COUNT):
        if name in headers and _count(headers[name]) is None:
            return f"header {name} is {_brief(headers[name])}, not a delivery count"
    return None


def _attempt(headers: dict[Any, Any], redelivered: bool) -> int:
    """This delivery's count: ackwise's header plus RabbitMQ's, or the redelivered flag."""
    base = _count(headers.get(H_DELIVERIES)) or 0
    count = _count(headers.get(H_COUNT))
    if count is not None:
        return base + count + 1
    return base + (2 if redelivered else 1)


def _seconds(value: object) -> float | None:
    """A time in seconds since the epoch as a header holds it (ackwise writes text)."""
    text = _text(value)
    try:
        seconds = float(text if text is not None else value)  # type: ignore[arg-type]
    except (TypeError, ValueError, ArithmeticError):
        return None
    return seconds if math.isfinite(seconds) and seconds >= 0 else None


def _dead_reason(headers: dict[Any, Any]) -> str:
    if H_REASON in headers:
        return _text(headers[H_REASON]) or "unknown"
    # Dead-lettered by RabbitMQ itself: the delivery limit, or another reason in x-death.
    deaths = headers.get("x-death")
    first = deaths[0] if isinstance(deaths, list) and deaths else None
    native = _text(first.get("reason")) if isinstance(first, dict) else None
    return "max_deliveries" if native == "delivery_limit" else native or "unknown"


def _dead_letter_of(queue: str, props: Any, body: bytes) -> DeadLetter:
    """A message of a dead-letter queue as a :class:`DeadLetter`, whatever its properties hold."""
    headers = props.headers or {}
    dead_at = _seconds(headers.get(H_DEAD_AT))
    if dead_at is None:
        dead_at = float(props.timestamp) if isinstance(props.timestamp, int) else 0.0
    attempt = _count(headers.get(H_ATTEMPT))
    if attempt is None:
        attempt = (_count(headers.get(H_COUNT)) or 0) + 1
    return DeadLetter(
        queue=queue,
        message_id=_message_id(props, body),
        body=body,
        reason=_dead_reason(headers),
        dead_at=dead_at,
        attempt=attempt,
    )


def _dead_body(delivery: Delivery, body: bytes | None) -> bytes:
    """The body a dead letter stores: ``body`` (the annotated envelope) when the broker takes
    it, else the delivered one, which the broker took once: checked before anything is sent,
    since a refused publish would leave the delivery unsettled until the connection closes."""
    if body is None:
        return delivery.body
    if len(body) <= MAX_MESSAGE_SIZE:
        return body
    log.warning(
        "message %s on %s: its annotated dead letter is %d bytes, over RabbitMQ's limit of %d; "
        "dead-lettered with the body it was delivered with",
        delivery.message_id,
        delivery.queue,
        len(body),
        MAX_MESSAGE_SIZE,
    )
    return delivery.body


class RabbitMQAdapter(Adapter):
    """Adapter for one RabbitMQ node (or a cluster behind one address)."""

    name = "rabbitmq"
    # A quorum queue frees a window slot only once the ack went through its log: a fast
    # worker needs a deeper window than 4 x concurrency to keep busy.
    deep_prefetch = True
    capabilities = Capabilities(
        native_delay=True,
        max_delay=MAX_DELAY_MS / 1000.0,
        lease_extension=LeaseExtension.CONNECTION,
        max_lease=None,
        attempt_count=AttemptCount.EXACT,
        native_dead_letter=True,
        max_message_size=MAX_MESSAGE_SIZE,
        multi_process=True,
        # AMQP cannot look at a quorum queue's head without delivering it (a delivery
        # counts), and the management API gives quorum queues no head timestamp.
        oldest_age=False,
    )

    def __init__(self, url: BrokerURL) -> None:
        super().__init__(url)
        self.settings: RabbitMQSettings = parse_rabbitmq_url(url)
        self._lock = threading.Condition()
        self._thread: threading.Thread | None = None
        self._conn: BlockingConnection | None = None
        self._calls: collections.deque[_Call] = collections.deque()
        self._generation = 0
        self._alive = False
        self._closing = False
        self._failure: AdapterError | None = None
        self._unacked: dict[int, str] = {}  # delivery tag -> queue, of this generation
        # Pushed by a consumer, not yet taken by ``receive`` (guarded by ``_lock``):
        self._inbox: dict[str, collections.deque[_Raw]] = {}
        # queue -> its consumers (their windows add up), this generation:
        self._consumers: dict[str, list[_Consumer]] = {}
        self._declared: set[str] = set()
        self._user_closed = False
        # Owned by the I/O thread:
        self._consume_ch: BlockingChannel | None = None
        self._publish_ch: BlockingChannel | None = None
        self._admin_ch: BlockingChannel | None = None
        self._consume_closed: str | None = None
        self._qos = 0
        self._seq = 0
        self._last_turn = 0.0  # when the I/O loop last took in what the socket held
        self._unconfirmed: set[int] = set()
        self._nacked: set[int] = set()
        self._returned: list[tuple[str, str]] = []

    def __repr__(self) -> str:
        return f"<RabbitMQAdapter {self.settings.where} {self.settings.queue_type}>"

    # -- names -----------------------------------------------------------------------------
    def _aux(self, queue: str, kind: str) -> str:
        return f"{self.settings.prefix}.{queue}.{kind}"

    def _check_name(self, queue: str) -> None:
        longest = len(self._aux(queue, f"delay.{DELAY_TIERS - 1}").encode())
        if not queue or queue.startswith("amq.") or longest > 255:
            raise PermanentAdapterError(
                f"queue name {queue!r} cannot be used with RabbitMQ: it must be non-empty, not "
                "start with 'amq.', and leave room for ackwise's auxiliary names (255 bytes)"
            )

    # -- lifecycle -------------------------------------------------------------------------
    def _errors(self) -> Any:
        return map_pika_errors(self.settings.where, self.settings.password)

    def open(self) -> None:
        with self._lock:
            if self._alive and self._thread is not None and self._thread.is_alive():
                return
        self.close()
        self._user_closed = False
        ready = threading.Event()
        box: list[BaseException] = []
        self._closing = False
        thread = threading.Thread(
            target=self._io_main, args=(ready, box), name="ackwise-rabbitmq-io", daemon=True
        )
        self._thread = thread
        thread.start()
        if not ready.wait(self.settings.connection_timeout + 10):
            self._closing = True
            raise BrokerUnavailable(f"{self.settings.where}: connecting timed out")
        if box:
            exc = box[0]
            if not isinstance(exc, px.AMQPError | OSError):
                # pika fails with plain errors too when the socket is reset mid-handshake
                # ("Expected connected socket"): connecting may work next time.
                raise BrokerUnavailable(
                    f"{self.settings.where}: connecting failed: {type(exc).__name__}: {exc}"
                ) from exc
            raise translate_pika_error(exc, self.settings.where, self.settings.password) from exc

    def close(self) -> None:
        self._user_closed = True
        thread = self._thread
        if thread is None:
            return
        with self._lock:
            self._closing = True
            conn = self._conn
        if conn is not None and thread.is_alive():
            try:
                conn.add_callback_threadsafe(_noop)
            except Exception:  # already closed
                log.debug("waking the I/O thread failed", exc_info=True)
        if thread is not threading.current_thread():
            thread.join(self.settings.connection_timeout + 5)
        self._thread = None

    # -- the I/O thread --------------------------------------------------------------------
    def _io_main(self, ready: threading.Event, box: list[BaseException]) -> None:
        try:
            conn = BlockingConnection(self.settings.connection_parameters())
            conn._impl._read_frame = functools.partial(_read_frame, conn._impl)
            consume = conn.channel()
            publish = conn.channel()
            publish._impl.confirm_delivery(self._on_confirm)
            publish._impl.add_on_return_callback(self._on_return)
            consume._impl.add_on_close_callback(self._on_consume_closed)
        except BaseException as exc:
            box.append(exc)
            ready.set()
            return
        with self._lock:
            self._conn = conn
            self._consume_ch, self._publish_ch, self._admin_ch = consume, publish, None
            self._consume_closed = None
            self._qos = 0
            self._seq = 0
            self._unconfirmed.clear()
            self._nacked.clear()
            self._generation += 1
            self._alive = True
            self._failure = None
            self._unacked.clear()
            self._inbox.clear()
            self._consumers.clear()
        ready.set()
        error: BaseException | None = None
        try:
            while not self._closing:
                conn.process_data_events(time_limit=0.5)
                self._last_turn = time.monotonic()
                self._run_calls()
                if self._consume_closed is not None:
                    raise _ConnectionLost(self._consume_closed)
        except BaseException as exc:
            error = exc
        self._shutdown(conn, error)

    def _shutdown(self, conn: BlockingConnection, error: BaseException | None) -> None:
        if error is not None and not self._closing:
            failure: AdapterError
            if isinstance(error, _ConnectionLost):
                failure = TransientAdapterError(f"{self.settings.where}: {error}")
            else:
                failure = translate_pika_error(error, self.settings.where, self.settings.password)
            log.warning("RabbitMQ connection lost: %s", failure)
        else:
            failure = BrokerUnavailable(f"{self.settings.where}: the adapter is closed")
        with self._lock:
            self._alive = False
            self._failure = failure
            self._unacked.clear()
            self._inbox.clear()  # unacked at the broker: closing the connection requeues them
            self._consumers.clear()
            calls = list(self._calls)
            self._calls.clear()
            self._lock.notify_all()
        for call in calls:
            call.error = failure
            call.done.set()
        try:
            if conn.is_open:
                # Closing the connection returns every unsettled delivery to its queue at once.
                conn.close()
        except Exception:
            log.debug("closing the connection failed", exc_info=True)

    def _run_calls(self) -> None:
        while True:
            with self._lock:
                if not self._calls:
                    return
                call = self._calls.popleft()
            try:
                call.result = call.fn()
            except BaseException as exc:
                call.error = exc
                if call.detached:
                    log.warning("RabbitMQ: a posted operation failed: %r", exc)
                conn = self._conn
                if conn is None or not conn.is_open or isinstance(exc, _ConnectionLost):
                    call.done.set()
                    raise
            call.done.set()

    def _post(self, fn: Callable[[], None]) -> None:
        """Hand ``fn`` to the I/O thread and return at once (its errors are logged)."""
        call = _Call(fn, detached=True)
        with self._lock:
            if not self._alive:
                raise self._failure or BrokerUnavailable(
                    f"{self.settings.where}: the adapter is not open"
                )
            wake = not self._calls  # else a wake-up is on its way already
            self._calls.append(call)
            conn = self._conn
        if wake:
            assert conn is not None
            try:
                conn.add_callback_threadsafe(_noop)
            except Exception as exc:
                raise BrokerUnavailable(f"{self.settings.where}: connection closed") from exc

    def _call(self, fn: Callable[[], T], timeout: float | None = None) -> T:
        """Run ``fn`` on the I/O thread and return its result (errors mapped).

        A connection that was lost (not closed by the caller) is opened again first, once:
        a producer or an inspector needs no receipts of the old one.  ``receive`` does not
        come here: a consumer learns of the loss and reconnects with its backoff.
        """
        call = _Call(fn)
        with self._lock:
            lost = not self._alive and self._thread is not None and not self._user_closed
        if lost:
            self.open()
        with self._lock:
            if not self._alive:
                raise self._failure or BrokerUnavailable(
                    f"{self.settings.where}: the adapter is not open"
                )
            self._calls.append(call)
            conn = self._conn
        assert conn is not None
        try:
            conn.add_callback_threadsafe(_noop)
        except Exception as exc:
            raise BrokerUnavailable(f"{self.settings.where}: connection closed") from exc
        limit = (timeout or self.settings.confirm_timeout) + _CALL_SLACK
        deadline = time.monotonic() + limit
        while not call.done.wait(0.5):
            thread = self._thread
            if thread is None or not thread.is_alive() or time.monotonic() > deadline:
                raise BrokerUnavailable(f"{self.settings.where}: the I/O thread stopped answering")
        error = call.error
        if error is not None:
            if isinstance(error, AdapterError):
                raise error
            if isinstance(error, _ConnectionLost):
                raise TransientAdapterError(f"{self.settings.where}: {error}") from error
            raise translate_pika_error(
                error, self.settings.where, self.settings.password
            ) from error
        return call.result  # type: ignore[no-any-return]

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

    def _on_consume_closed(self, _ch: Any, reason: BaseException) -> None:
        if self._closing:
            return
        code = getattr(reason, "reply_code", 0)
        text = getattr(reason, "reply_text", str(reason))
        lowered = str(text).lower()
        if code == 406 and ("timeout" in lowered or "timed out" in lowered):
            # Reported once here; the worker sees a transient error and reconnects.
            log.error(
                "RabbitMQ closed the consuming channel: a delivery was held longer than the "
                "broker's consumer_timeout (%s); reconnecting, its messages are redelivered",
                text,
            )
            self._consume_closed = (
                f"a delivery was held past the broker's consumer_timeout: {code} {text}"
            )
            return
        self._consume_closed = f"the consuming channel was closed: {code} {text}"

    # -- channels (I/O thread) -------------------------------------------------------------
    def _admin(self) -> BlockingChannel:
        ch = self._admin_ch
        if ch is None or not ch.is_open:
            assert self._conn is not None
            ch = self._admin_ch = self._conn.channel()
        return ch

    @contextmanager
    def _temp_channel(self) -> Iterator[BlockingChannel]:
        assert self._conn is not None
        ch = self._conn.channel()
        try:
            yield ch
        finally:
            if ch.is_open:
                ch.close()  # what was taken and not acked goes back, in order

    def _exists(self, queue: str) -> int | None:
        """Ready count of ``queue``, or None when it does not exist (I/O thread)."""
        try:
            ok = self._admin().queue_declare(queue, passive=True)
        except px.ChannelClosedByBroker as exc:
            if exc.reply_code == 404:
                return None
            raise
        return int(ok.method.message_count)

    def _publish_now(self, items: Sequence[tuple[str, str, bytes, Any]]) -> None:
        """Publish with ``mandatory`` and wait for every confirm (I/O thread).

        The publishes are pipelined: one round trip for the whole batch.
        """
        ch = self._publish_ch
        conn = self._conn
        assert conn is not None
        if ch is None or not ch.is_open:
            ch = self._publish_ch = conn.channel()
            ch._impl.confirm_delivery(self._on_confirm)
            ch._impl.add_on_return_callback(self._on_return)
            self._seq = 0
            self._unconfirmed.clear()
        self._returned.clear()
        first = self._seq + 1
        for exchange, key, body, props in items:
            ch._impl.basic_publish(exchange, key, body, props, mandatory=True)
            self._seq += 1
            self._unconfirmed.add(self._seq)
        mine = set(range(first, self._seq + 1))
        timed_out: list[bool] = []
        timer = conn._impl._adapter_call_later(
            self.settings.confirm_timeout, lambda: timed_out.append(True)
        )
        try:
            conn._flush_output(
                lambda: not (self._unconfirmed & mine) or bool(timed_out) or not ch.is_open
            )
        finally:
            conn._impl._adapter_remove_timeout(timer)
        if not ch.is_open:
            raise TransientAdapterError(
                f"{self.settings.where}: the publishing channel closed before RabbitMQ "
                "confirmed; whether the messages were stored is unknown"
            )
        if self._unconfirmed & mine:
            self._unconfirmed -= mine
            raise TransientAdapterError(
                f"{self.settings.where}: RabbitMQ did not confirm {len(mine)} message(s) within "
                f"{self.settings.confirm_timeout}s; whether they were stored is unknown"
            )
        nacked = self._nacked & mine
        self._nacked -= mine
        if self._returned:
            ids = ", ".join(sorted({i for i, _ in self._returned}))
            why = self._returned[0][1]
            self._returned.clear()
            raise QueueNotFound(
                f"{self.settings.where}: RabbitMQ could not route message(s) {ids} ({why}): "
                "the queue does not exist (declare it first); nothing was stored"
            )
        if nacked:
            raise PermanentAdapterError(
                f"{self.settings.where}: RabbitMQ refused (nacked) {len(nacked)} message(s)"
            )

    def max_hold(self) -> float | None:
        """The broker's ``consumer_timeout`` (the URL's ``consumer_timeout``; AMQP cannot read it)."""
        return self.settings.consumer_timeout

    # -- topology --------------------------------------------------------------------------
    def declare(self, queue: QueueSpec) -> None:
        name = queue.name
        self._check_name(name)
        if name in self._declared:
            return
        self._call(lambda: self._declare(queue), timeout=60.0)
        self._declared.add(name)

    def _declare(self, spec: QueueSpec) -> None:
        name = spec.name
        dlx, dead = self._aux(name, "dlx"), self._aux(name, "dead")
        deliver = self._aux(name, "deliver")
        ch = self._admin()
        ch.exchange_declare(dlx, "fanout", durable=True)
        ch.queue_declare(dead, durable=True, arguments={"x-queue-type": "classic"})
        ch.queue_bind(dead, dlx)
        if self._exists(name) is None:
            args: dict[str, Any] = {"x-dead-letter-exchange": dlx}
            if self.settings.queue_type == "quorum":
                args["x-queue-type"] = "quorum"
                args["x-delivery-limit"] = spec.max_deliveries
                # What the queue dead-letters itself (past the delivery limit) stays in it
                # until the dead-letter queue has confirmed it.  The default, at-most-once,
                # drops it when that queue cannot take it (a broker shutting down); RabbitMQ
                # requires reject-publish overflow for it (no length limit is set: no effect).
                args["x-dead-letter-strategy"] = "at-least-once"
                args["x-overflow"] = "reject-publish"
            else:
                args["x-queue-type"] = "classic"
            try:
                self._admin().queue_declare(name, durable=True, arguments=args)
            except px.ChannelClosedByBroker as exc:
                # Declared meanwhile by another process with other arguments: keep theirs.
                if exc.reply_code != 406 or self._exists(name) is None:
                    raise
        ch = self._admin()
        ch.exchange_declare(deliver, "fanout", durable=True)
        ch.queue_bind(name, deliver)
        below = deliver
        for k in range(DELAY_TIERS):
            exchange, wait = self._aux(name, f"delay.{k}"), self._aux(name, f"wait.{k}")
            ch.exchange_declare(exchange, "topic", durable=True)
            ch.queue_declare(
                wait,
                durable=True,
                arguments={
                    "x-queue-type": "classic",
                    "x-message-ttl": 2**k,
                    "x-dead-letter-exchange": below,
                },
            )
            above = "*." * (DELAY_TIERS - 1 - k)
            ch.queue_bind(wait, exchange, routing_key=f"{above}1.#")
            ch.exchange_bind(below, exchange, routing_key=f"{above}0.#")
            below = exchange

    # -- producing -------------------------------------------------------------------------
    def _properties(
        self, message_id: str, headers: dict[str, Any] | None = None
    ) -> pika.BasicProperties:
        return pika.BasicProperties(
            message_id=message_id,
            delivery_mode=2,
            timestamp=int(time.time()),
            headers=headers or None,
        )

    def _route(
        self, queue: str, m: Outgoing, headers: dict[str, Any] | None = None
    ) -> tuple[str, str, bytes, Any]:
        props = self._properties(m.id, headers)
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

    def publish(self, queue: str, messages: Sequence[Outgoing]) -> None:
        if not messages:
            return
        self._check_name(queue)
        self._check(messages)
        items = [self._route(queue, m) for m in messages]
        self._call(lambda: self._publish_now(items))

    def publish_dead(self, queue: str, messages: Sequence[Outgoing], *, reason: str) -> None:
        if not messages:
            return
        self._check_name(queue)
        self._check(messages)
        now = time.time()
        dead = self._aux(queue, "dead")
        items = [("", dead, m.body, self._dead_props(m.id, reason, now, 1)) for m in messages]
        self._call(lambda: self._publish_now(items))

    def _dead_props(self, message_id: str, reason: str, at: float, attempt: int) -> Any:
        return self._properties(
            message_id, {H_REASON: reason, H_DEAD_AT: repr(at), H_ATTEMPT: attempt}
        )

    # -- consuming -------------------------------------------------------------------------
    def _ensure_open(self) -> None:
        with self._lock:
            if self._alive:
                return
            failure = self._failure
        raise failure or BrokerUnavailable(f"{self.settings.where}: the adapter is not open")

    def receive(
        self, queue: str, *, max_messages: int, wait: float, lease: float
    ) -> Sequence[Delivery]:
        if max_messages <= 0:
            return []
        self._ensure_open()
        raws = self._take(queue, max_messages)
        if not raws:
            with self._lock:
                consumers = self._consumers.get(queue, [])
                credit = sum(c.credit for c in consumers)
                # The caller's whole budget: what it holds unsettled (through any consumer of
                # this connection) and the room it asks to fill.
                want = max_messages + sum(1 for q in self._unacked.values() if q == queue)
                # Nothing pushed and a window too small for what the caller asks: it holds
                # every delivery the window let through (no worker does: one with acks still
                # to send polls with wait=0 and finds the window open again shortly), or its
                # budget grew (an automatic prefetch) well past the window.  The window grows
                # by one more consumer: cancelling one could return its in-flight deliveries.
                grow = not consumers or (
                    (sum(c.outstanding for c in consumers) >= credit and wait > 0)
                    or want > 2 * credit
                )
            if grow:
                n = len(consumers)
                self._call(lambda: self._add_consumer(queue, want - credit, n))
            if wait > 0:
                deadline = time.monotonic() + wait
                with self._lock:
                    while not self._inbox.get(queue) and self._alive:
                        remaining = deadline - time.monotonic()
                        if remaining <= 0:
                            break
                        self._lock.wait(remaining)
                self._ensure_open()
            raws = self._take(queue, max_messages)
        now = time.time()
        return [self._delivery(raw, now + lease) for raw in raws]

    def _take(self, queue: str, n: int) -> list[_Raw]:
        """Hand over up to ``n`` pushed messages: from here on they are the caller's."""
        with self._lock:
            inbox = self._inbox.get(queue)
            if not inbox:
                return []
            out: list[_Raw] = []
            while inbox and len(out) < n:
                raw = inbox.popleft()
                if raw.generation != self._generation:
                    continue  # the connection went meanwhile: the broker requeued it
                self._unacked[raw.tag] = queue
                out.append(raw)
            return out

    def _add_consumer(self, queue: str, credit: int, seen: int) -> None:
        """Consume ``queue`` with a window of ``credit`` more unacked messages (I/O thread).

        The broker pushes while fewer than ``credit`` of this consumer's deliveries are
        unsettled; a late ack frees its slot just as the task that ends frees room in the
        worker, so the windows of a queue's consumers add up to the worker's own prefetch
        budget.  (An early ack frees a slot while the task still runs: :meth:`ack_before_start`
        stops the consumers first.)  A budget that grows gets another consumer for the
        difference (RabbitMQ applies ``basic.qos`` to new consumers only) rather than a
        replacement, which would cost deliveries (see :meth:`_cancel`).  ``seen`` is how many
        consumers the caller saw: if that changed, or a push came meanwhile, there is nothing
        to do.
        """
        with self._lock:
            if len(self._consumers.get(queue, [])) != seen or self._inbox.get(queue):
                return
        self._check_live()
        ch = self._consume_ch
        assert ch is not None
        if self._qos != credit:
            ch.basic_qos(prefetch_count=credit)  # per consumer: applies to the next one
            self._qos = credit
        generation = self._generation
        consumer = _Consumer(queue, "", credit)
        with self._lock:
            inbox = self._inbox.setdefault(queue, collections.deque())

        # pika's channel calls this from the I/O loop as each delivery's frames arrive.
        def on_message(_ch: Any, method: Any, props: Any, body: bytes) -> None:
            raw = _Raw(
                generation, queue, method.delivery_tag, props, body, method.redelivered, consumer
            )
            with self._lock:
                consumer.outstanding += 1
                inbox.append(raw)
                self._lock.notify_all()

        # The channel's own consume-ok slot, as BlockingChannel.basic_consume uses it; the
        # consumer itself is the impl's, so that its deliveries come straight to the inbox
        # and a cancel can keep the ones in transit (see _cancel_consumers).
        with ch._basic_consume_ok_result as ok:
            consumer.tag = ch._impl.basic_consume(queue, on_message, auto_ack=False)
            ch._flush_output(ok.is_ready)
        if self._consume_closed is not None:
            raise _ConnectionLost(self._consume_closed)
        with self._lock:
            self._consumers.setdefault(queue, []).append(consumer)

    def _cancel_consumers(self, queues: Iterable[str]) -> None:
        """Cancel every consumer of ``queues`` (I/O thread, no wait): see :meth:`_cancel`."""
        with self._lock:
            consumers = [c for q in queues for c in self._consumers.get(q, [])]
        self._cancel(consumers)

    def _cancel(self, consumers: Iterable[_Consumer]) -> None:
        """Send ``basic.cancel`` for ``consumers`` (I/O thread, no wait).

        The next synchronous method on the channel returns after every cancel-ok.  Messages
        the broker pushed before it took a cancel in still arrive and go to the inbox like
        any other: they were asked for (pika's own cancel would reject them back to the
        queue, which counts as a delivery on a quorum queue).  A quorum queue itself takes
        back what was still on its way and counts it as a delivery (RabbitMQ 3.10, measured:
        replacements sent a message to the dead letters without a run, early acks whole
        windows back): only a full window, where nothing can be on its way, is cancelled
        without that cost.
        """
        ch = self._consume_ch
        assert ch is not None
        for consumer in consumers:
            with self._lock:
                mine = self._consumers.get(consumer.queue, [])
                if consumer not in mine:
                    continue
                mine.remove(consumer)
                if not mine:
                    del self._consumers[consumer.queue]
            ch._impl.basic_cancel(consumer.tag, callback=_noop_frame)
            ch._impl._cancelled.discard(consumer.tag)  # keep its in-transit deliveries

    def stop_receiving(self) -> None:
        """Cancel every consumer and give back at once what they pushed and no one took."""
        with self._lock:
            if not self._alive or (not self._consumers and not any(self._inbox.values())):
                return

        def run() -> None:
            ch = self._consume_ch
            assert ch is not None
            self._cancel_consumers(list(self._consumers))
            ch.basic_qos(prefetch_count=self._qos)  # every cancel-ok has come before this
            with self._lock:
                raws = [raw for inbox in self._inbox.values() for raw in inbox]
                self._inbox.clear()
            for raw in raws:
                if raw.generation == self._generation:
                    ch._impl.basic_reject(raw.tag, requeue=True)
            ch.basic_qos(prefetch_count=self._qos)  # they are back before this returns

        try:
            self._call(run)
        except TransientAdapterError as exc:
            # The connection is gone: the broker has requeued everything it held for us.
            log.warning("returning prefetched messages failed, the connection is gone: %s", exc)

    def _delivery(self, raw: _Raw, deadline: float) -> Delivery:
        """The delivery of a pushed message; one ackwise did not write is marked corrupt (the
        worker dead-letters it as it is), never raised on: this runs after its tag was
        recorded unacked, and a raise would stop the worker at each redelivery."""
        props = raw.properties
        headers = props.headers or {}
        return Delivery(
            queue=raw.queue,
            message_id=_message_id(props, raw.body),
            body=raw.body,
            receipt=Receipt(raw.generation, raw.tag, raw.consumer),
            attempt=_attempt(headers, raw.redelivered),
            lease_deadline=deadline,
            corrupt=_malformed(props, headers),
        )

    # -- settling --------------------------------------------------------------------------
    def _claim(self, deliveries: Sequence[Delivery]) -> tuple[list[Delivery], list[Delivery]]:
        """Split into (valid, stale) and take the valid ones out of the unsettled set."""
        valid: list[Delivery] = []
        stale: list[Delivery] = []
        with self._lock:
            for d in deliveries:
                r = d.receipt
                if (
                    isinstance(r, Receipt)
                    and self._alive
                    and r.generation == self._generation
                    and r.tag in self._unacked
                ):
                    del self._unacked[r.tag]
                    if r.consumer is not None:
                        r.consumer.outstanding -= 1
                    valid.append(d)
                else:
                    stale.append(d)
        return valid, stale

    def _unclaim(self, deliveries: Sequence[Delivery]) -> None:
        with self._lock:
            for d in deliveries:
                r = d.receipt
                if r.generation == self._generation and self._alive:
                    self._unacked[r.tag] = d.queue
                    if r.consumer is not None:
                        r.consumer.outstanding += 1

    def _settle(
        self, valid: list[Delivery], stale: list[Delivery], fn: Callable[[], None], operation: str
    ) -> None:
        if valid:
            try:
                self._call(fn)
            except StaleReceipt:
                raise
            except TransientAdapterError as exc:
                # The connection is gone: RabbitMQ requeued these deliveries.
                log.warning("%s failed, the connection is gone: %s", operation, exc)
                stale = [*stale, *valid]
        if stale:
            raise StaleReceipt(stale, operation)

    def _check_live(self) -> None:
        """Notice a connection the broker closed (e.g. while this process was stopped)."""
        conn = self._conn
        assert conn is not None
        conn.process_data_events(time_limit=0)
        if self._consume_closed is not None:
            raise _ConnectionLost(self._consume_closed)

    def ack(self, deliveries: Sequence[Delivery]) -> None:
        """Late acks: posted to the I/O thread without waiting for it (``basic.ack`` has no
        answer to wait for anyway; a lost one is a redelivery, which at-least-once allows).

        When the I/O loop has not turned for a while (this process was paused, say), the
        connection may be gone without the adapter knowing: then the ack waits for the I/O
        thread to look first, so that a stale receipt is reported as such.
        """
        if not deliveries:
            return
        if time.monotonic() - self._last_turn < _FRESH_LOOP:
            valid, stale = self._claim(deliveries)
            if valid:
                generation = valid[0].receipt.generation
                tags = [d.receipt.tag for d in valid]

                def post() -> None:
                    ch = self._consume_ch
                    if generation != self._generation or ch is None or not ch.is_open:
                        return  # that connection is gone: the broker requeued them
                    for tag in tags:
                        ch._impl.basic_ack(tag)

                try:
                    self._post(post)
                except TransientAdapterError:
                    stale = [*stale, *valid]
            if stale:
                raise StaleReceipt(stale, "ack")
            return
        valid, stale = self._claim(deliveries)

        def run() -> None:
            self._check_live()
            ch = self._consume_ch
            assert ch is not None
            for d in valid:
                ch._impl.basic_ack(d.receipt.tag)
            assert self._conn is not None
            self._conn._flush_output()

        self._settle(valid, stale, run, "ack")

    def ack_before_start(self, deliveries: Sequence[Delivery]) -> None:
        """Ack, then wait for the broker to have taken the acks in (``Ack.EARLY``).

        ``basic.ack`` has no answer: an ack still in the socket when the broker stops or the
        connection breaks is lost, and the message is delivered again, which an at-most-once
        task must never see.  So a synchronous method follows on the same channel: the
        broker handles a channel's frames in order, so its answer means every ack before it
        reached the channel and was passed on to the queue.  If the answer does not come
        the acks are reported stale and the worker does not start those tasks (at worst one
        is lost, never run twice).
        """
        if not deliveries:
            return
        with self._lock:
            # Full windows, counted before these deliveries are settled here (the broker still
            # counts them): nothing can be on its way to those consumers.
            full = [
                c
                for q in {d.queue for d in deliveries}
                for c in self._consumers.get(q, [])
                if c.outstanding >= c.credit
            ]
        valid, stale = self._claim(deliveries)

        def run() -> None:
            self._check_live()
            ch = self._consume_ch
            assert ch is not None
            # Stop the full windows before the acks free their slots (the tasks still run, so
            # the worker has no more room): the broker handles the cancels first.  A window
            # with room keeps its consumer (see _cancel), and what it pushes next waits here
            # for room.
            self._cancel(full)
            for d in valid:
                ch._impl.basic_ack(d.receipt.tag)
            # The barrier: same value, no change; the cancel-oks come before its answer.
            ch.basic_qos(prefetch_count=self._qos)

        self._settle(valid, stale, run, "ack")

    def extend(self, deliveries: Sequence[Delivery], *, lease: float) -> None:
        # Connection-based leases: a delivery is held while the connection lives (the I/O
        # thread keeps it alive), so there is nothing to move; stale receipts still raise.
        with self._lock:
            stale = [
                d
                for d in deliveries
                if not (
                    isinstance(d.receipt, Receipt)
                    and self._alive
                    and d.receipt.generation == self._generation
                    and d.receipt.tag in self._unacked
                )
            ]
        if stale:
            raise StaleReceipt(stale, "extend")

    def nack(self, delivery: Delivery, *, delay: float = 0.0) -> None:
        self.check_delay(delay)
        valid, stale = self._claim([delivery])
        if stale:
            raise StaleReceipt(stale, "nack")
        tag = delivery.receipt.tag
        if delay <= 0 and self.settings.queue_type == "quorum":

            def requeue() -> None:
                self._check_live()
                assert self._consume_ch is not None
                self._consume_ch.basic_nack(tag, requeue=True)  # x-delivery-count + 1

            self._settle(valid, [], requeue, "nack")
            return
        # Republish (into a delay tier), confirmed, then ack: a crash in between duplicates
        # the message, never loses it.  The count so far travels in our header.
        item = self._route(
            delivery.queue,
            Outgoing(delivery.message_id, delivery.body, delay),
            {H_DELIVERIES: delivery.attempt},
        )
        self._republish_then_ack(delivery, item, "nack")

    def _republish_then_ack(
        self, delivery: Delivery, item: tuple[str, str, bytes, Any], operation: str
    ) -> None:
        tag = delivery.receipt.tag

        def run() -> None:
            self._check_live()
            self._publish_now([item])
            assert self._consume_ch is not None
            self._consume_ch.basic_ack(tag)

        try:
            self._settle([delivery], [], run, operation)
        except (PermanentAdapterError, UnsupportedCapability):
            self._unclaim([delivery])  # nothing was sent: the delivery is still ours
            raise

    def dead_letter(self, delivery: Delivery, *, reason: str, body: bytes | None = None) -> None:
        _, stale = self._claim([delivery])
        if stale:
            raise StaleReceipt(stale, "dead_letter")
        props = self._dead_props(delivery.message_id, reason, time.time(), delivery.attempt)
        item = ("", self._aux(delivery.queue, "dead"), _dead_body(delivery, body), props)
        self._republish_then_ack(delivery, item, "dead_letter")

    # -- inspection ------------------------------------------------------------------------
    def _counts(self, queue: str) -> tuple[int, int, int]:
        ready = self._exists(queue)
        if ready is None:
            raise QueueNotFound(f"{self.settings.where}: queue {queue!r} does not exist")
        delayed = 0
        for k in range(DELAY_TIERS):
            delayed += self._exists(self._aux(queue, f"wait.{k}")) or 0
        dead = self._exists(self._aux(queue, "dead")) or 0
        return ready, delayed, dead

    def stats(self, queue: str) -> QueueStats:
        self._check_name(queue)
        started = time.monotonic()
        ready, delayed, dead = self._call(lambda: self._counts(queue))
        with self._lock:
            mine = sum(1 for q in self._unacked.values() if q == queue)
            # Pushed to this adapter's consumer but handed to no one: ready as far as ackwise
            # is concerned (they go back to the queue at a graceful stop); the broker, and
            # so any other process, counts them unacknowledged.
            pushed = len(self._inbox.get(queue, ()))
        info = None
        if self.settings.management:
            # Totals at least as new as this call began (see the URL's management_lag).
            time.sleep(max(0.0, started + self.settings.management_lag - time.monotonic()))
            info = self._queue_totals(queue)
        if info is not None and "messages_unacknowledged" in info:
            # Queue totals come from the queue itself (quorum queues: as of their last tick,
            # a fraction of a second).  A message counted there but no longer ready now has
            # been delivered since: count it in flight, so that lag errs towards "still in
            # flight", never towards "settled".
            unacked = int(info.get("messages_unacknowledged") or 0)
            total = int(info.get("messages") or 0)
            in_flight = max(unacked - pushed, total - ready - pushed, mine)
        else:
            in_flight = mine
        return QueueStats(queue, ready + pushed, delayed, max(0, in_flight), dead, 0.0)

    def _queue_totals(self, queue: str) -> dict[str, Any] | None:
        """The queue's live totals from the management API (not its sampled statistics)."""
        vhost = urllib.parse.quote(self.settings.vhost, safe="")
        name = urllib.parse.quote(queue, safe="")
        found = self._management(
            f"/api/queues/{vhost}?name={name}&use_regex=false&disable_stats=true"
            "&enable_queue_totals=true&columns=name,messages,messages_ready,"
            "messages_unacknowledged"
        )
        items = found.get("items", []) if isinstance(found, dict) else found or []
        for item in items:
            if item.get("name") == queue:
                return dict(item)
        return None

    def _management(self, path: str) -> Any:
        base = self.settings.management
        if not base:
            return None
        request = urllib.request.Request(base.rstrip("/") + path)
        token = base64.b64encode(
            f"{self.settings.username}:{self.settings.password}".encode()
        ).decode()
        request.add_header("Authorization", f"Basic {token}")
        try:
            with urllib.request.urlopen(request, timeout=self.settings.connection_timeout) as r:
                return json.loads(r.read())
        except Exception as exc:  # the management API is optional: report, do not fail
            log.warning("RabbitMQ management API at %s: %s", base, exc)
            return None

    def queues(self) -> Sequence[str]:
        vhost = urllib.parse.quote(self.settings.vhost, safe="")
        info = self._management(f"/api/queues/{vhost}?columns=name")
        if info is None:
            raise UnsupportedCapability(
                self.name, "listing queues", "needs the management API (?management=http://…)"
            )
        prefix = self.settings.prefix + "."
        return sorted(q["name"] for q in info if not q["name"].startswith(prefix))

    def _read_dead(
        self, ch: BlockingChannel, queue: str, limit: int | None
    ) -> list[tuple[int, DeadLetter]]:
        out: list[tuple[int, DeadLetter]] = []
        dead = self._aux(queue, "dead")
        while limit is None or len(out) < limit:
            method, props, body = ch.basic_get(dead, auto_ack=False)
            if method is None:
                break
            out.append((method.delivery_tag, _dead_letter_of(queue, props, body)))
        return out

    def dead_letters(self, queue: str, *, limit: int = 100) -> Sequence[DeadLetter]:
        self._check_name(queue)

        def run() -> list[DeadLetter]:
            with self._temp_channel() as ch:
                return [d for _, d in self._read_dead(ch, queue, limit)]

        return self._call(run, timeout=120.0)

    def requeue_dead(self, queue: str, message_ids: Sequence[str]) -> int:
        self._check_name(queue)
        wanted = set(message_ids)

        def run() -> int:
            with self._temp_channel() as ch:
                moved = 0
                for tag, d in self._read_dead(ch, queue, None):
                    if d.message_id not in wanted:
                        continue
                    # Confirmed on the queue first, then removed from the dead letters.
                    self._publish_now([("", queue, d.body, self._properties(d.message_id))])
                    ch.basic_ack(tag)
                    moved += 1
                return moved

        return self._call(run, timeout=300.0)

    def delete_dead(self, queue: str, message_ids: Sequence[str] | None = None) -> int:
        self._check_name(queue)
        dead = self._aux(queue, "dead")
        if message_ids is None:
            return self._call(lambda: int(self._admin().queue_purge(dead).method.message_count))
        wanted = set(message_ids)

        def run() -> int:
            with self._temp_channel() as ch:
                gone = 0
                for tag, d in self._read_dead(ch, queue, None):
                    if d.message_id in wanted:
                        ch.basic_ack(tag)
                        gone += 1
                return gone

        return self._call(run, timeout=300.0)

    def purge(self, queue: str) -> int:
        self._check_name(queue)

        def run() -> int:
            ch = self._admin()
            total = int(ch.queue_purge(queue).method.message_count)
            for k in range(DELAY_TIERS):
                total += int(ch.queue_purge(self._aux(queue, f"wait.{k}")).method.message_count)
            return total

        return self._call(run)
