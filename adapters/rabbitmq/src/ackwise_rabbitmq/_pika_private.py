"""The one place where the adapter touches pika's private API (names starting with ``_``).

Checked against pika 1.4.4, the version ``uv.lock`` pins (the package allows ``pika>=1.3``;
other versions are not checked here).  ``tests/test_rabbitmq_pika_private.py`` asserts, without
a broker, that every private name used below exists on the installed pika with the shape
relied on: run it whenever the pika version changes.

What ``BlockingConnection`` and ``BlockingChannel`` do not offer, and why the adapter needs it:

* the connection implementation (``BlockingConnection._impl``) and its frame decoder
  (``Connection._read_frame``, reading ``_frame_buffer``): replaced, so that a header pika
  cannot decode costs one message rather than the connection (see ``_messages._read_frame``);
* the channel implementation (``BlockingChannel._impl``, a ``pika.channel.Channel``): its
  ``basic_ack``, ``basic_reject`` and ``basic_publish`` queue a frame without the blocking
  channel's flush after each, its confirm, return and close callbacks run as the frames arrive,
  and its consumers deliver straight to a callback (the blocking channel's are dispatched only
  by ``process_data_events``, and its cancel rejects what is in transit);
* the plaintext transport's send loop (``_AsyncPlaintextTransport._produce`` over
  ``_tx_buffers``): it sends each queued frame with a system call of its own (three for one
  message); the adapter joins what is queued into one send (see :func:`coalesce_writes`);
* the plaintext transport's socket and state (``_sock``, ``_state``), the connection's byte
  and frame counts and largest body frame (``_body_max_length``): a publish the adapter
  encoded (:mod:`~ackwise_rabbitmq._frames`) is sent at once when nothing is queued before
  it (see :func:`send_frames`);
* the plaintext transport's read loop (``_AsyncPlaintextTransport._consume``): it reads until
  the socket has nothing more, which costs every wake-up a second ``recv`` that fails; the
  adapter stops at a short read (see :func:`stop_reading_at_a_short_read`);
* the blocking objects' I/O wait (``BlockingConnection._flush_output``,
  ``BlockingChannel._flush_output``, ``BlockingChannel._basic_consume_ok_result``);
* timers inside that wait (the connection impl's ``_adapter_call_later`` and
  ``_adapter_remove_timeout``: ``BlockingConnection.call_later`` callbacks run only from
  ``process_data_events``);
* the set of cancelled consumer tags of a channel (``Channel._cancelled``), whose deliveries
  pika rejects back to the queue;
* the blocking channel's handler of a consumer the broker cancels
  (``BlockingChannel._on_consumer_cancelled_by_broker``, in the channel impl's ``callbacks``):
  it knows only the blocking channel's own consumers (see :func:`on_consumer_cancelled`).
"""

from __future__ import annotations

from collections.abc import Callable
from types import TracebackType
from typing import Any

import pika.spec
from pika.adapters.blocking_connection import BlockingChannel, BlockingConnection
from pika.adapters.utils.io_services_utils import _AsyncPlaintextTransport

__all__ = [
    "body_max",
    "cancel_keeping_in_transit",
    "coalesce_writes",
    "consume",
    "flush",
    "io_timer",
    "on_channel_close",
    "on_consumer_cancelled",
    "read_frames_with",
    "send_ack",
    "send_frames",
    "send_reject",
    "stop_reading_at_a_short_read",
    "watch_publishing",
]


def _noop_frame(_frame: Any) -> None:
    pass


# -- the connection ----------------------------------------------------------------------------
def read_frames_with(conn: BlockingConnection, read: Callable[[bytes], tuple[int, Any]]) -> None:
    """Decode the frames ``conn`` receives with ``read`` instead of pika's decoder.

    ``read(buffer)`` gets what was received and not yet decoded and answers as
    ``pika.frame.decode_frame`` does: the bytes its frame took and the frame (``(0, None)``:
    more bytes are needed).  pika's ``_on_data_available`` calls ``self._read_frame()``, which
    decodes ``self._frame_buffer``.
    """
    impl = conn._impl
    impl._read_frame = lambda: read(impl._frame_buffer)


