"""A receive that waits turns the connection's loop on its own thread (no hand-off from the
I/O thread): what other threads hand to the connection meanwhile still goes out at once, and
a connection that breaks under it is reported at once, not when the wait ends."""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Sequence

from pika import BlockingConnection

from ackwise import open_adapter
from ackwise.errors import StaleReceipt, TransientAdapterError
from ackwise.spi import Delivery, Outgoing, QueueSpec
from ackwise_conformance.brokers import BrokerHandle
from ackwise_conformance.harness import with_options
from ackwise_conformance.helpers import eventually
from ackwise_conformance.proxy import FaultProxy
from ackwise_rabbitmq import RabbitMQAdapter

WAIT = 20.0  # a receive's wait: far longer than anything below may take


def _queue() -> str:
    return f"drive-{uuid.uuid4().hex[:12]}"


def _adapter(url: str) -> RabbitMQAdapter:
    adapter = open_adapter(url)
    assert isinstance(adapter, RabbitMQAdapter)
    adapter.open()
    return adapter


class _Receiver(threading.Thread):
    """One ``receive(queue, wait=WAIT)`` on a thread of its own; what it got or raised."""

    def __init__(self, adapter: RabbitMQAdapter, queue: str) -> None:
        super().__init__(daemon=True)
        self.adapter, self.queue = adapter, queue
        self.got: Sequence[Delivery] = []
        self.error: BaseException | None = None
        self.ended = 0.0

    def run(self) -> None:
        try:
            self.got = self.adapter.receive(self.queue, max_messages=1, wait=WAIT, lease=30.0)
        except BaseException as exc:
            self.error = exc
        self.ended = time.monotonic()


def _delete(url: str, *queues: str) -> None:
    """Delete ``queues`` from an adapter that does not consume them (a consumed queue's
    deletion cancels its consumers, which costs the consuming connection)."""
    adapter = _adapter(url)
    try:
        for queue in queues:
            adapter.delete_queue(queue)
    finally:
        adapter.close()


def _driving(adapter: RabbitMQAdapter) -> bool:
    return adapter._io._driving  # the receive holds the connection: the case under test


def test_calls_from_other_threads_run_while_a_receive_waits(rabbitmq_url: str) -> None:
    adapter = _adapter(rabbitmq_url)
    waited, other = _queue(), _queue()
    try:
        adapter.declare(QueueSpec(waited))
        adapter.declare(QueueSpec(other))
        receiver = _Receiver(adapter, waited)
        receiver.start()
        eventually(lambda: _driving(adapter), 5.0, description="the receive drives")
        started = time.monotonic()
        adapter.publish(other, [Outgoing("other", b"x")])  # confirmed: a round trip
        adapter.publish(waited, [Outgoing("waited", b"x")])
        assert adapter.stats(other).ready == 1
        assert time.monotonic() - started < 5.0, "the calls waited for the receive's wait"
        receiver.join(WAIT + 5)
        assert receiver.error is None
        assert [d.message_id for d in receiver.got] == ["waited"]
        assert receiver.ended - started < 5.0
        adapter.ack(receiver.got)
    finally:
        adapter.close()
        _delete(rabbitmq_url, waited, other)


def test_a_connection_cut_under_a_waiting_receive_is_reported_at_once(
    rabbitmq_broker: BrokerHandle,
) -> None:
    queue = _queue()
    with FaultProxy(rabbitmq_broker.host, rabbitmq_broker.port).start() as proxy:
        adapter = _adapter(with_options(rabbitmq_broker.url_via(*proxy.address), heartbeat=2))
        try:
            adapter.declare(QueueSpec(queue))
            receiver = _Receiver(adapter, queue)
            receiver.start()
            eventually(lambda: _driving(adapter), 5.0, description="the receive drives")
            cut = time.monotonic()
            proxy.reset()
            receiver.join(WAIT + 5)
            assert isinstance(receiver.error, TransientAdapterError), receiver.error
            assert receiver.ended - cut < 5.0, "the loss was noticed only when the wait ended"
            # A reconnect (what the worker does on a transient error) works again.
            adapter.close()
            adapter.open()
            adapter.publish(queue, [Outgoing("after", b"x")])
            (d,) = adapter.receive(queue, max_messages=1, wait=10.0, lease=5.0)
            assert d.message_id == "after"
            adapter.ack([d])
        finally:
            adapter.close()
        _delete(rabbitmq_broker.url, queue)


