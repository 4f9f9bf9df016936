"""Free ports for the servers the suite starts: outside the ephemeral range, never shared ones."""

from __future__ import annotations

import random
import socket
import threading
from collections import deque
from pathlib import Path

__all__ = ["RESERVED_PORTS", "bindable", "free_port"]

# The shared services on this kind of machine (and their usual defaults elsewhere): redis,
# AMQP, RabbitMQ's Erlang distribution port, the management UI, epmd.  Never listen there.
RESERVED_PORTS = frozenset({4369, 5672, 6379, 15672, 25672})

#: Ports this process handed out lately: a server is often given several ports at once (a
#: cluster node's client and bus ports, a RabbitMQ node's three) and binds them only later, so
#: a port free when asked for may already be promised to another server of this process.
_GIVEN: deque[int] = deque(maxlen=4096)
_GIVEN_LOCK = threading.Lock()


def free_port(host: str = "127.0.0.1") -> int:
    """Return a TCP port that is free on ``host`` now.

    It lies below the kernel's ephemeral range when there is room, so that no outgoing
    connection is given it while a broker on it restarts; never one of the shared services'
    ports, nor one this process handed out lately (it may not be bound yet).
    """
    with _GIVEN_LOCK:
        port = _pick(host)
        _GIVEN.append(port)
    return port


def _pick(host: str) -> int:
    low, _ = _ephemeral_range()
    rng = random.SystemRandom()
    if low > 12000:
        for _ in range(200):
            port = rng.randrange(10000, low)
            if port not in RESERVED_PORTS and port not in _GIVEN and bindable(host, port):
                return port
    while True:  # fall back to the kernel's choice
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
            sock.bind((host, 0))
            port = int(sock.getsockname()[1])
        if port not in RESERVED_PORTS and port not in _GIVEN:
            return port


def bindable(host: str, port: int) -> bool:
    """Whether a listener could bind ``host:port`` now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        try:
            sock.bind((host, port))
        except OSError:
            return False
    return True


def _ephemeral_range() -> tuple[int, int]:
    try:
        low, high = Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()
        return int(low), int(high)
    except (OSError, ValueError):
        return 32768, 60999
