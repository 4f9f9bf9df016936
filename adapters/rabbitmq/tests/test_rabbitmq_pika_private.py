"""pika's private API as ``ackwise_rabbitmq._pika_private`` relies on it, on the installed pika.

No broker: a ``SelectConnection`` that never connects, and channels on it, stand in for the
adapter's connection.  A failure here after a pika upgrade means that a function of
``_pika_private`` must be checked against the new pika (and its docstring's version updated).
"""

from __future__ import annotations

import collections
import datetime
import inspect
import struct
from collections.abc import Callable, Iterator
from types import SimpleNamespace
from typing import Any

import pika
import pika.channel
import pika.connection
import pika.frame
import pika.spec
import pytest
from pika.adapters import blocking_connection
from pika.adapters.select_connection import SelectConnection
from pika.adapters.utils.io_services_utils import _AsyncPlaintextTransport

from ackwise_rabbitmq import _pika_private
from ackwise_rabbitmq._messages import H_UNREADABLE, _read_frame

POSITIONAL = inspect.Parameter.POSITIONAL_OR_KEYWORD


@pytest.fixture
def impl() -> Iterator[Any]:
    """A connection impl (what ``BlockingConnection._impl`` is) that never connects."""
    conn = SelectConnection(pika.ConnectionParameters(), internal_connection_workflow=False)
    yield conn
    conn.ioloop.close()


@pytest.fixture
def channel(impl: Any) -> Any:
    """A channel impl (what ``BlockingChannel._impl`` is), open as far as it knows."""
    ch = pika.channel.Channel(impl, 1, None)
    ch._state = ch.OPEN
    return ch


def _names(fn: Callable[..., Any]) -> list[str]:
    return list(inspect.signature(fn).parameters)


def _wrapping(impl: Any) -> Any:
    """A blocking connection or channel as _pika_private sees it: only its ``_impl``."""
    return SimpleNamespace(_impl=impl)


def test_the_blocking_objects_keep_their_impl_and_io_wait() -> None:
    source = inspect.getsource(blocking_connection.BlockingConnection.__init__)
    assert "self._impl = self._create_connection(" in source
    for cls in (blocking_connection.BlockingConnection, blocking_connection.BlockingChannel):
        kinds = [p.kind for p in inspect.signature(cls._flush_output).parameters.values()]
        assert kinds == [POSITIONAL, inspect.Parameter.VAR_POSITIONAL], cls


def test_the_frame_reader_is_called_on_the_unread_buffer(impl: Any) -> None:
    assert _names(pika.connection.Connection._read_frame) == ["self"]
    assert impl._frame_buffer == b""
    seen: list[bytes] = []

    def read(buffer: bytes) -> tuple[int, Any]:
        seen.append(bytes(buffer))
        return 0, None  # more bytes needed

    _pika_private.read_frames_with(_wrapping(impl), read)
    impl._on_data_available(b"\x02\x00")
    impl._on_data_available(b"\x01")
    assert seen == [b"\x02\x00", b"\x02\x00\x01"]


def test_a_header_pika_cannot_decode_comes_through_without_its_headers() -> None:
    # The adapter's reader (installed by read_frames_with) on pika's frame and field layout.
    at = datetime.datetime(2000, 1, 1, tzinfo=datetime.UTC)
    props = pika.BasicProperties(message_id="m", headers={"at": at}, app_id="app")
    good = pika.frame.Header(1, 5, props).marshal()
    assert _read_frame(good)[1].properties.headers == {"at": at}
    seconds = struct.pack(">Q", 946_684_800)  # 2000-01-01, as pika wrote it
    assert good.count(seconds) == 1
    bad = good.replace(seconds, struct.pack(">Q", 2**63))  # past year 9999
    with pytest.raises((ArithmeticError, ValueError, OSError)):
        pika.frame.decode_frame(bad)
    consumed, header = _read_frame(bad + b"next")
    assert consumed == len(bad)
    assert (header.channel_number, header.body_size) == (1, 5)
    assert (header.properties.message_id, header.properties.app_id) == ("m", "app")
    assert list(header.properties.headers) == [H_UNREADABLE]


def test_timers_run_from_the_io_loop_until_removed(impl: Any) -> None:
    assert _names(type(impl)._adapter_call_later) == ["self", "delay", "callback"]
    assert _names(type(impl)._adapter_remove_timeout) == ["self", "timeout_id"]
    fired: list[str] = []
    conn = _wrapping(impl)
    with _pika_private.io_timer(conn, 0.0, lambda: fired.append("inside")):
        impl.ioloop.process_timeouts()
    with _pika_private.io_timer(conn, 0.0, lambda: fired.append("after")):
        pass
    impl.ioloop.process_timeouts()
    assert fired == ["inside"]


