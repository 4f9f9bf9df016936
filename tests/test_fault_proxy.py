"""The TCP fault proxy of the conformance suite: pass-through, reset, black hole, delay, stop."""

from __future__ import annotations

import contextlib
import shutil
import socket
import subprocess
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from ackwise_conformance.helpers import eventually
from ackwise_conformance.proxy import FaultProxy

pytestmark = pytest.mark.timeout(60)


class EchoServer:
    """Echo every byte back; on the client's FIN, answer with a FIN once everything is echoed."""

    def __init__(self) -> None:
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port: int = self.listener.getsockname()[1]
        self._conns: list[socket.socket] = []
        self._closed = False
        self._thread = threading.Thread(target=self._serve, daemon=True)
        self._thread.start()

    def _serve(self) -> None:
        while True:
            try:
                conn, _ = self.listener.accept()
            except OSError:
                return
            self._conns.append(conn)
            threading.Thread(target=self._echo, args=(conn,), daemon=True).start()

    @staticmethod
    def _echo(conn: socket.socket) -> None:
        try:
            while data := conn.recv(65536):
                conn.sendall(data)
            conn.shutdown(socket.SHUT_WR)
        except OSError:
            pass
        finally:
            conn.close()

    def close(self) -> None:
        self.listener.close()
        for conn in self._conns:
            with contextlib.suppress(OSError):
                conn.close()


@pytest.fixture
def echo() -> Iterator[EchoServer]:
    server = EchoServer()
    yield server
    server.close()


@pytest.fixture
def proxy(echo: EchoServer) -> Iterator[FaultProxy]:
    with FaultProxy("127.0.0.1", echo.port).start() as p:
        yield p


def connect(proxy: FaultProxy, timeout: float = 5.0) -> socket.socket:
    return socket.create_connection(("127.0.0.1", proxy.port), timeout=timeout)


def roundtrip(sock: socket.socket, payload: bytes = b"ping") -> bytes:
    sock.sendall(payload)
    received = b""
    while len(received) < len(payload):
        chunk = sock.recv(65536)
        if not chunk:
            break
        received += chunk
    return received


def is_cut(sock: socket.socket) -> bool:
    """True when the connection was reset or closed by the far side."""
    try:
        sock.sendall(b"x")
        return sock.recv(1) == b""
    except (ConnectionResetError, BrokenPipeError):
        return True


def is_turned_away(proxy: FaultProxy) -> bool:
    """True when a new connection is reset (during the handshake or just after) or closed."""
    try:
        sock = connect(proxy)
    except ConnectionResetError:  # the RST can beat connect() back to the caller
        return True
    with sock:
        return is_cut(sock)


# -- pass-through -----------------------------------------------------------------------------
def test_bytes_pass_through_both_ways(proxy: FaultProxy) -> None:
    with connect(proxy) as sock:
        assert roundtrip(sock, b"hello") == b"hello"
        big = bytes(range(256)) * 4096  # 1 MiB: more than one chunk and the high water mark
        assert roundtrip(sock, big) == big
    assert proxy.stats["accepted"] == 1
    # Counted just after the send that delivered them: poll.
    eventually(lambda: proxy.stats["bytes_up"] == proxy.stats["bytes_down"] == 5 + len(big))


def test_a_half_close_is_passed_on_and_the_answer_still_arrives(proxy: FaultProxy) -> None:
    with connect(proxy) as sock:
        sock.sendall(b"last words")
        sock.shutdown(socket.SHUT_WR)
        received = b""
        while chunk := sock.recv(65536):
            received += chunk
    assert received == b"last words"
    eventually(lambda: proxy.connections == 0, description="link closed after both FINs")


def test_many_connections_at_once(proxy: FaultProxy) -> None:
    socks = [connect(proxy) for _ in range(60)]
    try:
        for i, sock in enumerate(socks):
            sock.sendall(b"n%03d" % i)
        for i, sock in enumerate(socks):
            assert sock.recv(4) == b"n%03d" % i
        assert proxy.connections == 60
    finally:
        for sock in socks:
            sock.close()
    eventually(lambda: proxy.connections == 0, description="all links closed")


def test_an_upstream_that_refuses_resets_the_client_and_the_proxy_carries_on() -> None:
    closed = socket.create_server(("127.0.0.1", 0))
    port = closed.getsockname()[1]
    closed.close()  # nothing listens there any more
    with FaultProxy("127.0.0.1", port).start() as proxy:
        assert is_turned_away(proxy)
        eventually(lambda: proxy.stats["upstream_failed"] == 1)
        assert proxy.connections == 0


# -- reset ------------------------------------------------------------------------------------
def test_reset_cuts_open_connections_and_turns_new_ones_away_until_it_heals(
    proxy: FaultProxy,
) -> None:
    socks = [connect(proxy) for _ in range(3)]
    for sock in socks:
        assert roundtrip(sock) == b"ping"
    proxy.reset(1.0)
    started = time.monotonic()
    assert proxy.connections == 0
    for sock in socks:
        with pytest.raises(ConnectionResetError):
            sock.recv(1)
        sock.close()
    assert proxy.stats["reset"] == 3

    # The listener keeps its port: a new connection is accepted, then reset.
    assert is_turned_away(proxy)
    assert proxy.stats["refused"] >= 1

    def healed() -> bool:
        try:
            with connect(proxy) as sock:
                return roundtrip(sock) == b"ping"
        except (ConnectionResetError, BrokenPipeError):
            return False

    eventually(healed, timeout=5, interval=0.05, description="new connections work again")
    assert time.monotonic() - started >= 0.9


