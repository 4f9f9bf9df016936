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
