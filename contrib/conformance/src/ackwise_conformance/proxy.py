"""A TCP fault proxy: stand it between workers and a broker to cut, black-hole or slow the link.

::

    with FaultProxy("127.0.0.1", broker_port).start() as proxy:
        url = handle.url_via("127.0.0.1", proxy.port)   # point the workers here
        ...
        proxy.reset(3.0)      # RST every connection, turn new ones away for 3 s, then heal
        proxy.blackhole(5.0)  # a partition: connections stay open, no byte gets through
        proxy.delay(0.2)      # 200 ms more latency on every chunk, both ways, until heal()

One thread runs a ``selectors`` event loop for the listener and every connection, so a
fault applies to all connections at the same instant, latency is added per chunk (not per
connection round trip), and :meth:`FaultProxy.stop` returns promptly whatever the peers do.
Fault methods hand their work to that thread and return once it is done: after ``reset()``
returns, every connection that was open is gone.

The proxy only ever connects to the one upstream address it was built with.

Choices worth knowing:

* Turning a connection away (during ``reset(duration)``) means accepting it and closing it at
  once with an RST: the listener keeps its port, so a client sees its connection reset (or
  EOF) rather than ``ECONNREFUSED``.
* A black-holed connection is **reset when the black hole ends**.  A real partition's TCP
  sessions do not resume cleanly (retransmissions have timed out, keepalives have failed,
  one side has given up), and resuming them byte-exact would hide exactly the bugs a
  partition test is for: the client has to notice and reconnect.  Bytes in flight when the
  black hole starts are dropped too, and a FIN sent into the black hole is not delivered.
  Connections accepted during the black hole are not connected upstream at all.
* ``reset()`` ends a black hole (its connections are gone) but leaves a ``delay()`` in place.
"""

from __future__ import annotations

import errno
import logging
import selectors
import socket
import struct
import threading
import time
from collections import deque
from collections.abc import Callable
from types import TracebackType

__all__ = ["FaultProxy"]

logger = logging.getLogger(__name__)

_CHUNK = 65536
# Stop reading a direction while this much is queued for it (a delayed or slow peer).
_HIGH_WATER = 1 << 20
_CONNECT_TIMEOUT = 5.0
# Upper bound on one select(): timers and commands also wake the loop, this is a safety net.
_MAX_WAIT = 0.25
_STOP_TIMEOUT = 2.0
_COMMAND_TIMEOUT = 5.0
# SO_LINGER on with a zero timeout: close() sends an RST instead of a FIN.
_LINGER_ABORT = struct.pack("ii", 1, 0)


def _abort(sock: socket.socket) -> None:
    """Close ``sock`` abruptly: the peer gets an RST, not a FIN."""
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, _LINGER_ABORT)
    except OSError:
        pass
    try:
        sock.close()
    except OSError:
        pass


class _Pipe:
    """One direction of a link: bytes read from ``src``, queued (with a due time) for ``dst``."""

    __slots__ = ("blocked", "buffered", "direction", "dst", "eof", "queue", "shut", "src")

    def __init__(self, src: socket.socket, dst: socket.socket | None, direction: str) -> None:
        self.src = src
        self.dst = dst
        self.direction = direction  # "up" (client -> broker) or "down"
        self.queue: deque[tuple[float, bytes]] = deque()
        self.buffered = 0
        self.eof = False  # src sent its FIN
        self.shut = False  # that FIN was passed on to dst
        self.blocked = False  # dst's send buffer is full: wait for it to become writable

    def drop(self) -> int:
        dropped = self.buffered
        self.queue.clear()
        self.buffered = 0
        self.blocked = False
        return dropped


class _Link:
    """A client connection and its upstream connection (``None`` when never connected)."""

    __slots__ = ("blackholed", "client", "connect_deadline", "down", "masks", "up", "upstream")

    def __init__(self, client: socket.socket, upstream: socket.socket | None) -> None:
        self.client = client
        self.upstream = upstream
        self.up = _Pipe(client, upstream, "up")
        self.down = _Pipe(upstream, client, "down") if upstream is not None else None
        self.connect_deadline: float | None = None  # set while the upstream connect is pending
        self.blackholed = False
        self.masks: dict[socket.socket, int] = {}

    @property
    def pipes(self) -> list[_Pipe]:
        return [self.up] if self.down is None else [self.up, self.down]

    @property
    def sockets(self) -> list[socket.socket]:
        return [self.client] if self.upstream is None else [self.client, self.upstream]