def test_closing_the_adapter_ends_a_waiting_receive(rabbitmq_url: str) -> None:
    adapter = _adapter(rabbitmq_url)
    queue = _queue()
    adapter.declare(QueueSpec(queue))
    receiver = _Receiver(adapter, queue)
    receiver.start()
    eventually(lambda: _driving(adapter), 5.0, description="the receive drives")
    started = time.monotonic()
    adapter.close()
    receiver.join(WAIT + 5)
    assert receiver.ended - started < 5.0
    assert not receiver.got
    _delete(rabbitmq_url, queue)


def test_a_receive_that_finds_the_connection_closed_leaves_it_to_the_io_thread(
    rabbitmq_url: str,
) -> None:
    """The connection closed (a cluster node killed) while the I/O thread held it and before
    it noticed: a receive that asks the I/O thread to stand aside must not raise pika's
    ConnectionWrongStateError, which no worker maps (CI: the worker died with it, and the
    cluster failover test's queue never drained).  It returns, the I/O thread shuts down on
    the closed connection, and the receive reports a transient error the worker survives."""
    adapter = _adapter(rabbitmq_url)
    io = adapter._io
    live = io._conn
    closed = BlockingConnection(adapter.settings.connection_parameters())
    closed.close()
    try:
        with io._holder:  # as if the I/O thread were in its turn
            io._conn = closed
            try:
                io.drive(lambda: False, time.monotonic() + 1.0)
            finally:
                io._conn = live
    finally:
        adapter.close()


def test_an_ack_while_the_io_thread_stands_aside_goes_out_from_the_caller(
    rabbitmq_url: str, monkeypatch
) -> None:
    """After a receive drove, the I/O thread stands aside: an ack then runs on the acking
    thread and is sent before ``ack`` returns, instead of waking the I/O thread to take the
    connection back (two thread wake-ups per settled batch, and the next receive taking it
    from the I/O thread again)."""
    from ackwise_rabbitmq import _pika_private

    adapter = _adapter(rabbitmq_url)
    queue = _queue()
    acked_on: list[str] = []
    send_ack = _pika_private.send_ack

    def recording(ch, tag):  # type: ignore[no-untyped-def]
        acked_on.append(threading.current_thread().name)
        send_ack(ch, tag)

    try:
        adapter.declare(QueueSpec(queue))
        adapter.publish(queue, [Outgoing("m", b"x")])
        (d,) = adapter.receive(queue, max_messages=1, wait=WAIT, lease=30.0)
        assert adapter._io.aside, "the receive drove: the I/O thread stands aside"
        monkeypatch.setattr(_pika_private, "send_ack", recording)
        adapter.ack([d])
        assert acked_on == [threading.current_thread().name]
        # Sent, not only queued for a turn of the loop that nothing would make.
        conn = adapter._io._conn
        assert conn is not None
        assert conn._impl._transport.get_write_buffer_size() == 0
        adapter.close()  # what the broker did not take an ack for would go back to the queue
        observer = _adapter(rabbitmq_url)
        try:
            assert observer.stats(queue).ready == 0
        finally:
            observer.close()
    finally:
        adapter.close()
        _delete(rabbitmq_url, queue)


def test_calls_after_the_connection_broke_under_a_caller_report_a_transient_loss(
    rabbitmq_broker: BrokerHandle,
) -> None:
    """Defect (found by the crash suite): a caller running its own call found the connection
    gone; the next caller ran its call on the closed connection too and pika raised
    ``ValueError: Timeout closed before call``, which the worker took for a permanent error
    and stopped on.  Every call after the loss reports a transient one (early acks: stale)."""
    queue = _queue()
    with FaultProxy(rabbitmq_broker.host, rabbitmq_broker.port).start() as proxy:
        adapter = _adapter(with_options(rabbitmq_broker.url_via(*proxy.address), heartbeat=2))
        try:
            adapter.declare(QueueSpec(queue))
            adapter.publish(queue, [Outgoing("a", b"x"), Outgoing("b", b"x")])
            got: list[Delivery] = []
            while len(got) < 2:
                got += adapter.receive(queue, max_messages=2, wait=WAIT, lease=30.0)
            assert adapter._io.aside, "the receive drove: callers run their own calls"
            proxy.reset()
            time.sleep(0.2)  # the reset has reached the adapter's socket
            for d in got:
                try:
                    adapter.ack_before_start([d])
                except (StaleReceipt, TransientAdapterError):
                    pass  # what a lost connection must look like
                else:
                    raise AssertionError("an early ack went through a cut connection")
        finally:
            adapter.close()
    _delete(rabbitmq_broker.url, queue)
