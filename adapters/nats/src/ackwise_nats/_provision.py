"""Private nats-server instances for the conformance suite (entry point, loaded by it only).

Registered under ``ackwise.conformance.provisioners`` in this package's ``pyproject.toml``;
nothing in ``ackwise_nats`` imports this module, so the adapter never imports the suite.
"""

from __future__ import annotations

import json
import shutil
import socket
from pathlib import Path

from ackwise_conformance.provisioning import (
    BrokerUnavailable,
    ContainerSpec,
    LocalServer,
    Provisioner,
    Slot,
)

__all__ = ["NatsProvisioner"]

# Debian installs nats-server in /usr/sbin, which is not on every user's PATH.
_FALLBACK = Path("/usr/sbin/nats-server")


def _binary() -> str:
    found = shutil.which("nats-server")
    if found is not None:
        return found
    if _FALLBACK.exists():
        return str(_FALLBACK)
    raise BrokerUnavailable("nats-server is not on PATH (nor in /usr/sbin)")


class NatsProvisioner(Provisioner):
    name = "nats"
    ready_timeout = 20.0
    stop_timeout = 10.0

    def local(self, slot: Slot) -> LocalServer:
        if slot.config:
            raise BrokerUnavailable("the nats provisioner takes no configuration lines")
        # JetStream's file store keeps every acknowledged write in the OS's page cache before
        # the publish is acknowledged: a restart, a SIGKILL of the server included, keeps it
        # (only a crash of the host could lose what was not fsynced yet).
        argv = [_binary(), "--jetstream", "--addr", slot.host, "--port", str(slot.port)]
        argv += ["--store_dir", str(slot.data_dir / "jetstream")]
        argv += ["--log", str(slot.data_dir / "nats-server.log")]
        return LocalServer(
            argv=argv,
            url=f"nats://{slot.host}:{slot.port}",
            log_files=[slot.data_dir / "nats-server.log"],
        )

    def ready(self, host: str, port: int) -> bool:
        """True when the server greets with an INFO that announces JetStream."""
        try:
            with socket.create_connection((host, port), timeout=1.0) as sock:
                sock.settimeout(1.0)
                line = sock.recv(4096)
        except OSError:
            return False
        if not line.startswith(b"INFO "):
            return False
        try:
            info = json.loads(line[5:].split(b"\r\n", 1)[0])
        except ValueError:
            return False
        return bool(info.get("jetstream"))

    def container(self, *, durable: bool) -> ContainerSpec:
        return ContainerSpec(
            image="nats:2.10-alpine",
            port=4222,
            url="nats://{host}:{port}",
            command=["nats-server", "--jetstream", "--store_dir", "/data"],
        )