@pytest.mark.parametrize("room", [1000, 5], ids=["whole", "partial sends"])
def test_queued_frames_go_out_in_one_send(room: int) -> None:
    sent: list[bytes] = []

    class Socket:
        def send(self, data: bytes) -> int:
            sent.append(bytes(data[:room]))
            return min(room, len(data))

    transport = object.__new__(_AsyncPlaintextTransport)
    transport._sock = Socket()
    transport._tx_buffers = collections.deque([b"method", b"header", b"body"])
    transport._tx_buffered_byte_count = 16
    _pika_private.coalesce_writes(_wrapping(SimpleNamespace(_transport=transport)))
    transport._produce()
    assert b"".join(sent) == b"methodheaderbody"
    assert len(sent) == (1 if room > 16 else 4)
    assert not transport._tx_buffers
    assert transport._tx_buffered_byte_count == 0


def test_the_channel_impl_methods_take_what_is_passed() -> None:
    channel = pika.channel.Channel
    assert _names(channel.confirm_delivery)[:2] == ["self", "ack_nack_callback"]
    assert _names(channel.add_on_return_callback) == ["self", "callback"]
    assert _names(channel.add_on_close_callback) == ["self", "callback"]
    assert _names(channel.basic_ack)[:2] == ["self", "delivery_tag"]
    assert _names(channel.basic_reject) == ["self", "delivery_tag", "requeue"]
    assert _names(channel.basic_publish) == [
        "self",
        "exchange",
        "routing_key",
        "body",
        "properties",
        "mandatory",
    ]
    assert _names(channel.basic_consume)[:4] == ["self", "queue", "on_message_callback", "auto_ack"]
    assert _names(channel.basic_cancel) == ["self", "consumer_tag", "callback"]


def test_the_consume_ok_slot_is_signalled_by_the_channels_consume_ok(channel: Any) -> None:
    blocking = blocking_connection.BlockingChannel(channel, None)
    assert blocking._impl is channel
    with blocking._basic_consume_ok_result as ok:
        assert not ok.is_ready()
        frame = pika.frame.Method(1, pika.spec.Basic.ConsumeOk(consumer_tag="ctag"))
        channel.callbacks.process(1, pika.spec.Basic.ConsumeOk, channel, frame)
        assert ok.is_ready()
    assert not blocking._basic_consume_ok_result.is_ready()


def _deliver(channel: Any, tag: str) -> None:
    method = pika.spec.Basic.Deliver(consumer_tag=tag, delivery_tag=7)
    header = pika.frame.Header(1, 1, pika.BasicProperties())
    channel._on_deliver(pika.frame.Method(1, method), header, b"x")