def test_reset_without_duration_lets_the_next_connection_through(proxy: FaultProxy) -> None:
    with connect(proxy) as sock:
        assert roundtrip(sock) == b"ping"
        proxy.reset()
        assert is_cut(sock)
    with connect(proxy) as sock:
        assert roundtrip(sock) == b"ping"


# -- black hole -------------------------------------------------------------------------------
def test_blackhole_drops_bytes_both_ways_then_resets_its_connections(proxy: FaultProxy) -> None:
    with connect(proxy, timeout=0.3) as held:
        assert roundtrip(held) == b"ping"
        proxy.blackhole(1.0)
        started = time.monotonic()
        held.sendall(b"into the void")
        with pytest.raises(TimeoutError):
            held.recv(1)
        with connect(proxy, timeout=0.3) as late:  # accepted, but nothing gets through
            late.sendall(b"hello?")
            with pytest.raises(TimeoutError):
                late.recv(1)
            assert proxy.connections == 2
            held.settimeout(5)
            late.settimeout(5)
            # The partition ends: its TCP sessions do not resume, they are reset.
            with pytest.raises(ConnectionResetError):
                held.recv(1)
            with pytest.raises(ConnectionResetError):
                late.recv(1)
    assert time.monotonic() - started >= 0.9
    assert proxy.stats["dropped"] >= len(b"into the void")
    with connect(proxy) as sock:
        assert roundtrip(sock) == b"ping"


def test_heal_ends_a_blackhole_at_once(proxy: FaultProxy) -> None:
    with connect(proxy, timeout=5) as sock:
        proxy.blackhole(60)
        proxy.heal()
        assert is_cut(sock)
    with connect(proxy) as sock:
        assert roundtrip(sock) == b"ping"


# -- delay ------------------------------------------------------------------------------------
def test_delay_adds_latency_both_ways(proxy: FaultProxy) -> None:
    with connect(proxy) as sock:
        proxy.delay(0.15)
        started = time.monotonic()
        assert roundtrip(sock) == b"ping"
        assert time.monotonic() - started >= 0.3  # 0.15 s up, 0.15 s down
        proxy.heal()
        started = time.monotonic()
        assert roundtrip(sock) == b"ping"
        assert time.monotonic() - started < 0.3  # no longer two delays


def test_a_timed_delay_heals_by_itself(proxy: FaultProxy) -> None:
    with connect(proxy) as sock:
        proxy.delay(0.1, duration=0.3)
        started = time.monotonic()
        assert roundtrip(sock) == b"ping"
        assert time.monotonic() - started >= 0.2
        time.sleep(0.3)  # let the fault's own timer run out: that is what is tested
        started = time.monotonic()
        assert roundtrip(sock) == b"ping"
        assert time.monotonic() - started < 0.2  # no longer two delays


# -- stop -------------------------------------------------------------------------------------
def test_stop_is_prompt_and_closes_everything(echo: EchoServer) -> None:
    proxy = FaultProxy("127.0.0.1", echo.port).start()
    socks = [connect(proxy) for _ in range(10)]
    for sock in socks:
        assert roundtrip(sock) == b"ping"
    proxy.delay(30)
    socks[0].sendall(b"stuck in the delay line")
    proxy.blackhole(30)
    started = time.monotonic()
    proxy.stop()
    assert time.monotonic() - started < 2.0
    for sock in socks:
        assert is_cut(sock)
        sock.close()
    with pytest.raises(OSError):
        connect(proxy, timeout=1)
    proxy.stop()  # harmless twice


def test_faults_need_non_negative_durations(proxy: FaultProxy) -> None:
    with pytest.raises(ValueError):
        proxy.reset(-1)
    with pytest.raises(ValueError):
        proxy.delay(float("nan"))


# -- against a real broker --------------------------------------------------------------------
def resp(sock: socket.socket, *args: str) -> bytes:
    command = f"*{len(args)}\r\n" + "".join(f"${len(a)}\r\n{a}\r\n" for a in args)
    sock.sendall(command.encode())
    return sock.recv(65536)


@pytest.mark.skipif(shutil.which("redis-server") is None, reason="redis-server is not on PATH")
def test_redis_through_the_proxy(tmp_path: Path) -> None:
    with socket.create_server(("127.0.0.1", 0)) as probe:
        port = probe.getsockname()[1]
    server = subprocess.Popen(
        ["redis-server", "--port", str(port), "--bind", "127.0.0.1", "--save", "",
         "--appendonly", "no", "--dir", str(tmp_path)],
        stdout=subprocess.DEVNULL,
    )  # fmt: skip
    try:

        def answers() -> bool:
            try:
                with socket.create_connection(("127.0.0.1", port), timeout=1) as s:
                    return resp(s, "PING") == b"+PONG\r\n"
            except OSError:
                return False

        eventually(answers, timeout=10, description="redis-server answers PING")
        with FaultProxy("127.0.0.1", port).start() as proxy:
            with connect(proxy) as sock:
                assert resp(sock, "SET", "k", "v") == b"+OK\r\n"
                proxy.reset()
                assert is_cut(sock)
            with connect(proxy) as sock:
                assert resp(sock, "GET", "k") == b"$1\r\nv\r\n"
    finally:
        server.terminate()
        server.wait(10)