_LISTENER = "listener"
_WAKER = "waker"


class FaultProxy:
    """A TCP proxy to one upstream address that injects network faults on demand.

    :param upstream_host: the broker's host (the only address the proxy ever connects to).
    :param upstream_port: the broker's port.
    :param listen_host: where to listen for clients.
    :param listen_port: the port to listen on; 0 (the default) picks a free one, see
        :attr:`port`.
    """

    def __init__(
        self,
        upstream_host: str,
        upstream_port: int,
        listen_host: str = "127.0.0.1",
        listen_port: int = 0,
    ) -> None:
        self.upstream = (upstream_host, upstream_port)
        self._listen = (listen_host, listen_port)
        # Guards the command queue, the link set and the counters (read from other threads).
        self._lock = threading.RLock()
        self._serving = False
        self._address: tuple[str, int] | None = None
        self._commands: deque[tuple[Callable[[float], None], threading.Event]] = deque()
        self._thread: threading.Thread | None = None
        self._listener: socket.socket | None = None
        self._waker_r: socket.socket | None = None
        self._waker_w: socket.socket | None = None
        self._selector: selectors.BaseSelector | None = None
        self._stopping = False
        self._stopped = False
        self._links: set[_Link] = set()
        # Fault state, touched only by the loop thread (or directly before start).
        self._refuse_until: float | None = None
        self._blackhole_until: float | None = None  # inf: until heal()
        self._delay = 0.0
        self._delay_until: float | None = None  # None: until heal()
        self._stats = {
            "accepted": 0,
            "refused": 0,
            "reset": 0,
            "upstream_failed": 0,
            "bytes_up": 0,
            "bytes_down": 0,
            "dropped": 0,
        }

    # -- lifecycle ---------------------------------------------------------------------------
    def start(self) -> FaultProxy:
        """Bind the listening socket and serve in a background thread; return ``self``."""
        if self._thread is not None:
            raise RuntimeError("FaultProxy.start() called twice")
        listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        try:
            listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            listener.bind(self._listen)
            listener.listen(256)
            listener.setblocking(False)
        except OSError:
            listener.close()
            raise
        self._listener = listener
        host, port = listener.getsockname()[:2]
        self._address = (host, port)
        self._waker_r, self._waker_w = socket.socketpair()
        self._waker_r.setblocking(False)
        self._waker_w.setblocking(False)
        self._selector = selectors.DefaultSelector()
        self._selector.register(listener, selectors.EVENT_READ, _LISTENER)
        self._selector.register(self._waker_r, selectors.EVENT_READ, _WAKER)
        self._thread = threading.Thread(
            target=self._run, name=f"FaultProxy:{port}->{self.upstream[1]}", daemon=True
        )
        self._serving = True
        self._thread.start()
        logger.debug("fault proxy listening on %s:%d -> %s:%d", *self.address, *self.upstream)
        return self

    def stop(self) -> None:
        """Close the listener and every connection (with an RST), and join the thread.

        Returns within about two seconds whatever the peers do; calling it again is harmless.
        """
        thread = self._thread
        if thread is None or self._stopped:
            self._stopped = True
            return
        self._stopping = True
        self._wake()
        thread.join(_STOP_TIMEOUT)
        if thread.is_alive():  # pragma: no cover - the loop never blocks longer than _MAX_WAIT
            logger.warning("fault proxy thread did not stop within %.1fs", _STOP_TIMEOUT)
        self._stopped = True

    def __enter__(self) -> FaultProxy:
        if self._thread is None:
            self.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()

    # -- introspection -----------------------------------------------------------------------
    @property
    def address(self) -> tuple[str, int]:
        """``(host, port)`` the proxy listens on."""
        if self._address is None:
            raise RuntimeError("FaultProxy is not started")
        return self._address

    @property
    def port(self) -> int:
        """The port to point clients at (known once :meth:`start` has run)."""
        return self.address[1]

    @property
    def connections(self) -> int:
        """Client connections currently open through the proxy."""
        with self._lock:
            return len(self._links)

    @property
    def stats(self) -> dict[str, int]:
        """Counters since start.

        ``accepted`` client connections served, ``refused`` (turned away during a reset),
        ``reset`` (connections the proxy closed with an RST: faults, and a peer's reset passed
        on), ``upstream_failed`` (the broker refused or did not answer), ``bytes_up`` (client
        to broker) and ``bytes_down`` delivered, ``dropped`` (bytes lost in a black hole).
        """
        with self._lock:
            return dict(self._stats)

    # -- faults ------------------------------------------------------------------------------
    def reset(self, duration: float = 0.0) -> None:
        """Close every connection with an RST; for ``duration`` seconds reset new ones too.

        Ends a black hole; a delay stays.  On return the connections are closed.
        """
        duration = _non_negative("duration", duration)

        def apply(now: float) -> None:
            self._blackhole_until = None
            for link in list(self._links):
                self._abort_link(link)
            self._refuse_until = now + duration if duration > 0 else None

        self._submit(apply)

    def blackhole(self, duration: float) -> None:
        """For ``duration`` seconds, let no byte through in either direction; then heal.

        Connections stay open (new ones are accepted) but everything sent is dropped.  When the
        black hole ends (after ``duration`` or at :meth:`heal`) the connections it held are
        reset: see the module documentation for why.
        """
        duration = _non_negative("duration", duration)

        def apply(now: float) -> None:
            self._blackhole_until = now + duration
            for link in self._links:
                self._blackhole_link(link)

        self._submit(apply)

    def delay(self, seconds: float, duration: float | None = None) -> None:
        """Hold every chunk for ``seconds`` before passing it on, both ways.

        :param duration: how long the delay lasts; ``None`` until :meth:`heal`.
        """
        seconds = _non_negative("seconds", seconds)
        if duration is not None:
            duration = _non_negative("duration", duration)

        def apply(now: float) -> None:
            self._delay = seconds
            self._delay_until = None if duration is None else now + duration

        self._submit(apply)

    def heal(self) -> None:
        """Back to plain pass-through at once (black-holed connections are reset)."""

        def apply(now: float) -> None:
            self._refuse_until = None
            self._end_blackhole()
            self._end_delay()

        self._submit(apply)

    # -- commands ----------------------------------------------------------------------------
    def _submit(self, apply: Callable[[float], None]) -> None:
        done = threading.Event()
        with self._lock:
            serving = self._serving
            if serving:
                self._commands.append((apply, done))
        if not serving:
            # Not started or already stopped: no connection to act on, just set the state.
            apply(time.monotonic())
            return
        self._wake()
        if not done.wait(_COMMAND_TIMEOUT):  # pragma: no cover - the loop is never that slow
            raise RuntimeError("fault proxy did not apply the fault in time")

    def _wake(self) -> None:
        if self._waker_w is not None:
            try:
                self._waker_w.send(b"\0")
            except OSError:  # full (already awake) or closed (stopping)
                pass

    # -- the event loop ----------------------------------------------------------------------
    def _run(self) -> None:
        assert self._selector is not None
        try:
            while not self._stopping:
                try:
                    self._iterate(self._selector)
                except Exception:  # pragma: no cover - a bug; keep serving the other links
                    logger.exception("fault proxy loop error")
                    time.sleep(0.05)
        finally:
            self._shutdown()

    def _iterate(self, selector: selectors.BaseSelector) -> None:
        now = time.monotonic()
        self._run_commands(now)
        self._expire_faults(now)
        for link in list(self._links):
            self._service(link, now)
        for link in list(self._links):
            self._register(selector, link)
        timeout = self._next_wakeup(now)
        for key, mask in selector.select(timeout):
            if self._stopping:
                return
            if key.data is _LISTENER:
                self._accept(time.monotonic())
            elif key.data is _WAKER:
                self._drain_waker()
            else:
                link, sock = key.data
                if link in self._links:
                    self._on_event(link, sock, mask, time.monotonic())

    def _run_commands(self, now: float) -> None:
        while True:
            with self._lock:
                if not self._commands:
                    return
                apply, done = self._commands.popleft()
            try:
                apply(now)
            finally:
                done.set()

    def _expire_faults(self, now: float) -> None:
        if self._refuse_until is not None and now >= self._refuse_until:
            self._refuse_until = None
        if self._blackhole_until is not None and now >= self._blackhole_until:
            self._end_blackhole()
        if self._delay_until is not None and now >= self._delay_until:
            self._end_delay()

    def _next_wakeup(self, now: float) -> float:
        deadlines = [now + _MAX_WAIT]
        for deadline in (self._refuse_until, self._blackhole_until, self._delay_until):
            if deadline is not None:
                deadlines.append(deadline)
        for link in self._links:
            if link.connect_deadline is not None:
                deadlines.append(link.connect_deadline)
            for pipe in link.pipes:
                if pipe.queue and not pipe.blocked:
                    deadlines.append(pipe.queue[0][0])
        return max(0.0, min(deadlines) - now)

    def _drain_waker(self) -> None:
        assert self._waker_r is not None
        try:
            while self._waker_r.recv(4096):
                pass
        except OSError:
            pass

    # -- connections -------------------------------------------------------------------------
    def _accept(self, now: float) -> None:
        assert self._listener is not None
        while True:
            try:
                client, _ = self._listener.accept()
            except (BlockingIOError, InterruptedError):
                return
            except OSError as exc:  # e.g. EMFILE: leave the rest in the backlog for now
                logger.warning("fault proxy accept failed: %s", exc)
                return
            if self._refuse_until is not None and now < self._refuse_until:
                with self._lock:  # count before the client can see it
                    self._stats["refused"] += 1
                _abort(client)
                continue
            client.setblocking(False)
            client.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            upstream: socket.socket | None = None
            if self._blackhole_until is None or now >= self._blackhole_until:
                upstream = self._connect_upstream()
                if upstream is None:
                    with self._lock:
                        self._stats["upstream_failed"] += 1
                    _abort(client)
                    continue
            link = _Link(client, upstream)
            if upstream is not None:
                link.connect_deadline = now + _CONNECT_TIMEOUT
            else:
                link.blackholed = True
            with self._lock:
                self._links.add(link)
                self._stats["accepted"] += 1

    def _connect_upstream(self) -> socket.socket | None:
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.setblocking(False)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        err = sock.connect_ex(self.upstream)
        if err in (0, errno.EINPROGRESS, errno.EALREADY, errno.EWOULDBLOCK):
            return sock
        sock.close()
        self._log_upstream_failure(err)
        return None

    def _log_upstream_failure(self, err: int) -> None:
        logger.debug(
            "fault proxy: upstream %s:%d failed: %s", *self.upstream, errno.errorcode.get(err, err)
        )

    def _on_event(self, link: _Link, sock: socket.socket, mask: int, now: float) -> None:
        if sock is link.upstream and link.connect_deadline is not None:
            if mask & selectors.EVENT_WRITE:
                err = sock.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR)
                if err:
                    self._log_upstream_failure(err)
                    self._close_link(link, abort=True, counter="upstream_failed")
                    return
                link.connect_deadline = None
            return
        if mask & selectors.EVENT_WRITE:
            for pipe in link.pipes:
                if pipe.dst is sock:
                    pipe.blocked = False
        if mask & selectors.EVENT_READ:
            source = link.up if sock is link.client else link.down
            assert source is not None
            self._read(link, source, now)
        if link in self._links:
            self._service(link, now)

    def _read(self, link: _Link, pipe: _Pipe, now: float) -> None:
        try:
            data = pipe.src.recv(_CHUNK)
        except (BlockingIOError, InterruptedError):
            return
        except OSError:
            # The peer reset (or the socket broke): pass the reset on to the other side.
            self._abort_link(link)
            return
        if not data:
            pipe.eof = True
            return
        if link.blackholed:
            with self._lock:
                self._stats["dropped"] += len(data)
            return
        pipe.queue.append((now + self._delay, data))
        pipe.buffered += len(data)

    def _service(self, link: _Link, now: float) -> None:
        """Write what is due, pass FINs on, time out the upstream connect, close when done."""
        if link.connect_deadline is not None:
            if now >= link.connect_deadline:
                self._log_upstream_failure(errno.ETIMEDOUT)
                self._close_link(link, abort=True, counter="upstream_failed")
            return
        if link.blackholed:
            return
        for pipe in link.pipes:
            assert pipe.dst is not None
            while pipe.queue and not pipe.blocked and pipe.queue[0][0] <= now:
                due, data = pipe.queue[0]
                try:
                    sent = pipe.dst.send(data)
                except (BlockingIOError, InterruptedError):
                    pipe.blocked = True
                    break
                except OSError:
                    self._abort_link(link)
                    return
                with self._lock:
                    self._stats["bytes_" + pipe.direction] += sent
                pipe.buffered -= sent
                if sent < len(data):
                    pipe.queue[0] = (due, data[sent:])
                    pipe.blocked = True
                else:
                    pipe.queue.popleft()
            if pipe.eof and not pipe.queue and not pipe.shut:
                try:
                    pipe.dst.shutdown(socket.SHUT_WR)
                except OSError:
                    self._abort_link(link)
                    return
                pipe.shut = True
        if all(pipe.shut for pipe in link.pipes):
            self._close_link(link, abort=False)

    def _register(self, selector: selectors.BaseSelector, link: _Link) -> None:
        wanted: dict[socket.socket, int] = {sock: 0 for sock in link.sockets}
        if link.connect_deadline is not None:
            assert link.upstream is not None
            wanted[link.upstream] = selectors.EVENT_WRITE
        else:
            for pipe in link.pipes:
                if not pipe.eof and pipe.buffered < _HIGH_WATER:
                    wanted[pipe.src] |= selectors.EVENT_READ
                if pipe.blocked and pipe.dst is not None:
                    wanted[pipe.dst] |= selectors.EVENT_WRITE
        for sock, mask in wanted.items():
            current = link.masks.get(sock, 0)
            if mask == current:
                continue
            if current == 0:
                selector.register(sock, mask, (link, sock))
            elif mask == 0:
                selector.unregister(sock)
            else:
                selector.modify(sock, mask, (link, sock))
            link.masks[sock] = mask

    def _blackhole_link(self, link: _Link) -> None:
        link.blackholed = True
        dropped = sum(pipe.drop() for pipe in link.pipes)
        with self._lock:
            self._stats["dropped"] += dropped

    def _end_blackhole(self) -> None:
        self._blackhole_until = None
        for link in list(self._links):
            if link.blackholed:
                self._abort_link(link)

    def _end_delay(self) -> None:
        self._delay = 0.0
        self._delay_until = None
        # Pass-through at once: what is held back is due now, in order.
        for link in self._links:
            for pipe in link.pipes:
                pipe.queue = deque((0.0, data) for _, data in pipe.queue)

    def _abort_link(self, link: _Link) -> None:
        self._close_link(link, abort=True, counter="reset")

    def _close_link(self, link: _Link, *, abort: bool, counter: str | None = None) -> None:
        with self._lock:  # forget and count it before a peer can see it closed
            if link not in self._links:
                return
            self._links.discard(link)
            if counter is not None:
                self._stats[counter] += 1
        selector = self._selector
        for sock in link.sockets:
            if selector is not None and link.masks.get(sock):
                try:
                    selector.unregister(sock)
                except (KeyError, ValueError):
                    pass
            if abort:
                _abort(sock)
            else:
                sock.close()
        link.masks.clear()

    def _shutdown(self) -> None:
        for link in list(self._links):
            self._close_link(link, abort=True)
        with self._lock:
            self._serving = False
            for _, done in self._commands:
                done.set()
            self._commands.clear()
        if self._selector is not None:
            self._selector.close()
        for sock in (self._listener, self._waker_r, self._waker_w):
            if sock is not None:
                sock.close()


def _non_negative(name: str, value: float) -> float:
    value = float(value)
    if not value >= 0:  # also rejects NaN
        raise ValueError(f"{name} must be a non-negative number of seconds, got {value!r}")
    return value
