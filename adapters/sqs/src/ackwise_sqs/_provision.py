"""A private moto server (the SQS emulator) for the conformance suite (entry point, loaded by it).

Registered under ``ackwise.conformance.provisioners`` in this package's ``pyproject.toml``;
nothing in ``ackwise_sqs`` imports this module, so the adapter never imports the suite.
"""

from __future__ import annotations

import importlib.util
import shutil
import socket
import sys
from pathlib import Path

from ackwise_conformance.provisioning import (
    BrokerUnavailable,
    ContainerSpec,
    LocalServer,
    Provisioner,
    Slot,
)

__all__ = ["SqsProvisioner"]


def _moto_command() -> list[str] | None:
    # The environment running the tests first, then PATH (a system-wide moto[server]).  In
    # this environment: moto with atomic SQS receives (see ackwise_sqs._moto_server).
    if importlib.util.find_spec("moto") is not None and importlib.util.find_spec("flask"):
        return [sys.executable, "-m", "ackwise_sqs._moto_server"]
    venv_script = Path(sys.executable).parent / "moto_server"
    if venv_script.exists():
        return [str(venv_script)]
    found = shutil.which("moto_server")
    return [found] if found else None


class SqsProvisioner(Provisioner):
    name = "sqs"
    ready_timeout = 30.0
    stop_timeout = 5.0
    not_restartable = "moto keeps its queues in memory: a restart would lose them all"

    def local(self, slot: Slot) -> LocalServer:
        command = _moto_command()
        if command is None:
            raise BrokerUnavailable("moto's server is not installed (pip install 'moto[server]')")
        if slot.config:
            raise BrokerUnavailable("the sqs provisioner takes no configuration lines")
        return LocalServer(
            argv=[*command, "-H", slot.host, "-p", str(slot.port)],
            url=f"sqs://?endpoint_url=http://{slot.host}:{slot.port}&region=us-east-1",
        )

    def ready(self, host: str, port: int) -> bool:
        try:
            with socket.create_connection((host, port), timeout=1.0) as sock:
                sock.settimeout(3.0)
                sock.sendall(b"GET / HTTP/1.0\r\nHost: localhost\r\n\r\n")
                return sock.recv(16).startswith(b"HTTP/")
        except OSError:
            return False

    def container(self, *, durable: bool) -> ContainerSpec:
        return ContainerSpec(
            image="motoserver/moto:latest",
            port=5000,
            url="sqs://?endpoint_url=http://{host}:{port}&region=us-east-1",
        )
