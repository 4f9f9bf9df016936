"""The adapter's connection: the I/O thread that owns it, and the calls handed to that thread.

See the adapter's overview (:mod:`ackwise_rabbitmq._adapter`), **Threads**: pika's
``BlockingConnection`` is not thread-safe and sends heartbeats only while its I/O loop turns, so
one thread holds the connection and turns the loop; every pika call is a function handed to it
(:meth:`IOThread.call` waits for the answer, :meth:`IOThread.post` does not).  The connection's
channels live here too: the consuming one (whose closing ends the connection), the publishing
one (its confirm state: :class:`~ackwise_rabbitmq._confirms.Confirms`) and the admin one, all
used from the I/O thread only.

The I/O thread knows nothing of what is consumed: the consumer
(:mod:`ackwise_rabbitmq._consume`) listens to the connection's comings and goings through a
:class:`ConnectionListener` (:meth:`IOThread.listen`).
"""

from __future__ import annotations

import collections
import logging
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from typing import Any, Protocol, TypeVar

import pika.exceptions as px
from pika.adapters.blocking_connection import BlockingChannel, BlockingConnection

from ackwise.errors import AdapterError, BrokerUnavailable, TransientAdapterError
from ackwise_rabbitmq import _pika_private
from ackwise_rabbitmq._calls import Publish, _Call
from ackwise_rabbitmq._confirms import Confirms
from ackwise_rabbitmq._errors import translate_pika_error
from ackwise_rabbitmq._messages import _read_frame
from ackwise_rabbitmq._quiet import quiet_raised_errors
from ackwise_rabbitmq._url import RabbitMQSettings

__all__ = ["ConnectionListener", "ConnectionLost", "IOThread"]

# The adapter's one logger, named as before it was split into modules.
log = logging.getLogger("ackwise_rabbitmq._adapter")

T = TypeVar("T")

#: How long a call waits for the I/O thread beyond its own timeouts.
_CALL_SLACK = 30.0
#: While nothing consumes, the I/O thread turns the loop (heartbeats, what the broker sent)
#: at least this often (seconds) and callers run their calls themselves in between.
_PRODUCER_TURN = 0.5
#: Two turns of the loop further apart than this (seconds) make the adapter doubt the
#: connection (:attr:`IOThread._doubt`): the loop turns at least every 0.5 s while it runs.
_PAUSE = 1.0


class ConnectionLost(Exception):
    """The consuming channel or the connection is gone: every receipt of it is stale."""


class ConnectionListener(Protocol):
    """What the consumer keeps per connection hears of it here (:meth:`IOThread.listen`)."""

    def connection_began(self) -> None:
        """A new connection is up: forget what belonged to the previous one (lock held)."""

    def connection_ended(self) -> None:
        """The connection is gone: forget its deliveries (lock held)."""

    def consumer_cancelled(self, tag: str) -> None:
        """The broker cancelled the consumer ``tag`` (its queue was deleted) (I/O thread)."""


def _noop() -> None:
    pass