def test_a_cancelled_consumer_still_gets_what_was_in_transit(
    channel: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    sent: list[Any] = []
    monkeypatch.setattr(channel, "_rpc", lambda method, *args, **kwargs: sent.append(method))
    monkeypatch.setattr(channel, "basic_reject", lambda tag, **kwargs: sent.append(("reject", tag)))
    got: list[int] = []
    for tag in ("mine", "pikas"):
        channel._consumers[tag] = lambda _ch, method, _props, _body: got.append(method.delivery_tag)

    _pika_private.cancel_keeping_in_transit(_wrapping(channel), "mine")
    assert isinstance(channel._cancelled, set) and "mine" not in channel._cancelled
    [cancel] = sent
    assert isinstance(cancel, pika.spec.Basic.Cancel)
    assert (cancel.consumer_tag, cancel.nowait) == ("mine", False)
    _deliver(channel, "mine")
    assert got == [7]
    # pika's own cancel: a delivery in transit goes back to the queue.
    channel.basic_cancel("pikas", callback=lambda _frame: None)
    assert "pikas" in channel._cancelled
    _deliver(channel, "pikas")
    assert got == [7]
    assert sent[-1] == ("reject", 7)


class _Socket:
    """A non-blocking socket's ``send`` and ``recv``: takes up to ``room`` bytes a send (0:
    would block); ``recv`` hands out ``incoming`` chunk by chunk, then would block."""

    def __init__(self, room: int = 1 << 20, incoming: list[bytes] | None = None) -> None:
        self.room = room
        self.sent: list[bytes] = []
        self.incoming = collections.deque(incoming or [])
        self.recvs = 0

    def send(self, data: bytes) -> int:
        if not self.room:
            raise BlockingIOError
        self.sent.append(bytes(data[: self.room]))
        return min(self.room, len(data))

    def recv(self, size: int) -> bytes:
        self.recvs += 1
        if not self.incoming:
            raise BlockingIOError
        chunk = self.incoming.popleft()
        assert len(chunk) <= size
        return chunk

    def fileno(self) -> int:
        return -1


def _transport(impl: Any, sock: _Socket) -> Any:
    """A plaintext transport of ``impl``, active, on ``sock``, with pika's write and loop."""
    transport = object.__new__(_AsyncPlaintextTransport)
    transport._sock = sock
    transport._state = transport._STATE_ACTIVE
    transport._tx_buffers = collections.deque()
    transport._tx_buffered_byte_count = 0
    transport._protocol = impl
    watched: list[int] = []  # what pika's write asked the loop to watch for writability
    transport._nbio = SimpleNamespace(set_writer=lambda fd, _cb: watched.append(fd))
    transport.watched = watched
    impl._transport = transport
    return transport


@pytest.mark.parametrize("queued_before", [False, True])
def test_frames_go_out_at_once_unless_something_is_queued_before_them(
    impl: Any, channel: Any, queued_before: bool
) -> None:
    assert _names(_AsyncPlaintextTransport.write) == ["self", "data"]
    transport = _transport(impl, _Socket())
    if queued_before:
        transport.write(b"ack")
    impl.bytes_sent = 0
    _pika_private.send_frames(_wrapping(channel), b"frames")
    assert impl.bytes_sent == 6
    if queued_before:  # behind what is queued, in order: pika's loop sends them
        assert transport._sock.sent == []
        assert list(transport._tx_buffers) == [b"ack", b"frames"]
    else:
        assert transport._sock.sent == [b"frames"]
        assert not transport._tx_buffers and transport.watched == []


@pytest.mark.parametrize("room", [0, 2], ids=["would block", "partial send"])
def test_what_the_socket_does_not_take_is_queued_for_the_loop(
    impl: Any, channel: Any, room: int
) -> None:
    transport = _transport(impl, _Socket(room))
    _pika_private.send_frames(_wrapping(channel), b"frames")
    assert b"".join(transport._sock.sent) == b"frames"[:room]
    assert list(transport._tx_buffers) == [b"frames"[room:]]
    assert transport.watched == [-1]  # pika watches for writability to send the rest


def test_frames_on_a_closed_channel_are_refused_as_pika_refuses_a_publish(
    impl: Any, channel: Any
) -> None:
    transport = _transport(impl, _Socket())
    channel._state = channel.CLOSED
    with pytest.raises(pika.exceptions.ChannelWrongStateError):
        _pika_private.send_frames(_wrapping(channel), b"frames")
    assert transport._sock.sent == [] and not transport._tx_buffers


def test_the_largest_body_frame_is_the_connections(impl: Any, channel: Any) -> None:
    impl._body_max_length = 4088
    assert _pika_private.body_max(_wrapping(channel)) == 4088


@pytest.mark.parametrize(
    ("incoming", "recvs"),
    [([b"short"], 1), ([b"x" * 4096, b"short"], 2), ([b"x" * 4096], 2)],
    ids=["short read: stop", "full read: read again", "full read, then would block"],
)
def test_reading_stops_at_a_short_read(impl: Any, incoming: list[bytes], recvs: int) -> None:
    assert _AsyncPlaintextTransport._MAX_RECV_BYTES == 4096
    transport = _transport(impl, _Socket(incoming=incoming))
    received: list[bytes] = []
    transport._protocol = SimpleNamespace(data_received=received.append)
    _pika_private.stop_reading_at_a_short_read(_wrapping(impl))
    if recvs > len(incoming):
        with pytest.raises(BlockingIOError):  # as pika's loop ends: its caller takes it
            transport._consume()
    else:
        transport._consume()
    assert received == incoming
    assert transport._sock.recvs == recvs


def test_the_end_of_the_stream_is_reported_as_pika_reports_it(impl: Any) -> None:
    transport = _transport(impl, _Socket(incoming=[b""]))
    _pika_private.stop_reading_at_a_short_read(_wrapping(impl))
    with pytest.raises(_AsyncPlaintextTransport.RxEndOfFile):
        transport._consume()


def test_a_consumer_the_broker_cancels_reaches_the_callback_not_the_blocking_channel(
    channel: Any,
) -> None:
    frame = pika.frame.Method(1, pika.spec.Basic.Cancel(consumer_tag="ctag1.x"))
    # pika's own handler knows only the blocking channel's consumers: on the impl's, it
    # raises (and pika, inside its loop, drops the connection).
    blocking = blocking_connection.BlockingChannel(channel, None)
    with pytest.raises(KeyError):
        channel.callbacks.process(1, pika.spec.Basic.Cancel, channel, frame)
    cancelled: list[str] = []
    _pika_private.on_consumer_cancelled(blocking, cancelled.append)
    channel.callbacks.process(1, pika.spec.Basic.Cancel, channel, frame)
    assert cancelled == ["ctag1.x"]