def flush(conn: BlockingConnection, *waiters: Callable[[], bool]) -> None:
    """Send what is queued and process input until any of ``waiters`` is true (none: until the
    output is sent); raises when the connection closes (``BlockingConnection._flush_output``)."""
    conn._flush_output(*waiters)


class io_timer:  # a class for speed; used as ``with io_timer(...):``
    """``callback`` runs after ``delay`` seconds from pika's I/O loop, also inside :func:`flush`
    (``BlockingConnection.call_later`` callbacks run only from ``process_data_events``), unless
    the block was left first."""

    __slots__ = ("_impl", "_timer")

    def __init__(self, conn: BlockingConnection, delay: float, callback: Callable[[], Any]) -> None:
        self._impl = conn._impl
        self._timer = self._impl._adapter_call_later(delay, callback)

    def __enter__(self) -> None:
        return None

    def __exit__(
        self,
        _type: type[BaseException] | None,
        _exc: BaseException | None,
        _tb: TracebackType | None,
    ) -> None:
        self._impl._adapter_remove_timeout(self._timer)


def coalesce_writes(conn: BlockingConnection) -> None:
    """Have ``conn`` send what it has queued (the frames of several messages, acks) with one
    system call rather than one per frame; a partial send keeps the rest queued, as pika's
    loop does.  Plaintext connections only: a TLS retry must send the same buffer again."""
    transport = conn._impl._transport
    if type(transport) is not _AsyncPlaintextTransport:
        return
    produce = transport._produce
    queued = transport._tx_buffers

    def produce_joined() -> None:
        if len(queued) > 1:
            joined = b"".join(queued)
            queued.clear()
            queued.append(joined)
        produce()

    transport._produce = produce_joined


def stop_reading_at_a_short_read(conn: BlockingConnection) -> None:
    """Have ``conn``'s transport return to the I/O loop once a ``recv`` brought less than it
    asked for (the socket held no more then), rather than read again until ``recv`` fails with
    EAGAIN (pika's loop: one more system call, and an exception caught and logged, at every
    wake-up).  The loop's poll is level-triggered: bytes that arrive later wake it again.
    Plaintext connections only (a TLS socket may hold decrypted bytes the poll does not see).
    """
    transport = conn._impl._transport
    if type(transport) is not _AsyncPlaintextTransport:
        return
    active = transport._STATE_ACTIVE
    size = transport._MAX_RECV_BYTES
    limit = transport._MAX_CONSUME_BYTES
    recv = transport._sigint_safe_recv
    sock = transport._sock
    protocol = transport._protocol

    def consume() -> None:
        taken = 0
        while transport._state == active and taken < limit:
            data = recv(sock, size)
            if not data:
                raise transport.RxEndOfFile()
            taken += len(data)
            protocol.data_received(data)
            if len(data) < size:
                return

    transport._consume = consume


# -- a channel's implementation ----------------------------------------------------------------
def watch_publishing(
    ch: BlockingChannel,
    on_confirm: Callable[[Any], None],
    on_return: Callable[[Any, Any, Any, bytes], None],
) -> None:
    """Confirm mode, with ``on_confirm(frame)`` called for each ``Basic.Ack`` / ``Basic.Nack``
    and ``on_return(channel, method, properties, body)`` for each returned message, as they
    arrive (the blocking channel's own confirm mode makes every publish wait for its confirm)."""
    ch._impl.confirm_delivery(on_confirm)
    ch._impl.add_on_return_callback(on_return)


def on_channel_close(ch: BlockingChannel, callback: Callable[[Any, BaseException], None]) -> None:
    """``callback(channel, reason)`` when the channel closes, as it happens."""
    ch._impl.add_on_close_callback(callback)