class IOThread:
    """The connection, the I/O thread that turns its loop, and the calls handed to it.

    It owns the lock (a condition: the consumer guards its state with it too, and a receive
    waits on it), the connection's generation (a receipt's first half) and whether it is
    alive.
    """

    def __init__(self, settings: RabbitMQSettings) -> None:
        self.settings = settings
        #: Guards what follows, and the consumer's state (:mod:`~ackwise_rabbitmq._consume`).
        self.lock = threading.Condition()
        #: The connection's generation: a receipt's first half.
        self.generation = 0
        #: A connection is up and the I/O thread serves it.
        self.alive = False
        self._listener: ConnectionListener | None = None
        self._confirms = Confirms(settings)
        self._thread: threading.Thread | None = None
        self._conn: BlockingConnection | None = None
        self._calls: collections.deque[_Call] = collections.deque()
        self._closing = False
        self._failure: AdapterError | None = None
        self._user_closed = False
        # Owned by the I/O thread:
        self._consume_ch: BlockingChannel | None = None
        self._admin_ch: BlockingChannel | None = None
        self._consume_closed: str | None = None
        self._last_turn = 0.0  # when the I/O loop last took in what the socket held
        #: Two turns of the loop came further apart than :data:`_PAUSE` (this process was
        #: paused, say): the connection may have died meanwhile without a turn since telling
        #: it (a turn stops at a short read, and the broker's heartbeats come before its
        #: close), so a late ack waits for the broker's answer to a barrier until one came.
        self._doubt = False
        #: Held by whoever touches the connection: the I/O thread as it turns the loop, or,
        #: while nothing consumes, a caller running calls itself (:meth:`call`).
        self._holder = threading.Lock()
        #: Something consumes on this connection (a ``receive`` came): deliveries arrive at
        #: any time, so the I/O thread turns the loop without pause and runs every call.
        self._consuming = False
        self._wake = threading.Event()  # wakes the I/O thread between its producer turns
        #: The connection's holder is publishing and waits for confirms on the socket: a
        #: publish queued meanwhile wakes it there to go out at once (:meth:`_run_publishes`).
        self._streaming = False
        #: A receiver turns the loop itself while it waits for a delivery (:meth:`drive`).
        self._driving = False
        #: The I/O thread stands aside: for a receiver that drives, and after it until a call
        #: wakes it (:attr:`_wake`) or :data:`_PRODUCER_TURN` passes, so that its wake-up
        #: does not compete with the start of the task just taken in.  Calls made meanwhile
        #: run on their callers' threads when the connection is free (:meth:`_run_own_call`).
        self._aside = False
        self._driver_error: BaseException | None = None  # the I/O thread shuts down on it

    def listen(self, listener: ConnectionListener) -> None:
        """Tell ``listener`` of every connection from the next one on (one listener)."""
        self._listener = listener

    # -- what the consumer asks of the connection ------------------------------------------
    @property
    def aside(self) -> bool:
        """The I/O thread stands aside since a receive drove (:attr:`_aside`)."""
        return self._aside

    def consuming(self) -> None:
        """Something consumes on this connection: the I/O thread turns the loop without
        pause from now on."""
        self._consuming = True

    def fresh(self, within: float) -> bool:
        """The loop turned less than ``within`` seconds ago, and no two turns came far apart
        since the broker last answered (:attr:`_doubt`)."""
        return not self._doubt and time.monotonic() - self._last_turn < within

    def answered(self) -> None:
        """The broker answered a barrier sent after a pause: the connection lives."""
        self._doubt = False

    @property
    def consume_channel(self) -> BlockingChannel:
        """The consuming channel (I/O thread)."""
        ch = self._consume_ch
        assert ch is not None
        return ch

    def consume_channel_of(self, generation: int) -> BlockingChannel | None:
        """The consuming channel if it is open and of connection ``generation`` (I/O
        thread)."""
        ch = self._consume_ch
        if generation != self.generation or ch is None or not ch.is_open:
            return None
        return ch

    # -- lifecycle -------------------------------------------------------------------------
    def open(self) -> None:
        with self.lock:
            if self.alive and self._thread is not None and self._thread.is_alive():
                return
        quiet_raised_errors()  # ackwise reports what pika raises; pika need not log it too
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
        with self.lock:
            self._closing = True
            conn = self._conn
        self._wake.set()
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
        listener = self._listener
        try:
            conn = BlockingConnection(self.settings.connection_parameters())
            _pika_private.read_frames_with(conn, _read_frame)
            _pika_private.coalesce_writes(conn)
            _pika_private.stop_reading_at_a_short_read(conn)
            consume = conn.channel()
            publish = conn.channel()
            self._confirms.watch(publish)
            _pika_private.on_channel_close(consume, self._on_consume_closed)
            if listener is not None:
                _pika_private.on_consumer_cancelled(consume, listener.consumer_cancelled)
        except BaseException as exc:
            box.append(exc)
            ready.set()
            return
        with self.lock:
            self._conn = conn
            self._consume_ch, self._admin_ch = consume, None
            self._consume_closed = None
            self._driver_error = None  # the previous connection's
            if listener is not None:
                listener.connection_began()
            self._confirms.begin(publish)
            self.generation += 1
            self.alive = True
            self._failure = None
            # The handshake was the broker's answer just now: nothing to doubt yet.
            self._doubt = False
            self._last_turn = time.monotonic()
        ready.set()
        error: BaseException | None = None
        try:
            while not self._closing:
                if self._aside:
                    self._wake.wait(_PRODUCER_TURN)
                    self._wake.clear()
                    if self._driving:
                        continue
                    self._aside = False
                consuming = self._consuming
                self._wake.clear()
                if not consuming and not self._calls:
                    idle = time.monotonic() - self._last_turn
                    if idle < _PRODUCER_TURN:
                        # A producer's own call turned the loop just now: a turn here would
                        # only take the connection from under its next call.
                        self._wake.wait(_PRODUCER_TURN - idle)
                        continue
                with self._holder:
                    if self._driver_error is not None:
                        raise self._driver_error
                    conn.process_data_events(time_limit=0.5 if consuming else 0)
                    self._turned()
                    self._run_calls()
                    if self._consume_closed is not None:
                        raise ConnectionLost(self._consume_closed)
                if not consuming and not self._calls:
                    self._wake.wait(_PRODUCER_TURN)
        except BaseException as exc:
            error = exc
        # A receiver may be driving the connection, a producer running its own call: closing
        # it under them would break their frames.  Each leaves within its deadline.
        held = self._holder.acquire(timeout=self.settings.confirm_timeout)
        try:
            self._shutdown(conn, error)
        finally:
            if held:
                self._holder.release()

    def _shutdown(self, conn: BlockingConnection, error: BaseException | None) -> None:
        if error is not None and not self._closing:
            failure: AdapterError
            if isinstance(error, ConnectionLost):
                failure = TransientAdapterError(f"{self.settings.where}: {error}")
            else:
                failure = translate_pika_error(error, self.settings.where, self.settings.password)
            log.warning("RabbitMQ connection lost: %s", failure)
        else:
            failure = BrokerUnavailable(f"{self.settings.where}: the adapter is closed")
        with self.lock:
            self.alive = False
            self._failure = failure
            if self._listener is not None:
                self._listener.connection_ended()
            calls = list(self._calls)
            self._calls.clear()
            self.lock.notify_all()
        for call in calls:
            call.error = failure
            call.done.set()
        try:
            if conn.is_open:
                # Closing the connection returns every unsettled delivery to its queue at once.
                conn.close()
        except Exception:
            log.debug("closing the connection failed", exc_info=True)

    def drive(self, ready: Callable[[], bool], deadline: float, *, take: bool = True) -> None:
        """Turn the connection's loop on this thread until ``ready()``, ``deadline``
        (monotonic) or a close, running the calls queued meanwhile: a receiver waiting for a
        delivery takes it in itself, without the I/O thread's hand-off (a thread wake-up,
        ~0.1 ms, off every idle worker's task start).

        ``take``: take the connection from the I/O thread (it stands aside from then on,
        :attr:`_aside`, until a call wakes it); else turn only if it stands aside and the
        connection is free (a receiver that finds nothing, so that the loop turns without
        waking the I/O thread just as the task taken in starts).  A failure of the connection
        is left to the I/O thread to shut down on (the receiver then finds the adapter
        closed).  Returns at once when another receiver drives or the connection cannot be
        taken in time.
        """
        with self.lock:
            conn = self._conn
            if self._driving or not self.alive or conn is None or self._driver_error:
                return
            if not (take or self._aside):
                return
            self._driving = self._aside = True
        wake = False  # the I/O thread takes over: the connection failed here, or never came
        try:
            if not self._holder.acquire(blocking=False):
                if not take:
                    return
                try:
                    conn.add_callback_threadsafe(_noop)  # out of its wait on the socket
                except px.ConnectionWrongStateError:
                    wake = True  # closed or closing: the I/O thread shuts down on it
                    return
                if not self._holder.acquire(timeout=max(0.0, deadline - time.monotonic())):
                    wake = True
                    return
            try:
                self._drive_held(conn, ready, deadline)
            except BaseException as exc:
                self._driver_error = exc
                wake = True
                if not isinstance(exc, Exception):
                    raise
            finally:
                self._holder.release()
        finally:
            self._driving = False
            if wake:
                self._wake.set()

    def _drive_held(
        self, conn: BlockingConnection, ready: Callable[[], bool], deadline: float
    ) -> None:
        expired = False

        def expire() -> None:
            nonlocal expired
            expired = True

        def stop() -> bool:
            return (
                expired
                or bool(self._calls)
                or self._closing
                or self._consume_closed is not None
                or ready()
            )

        with _pika_private.io_timer(conn, max(0.0, deadline - time.monotonic()), expire):
            while True:
                self._run_calls()
                if self._consume_closed is not None:
                    raise ConnectionLost(self._consume_closed)
                if expired or self._closing or ready():
                    return
                _pika_private.flush(conn, stop)
                self._turned()

    def _turned(self) -> None:
        """A turn of the loop ended: note when, and doubt the connection after a long gap."""
        now = time.monotonic()
        if now - self._last_turn > _PAUSE and self._last_turn:
            self._doubt = True
        self._last_turn = now

    def _run_calls(self, until: _Call | None = None) -> None:
        """Run the queued calls (holding :attr:`_holder`), all of them or until ``until`` is
        done."""
        while until is None or not until.done.is_set():
            with self.lock:
                if not self._calls:
                    return
                call = self._calls.popleft()
            if call.publish is not None:
                self._run_publishes(call, until)
                continue
            try:
                call.result = call.fn()
            except BaseException as exc:
                call.error = exc
                if call.detached:
                    log.warning("RabbitMQ: a posted operation failed: %r", exc)
                conn = self._conn
                if conn is None or not conn.is_open or isinstance(exc, ConnectionLost):
                    call.done.set()
                    raise
            call.done.set()

    def _run_publishes(self, call: _Call, until: _Call | None) -> None:
        """Run ``call`` and the publish calls that queue up behind it while confirms are
        awaited (publishes from several threads): their messages go out as they come, each
        call is completed by its own confirms.  Behind ``until`` (a caller running its own
        call), no more are taken once it is done: they are the I/O thread's."""
        self._streaming = True
        try:
            conn = self._conn
            assert conn is not None
            self._confirms.stream(
                conn,
                [call],
                self._take_publishes,
                lambda: until is None or not until.done.is_set(),
                self._publish_waiting,
            )
        except BaseException:
            conn = self._conn
            if conn is None or not conn.is_open:
                raise
        finally:
            self._streaming = False

    def _publish_waiting(self) -> bool:
        """A publish call is first in the queue."""
        calls = self._calls
        return bool(calls) and calls[0].publish is not None

    def _take_publishes(self) -> list[_Call]:
        """The publish calls at the head of the queue (a call of another kind stops them)."""
        taken = []
        with self.lock:
            while self._calls and self._calls[0].publish is not None:
                taken.append(self._calls.popleft())
        return taken

    def publish_call(self, items: Sequence[Publish]) -> None:
        """Publish ``items`` on the I/O thread, confirmed (see :meth:`_run_calls`)."""
        self.call(lambda: self.publish_now(items), publish=items)

    def publish_now(self, items: Sequence[Publish]) -> None:
        """Publish ``items`` with ``mandatory`` and wait for every confirm (I/O thread): one
        round trip for them all."""
        conn = self._conn
        assert conn is not None
        call = _Call(_noop, publish=items)
        self._confirms.stream(conn, [call], list, _never, _never)
        if call.error is not None:
            raise call.error

    def post(self, fn: Callable[[], None]) -> None:
        """Run ``fn`` on this thread if the connection is free for it (:meth:`_run_own_call`),
        else hand it to the I/O thread and return at once (its errors are logged)."""
        call = _Call(fn, detached=True)
        with self.lock:
            if not self.alive:
                raise self._failure or BrokerUnavailable(
                    f"{self.settings.where}: the adapter is not open"
                )
            wake = not self._calls  # else a wake-up is on its way already
            self._calls.append(call)
            conn = self._conn
        if self._run_own_call(call):
            # Ran here: what it queued went out, or the connection broke as it was sent (an
            # ack sent into a connection the broker closed is not taken in: say so).
            self._raise_for(call)
            return
        if wake:
            assert conn is not None
            self._wake_io_thread(conn)

    def _wake_io_thread(self, conn: BlockingConnection) -> None:
        """Have the I/O thread turn now: out of its wait for the socket, or between turns.

        Only a consuming I/O thread waits for the socket (0.5 s turns), and a holder of the
        connection awaiting confirms (which sends a queued publish at once); otherwise the
        I/O thread waits between its turns only.
        """
        self._wake.set()
        if not (self._consuming or self._streaming):
            return
        try:
            conn.add_callback_threadsafe(_noop)
        except Exception as exc:
            raise BrokerUnavailable(f"{self.settings.where}: connection closed") from exc

    def _run_own_call(self, call: _Call) -> bool:
        """Run ``call`` on this thread if the connection is free and no thread turns its
        loop for consumers (:meth:`_runs_here`): with the calls queued before it, until it
        is done; what they queued (acks) is sent before this returns.  No hand-off to the
        I/O thread and back (two thread wake-ups).  Calls queued meanwhile are the I/O
        thread's.  Whether it ran here."""
        if not self._runs_here() or not self._holder.acquire(blocking=False):
            return False
        try:
            conn = self._conn
            if not self._runs_here() or conn is None or not conn.is_open:
                return False  # a receive began meanwhile, or the I/O thread has a loss to report
            self._run_calls(until=call)
            if self._consuming:
                _pika_private.flush(conn)  # no loop turns to send it: the I/O thread stands aside
            self._turned()  # its confirm wait took in what came
        except BaseException as exc:
            # The connection broke under a call, or as what it queued was sent: the I/O
            # thread shuts down on it, and the call failed either way.
            if call.error is None:
                call.error = exc
            call.done.set()
            self._driver_error = exc
            self._wake.set()
            if not isinstance(exc, Exception):
                raise
        finally:
            self._holder.release()
            if self._calls or not call.done.is_set():
                self._wake.set()
        return call.done.is_set()

    def _runs_here(self) -> bool:
        """A caller may run its calls itself: nothing consumes on this connection (the I/O
        thread turns the loop only now and then), or the I/O thread stands aside for
        receivers (:attr:`_aside`) and none turns the loop now."""
        if self._driver_error is not None:
            return False  # the connection failed under a caller: the I/O thread shuts down
        return not self._consuming or (self._aside and not self._driving)

    def call(
        self,
        fn: Callable[[], T],
        timeout: float | None = None,
        *,
        publish: Sequence[Publish] | None = None,
    ) -> T:
        """Run ``fn`` on the I/O thread, or while nothing consumes on this thread when the
        connection is free (:meth:`_run_own_call`), and return its result (errors mapped).

        A connection that was lost (not closed by the caller) is opened again first, once:
        a producer or an inspector needs no receipts of the old one.  ``receive`` does not
        come here: a consumer learns of the loss and reconnects with its backoff.
        """
        call = _Call(fn, publish=publish)
        reopened = False
        while True:
            with self.lock:
                if self.alive:
                    self._calls.append(call)
                    conn = self._conn
                    break
                if reopened or self._thread is None or self._user_closed:
                    raise self._failure or BrokerUnavailable(
                        f"{self.settings.where}: the adapter is not open"
                    )
            self.open()
            reopened = True
        assert conn is not None
        if not self._run_own_call(call):
            self._wake_io_thread(conn)
        limit = (timeout or self.settings.confirm_timeout) + _CALL_SLACK
        deadline = time.monotonic() + limit
        while not call.done.wait(0.5):
            thread = self._thread
            if thread is None or not thread.is_alive() or time.monotonic() > deadline:
                raise BrokerUnavailable(f"{self.settings.where}: the I/O thread stopped answering")
        self._raise_for(call)
        return call.result  # type: ignore[no-any-return]

    def _raise_for(self, call: _Call) -> None:
        """Raise the error of a finished ``call``, mapped to ackwise's (none: return)."""
        error = call.error
        if error is None:
            return
        if isinstance(error, AdapterError):
            raise error
        if isinstance(error, ConnectionLost):
            raise TransientAdapterError(f"{self.settings.where}: {error}") from error
        raise translate_pika_error(error, self.settings.where, self.settings.password) from error

    # -- callbacks (I/O thread) ------------------------------------------------------------
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
    def admin(self) -> BlockingChannel:
        """The admin channel: declarations, counts, purges (I/O thread)."""
        ch = self._admin_ch
        if ch is None or not ch.is_open:
            assert self._conn is not None
            ch = self._admin_ch = self._conn.channel()
        return ch

    @contextmanager
    def temp_channel(self) -> Iterator[BlockingChannel]:
        """A channel of its own, closed after use (I/O thread)."""
        assert self._conn is not None
        ch = self._conn.channel()
        try:
            yield ch
        finally:
            if ch.is_open:
                ch.close()  # what was taken and not acked goes back, in order

    # -- liveness --------------------------------------------------------------------------
    def ensure_open(self) -> None:
        """Raise why the adapter is not open, if it is not."""
        with self.lock:
            if self.alive:
                return
            failure = self._failure
        raise failure or BrokerUnavailable(f"{self.settings.where}: the adapter is not open")

    def check_live(self) -> None:
        """Notice a connection the broker closed (e.g. while this process was stopped) (I/O
        thread)."""
        conn = self._conn
        assert conn is not None
        conn.process_data_events(time_limit=0)
        self.raise_if_lost()

    def raise_if_lost(self) -> None:
        """Raise :class:`ConnectionLost` if the consuming channel closed (I/O thread)."""
        if self._consume_closed is not None:
            raise ConnectionLost(self._consume_closed)


def _never() -> bool:
    return False
