"""Private redis-server instances for the conformance suite (entry point, loaded by it only).

Registered under ``ackwise.conformance.provisioners`` in this package's ``pyproject.toml``;
nothing in ``ackwise_redis`` imports this module, so the adapter never imports the suite.
"""

from __future__ import annotations

import shutil
import socket

from ackwise_conformance.provisioning import (
    BrokerUnavailable,
    ContainerSpec,
    LocalServer,
    Provisioner,
    Slot,
)

__all__ = ["RedisProvisioner"]


def _durability(durable: bool) -> list[str]:
    # Durable: every acknowledged write is in the append-only file, fsynced, before the
    # reply, so a restart (even a SIGKILL) loses nothing that was confirmed.
    return ["--appendonly", "yes", "--appendfsync", "always"] if durable else ["--appendonly", "no"]


class RedisProvisioner(Provisioner):
    name = "redis"
    ready_timeout = 15.0
    stop_timeout = 10.0

    def local(self, slot: Slot) -> LocalServer:
        binary = shutil.which("redis-server")
        if binary is None:
            raise BrokerUnavailable("redis-server is not on PATH")
        if slot.config:
            raise BrokerUnavailable("the redis provisioner takes no configuration lines")
        argv = [binary, "--port", str(slot.port), "--bind", slot.host, "--save", ""]
        argv += ["--dir", str(slot.data_dir), "--daemonize", "no", *_durability(slot.durable)]
        return LocalServer(argv=argv, url=f"redis://{slot.host}:{slot.port}/0")

    def ready(self, host: str, port: int) -> bool:
        """True when Redis answers PING with PONG (not ``-LOADING`` while it replays its AOF)."""
        try:
            with socket.create_connection((host, port), timeout=1.0) as sock:
                sock.sendall(b"*1\r\n$4\r\nPING\r\n")
                return sock.recv(64).startswith(b"+PONG")
        except OSError:
            return False

    def container(self, *, durable: bool) -> ContainerSpec:
        return ContainerSpec(
            image="redis:7-alpine",
            port=6379,
            url="redis://{host}:{port}/0",
            command=["redis-server", "--save", "", *_durability(durable)],
        )