def on_consumer_cancelled(ch: BlockingChannel, callback: Callable[[str], None]) -> None:
    """``callback(consumer_tag)`` when the broker cancels a consumer of ``ch`` (its queue was
    deleted), in place of the blocking channel's handler.  That one looks the tag up among the
    blocking channel's own consumers; on a consumer of the impl (:func:`consume`) it raises
    ``KeyError``, which pika turns into a lost connection."""
    impl = ch._impl
    impl.callbacks.remove(
        impl.channel_number, pika.spec.Basic.Cancel, ch._on_consumer_cancelled_by_broker
    )
    impl.add_on_cancel_callback(lambda frame: callback(frame.method.consumer_tag))


def send_ack(ch: BlockingChannel, tag: int) -> None:
    """Queue ``basic.ack`` of one delivery, without flushing (see :func:`flush`)."""
    ch._impl.basic_ack(tag)


def send_reject(ch: BlockingChannel, tag: int, *, requeue: bool) -> None:
    """Queue ``basic.reject`` of one delivery, without flushing."""
    ch._impl.basic_reject(tag, requeue=requeue)


def body_max(ch: BlockingChannel) -> int:
    """The largest body frame's payload on ``ch``'s connection (``frame_max`` less 8)."""
    size: int = ch._impl.connection._body_max_length
    return size


def send_frames(ch: BlockingChannel, data: bytes) -> None:
    """Send ``data``, frames the adapter encoded for ``ch`` (``basic.publish``,
    :mod:`~ackwise_rabbitmq._frames`), without waiting for a confirm.

    When nothing is queued before them, they go out at once, with one system call; pika would
    queue them, watch the socket for writability and send them on its loop's next turn (two
    ``epoll_ctl`` and an ``epoll_wait`` more, on the path of every confirmed publish).  What
    the socket does not take, and every send on a TLS connection, is queued as pika queues it.
    Raises ``ChannelWrongStateError`` as ``Channel.basic_publish`` does on a closed channel.
    The connection's ``bytes_sent`` counts them (its heartbeat checker reads it); its
    ``frames_sent`` statistic does not.
    """
    impl = ch._impl
    impl._raise_if_not_open()
    conn = impl.connection
    conn.bytes_sent += len(data)
    transport = conn._transport
    if (
        type(transport) is _AsyncPlaintextTransport
        and not transport._tx_buffers
        and transport._state == transport._STATE_ACTIVE
    ):
        try:
            sent = transport._sock.send(data)
        except OSError:  # would block; or broken: pika's next send meets it and closes
            sent = 0
        if sent == len(data):
            return
        data = data[sent:]
    conn._adapter_emit_data(data)


def consume(
    ch: BlockingChannel, queue: str, on_message: Callable[[Any, Any, Any, bytes], None]
) -> str:
    """``basic.consume`` of ``queue`` (manual acks); returns the consumer tag once consume-ok
    came.

    The consumer is the channel impl's: ``on_message(channel, method, properties, body)`` is
    called from the I/O loop as each delivery's frames arrive.  The wait uses the channel's own
    consume-ok slot, as ``BlockingChannel.basic_consume`` does.
    """
    with ch._basic_consume_ok_result as ok:
        tag: str = ch._impl.basic_consume(queue, on_message, auto_ack=False)
        ch._flush_output(ok.is_ready)
    return tag


def cancel_keeping_in_transit(ch: BlockingChannel, tag: str) -> None:
    """Queue ``basic.cancel`` of a consumer, without waiting for cancel-ok, such that what the
    broker pushed before it took the cancel in still reaches the consumer's callback (pika
    rejects deliveries to a tag in ``Channel._cancelled`` back to the queue)."""
    ch._impl.basic_cancel(tag, callback=_noop_frame)
    ch._impl._cancelled.discard(tag)
