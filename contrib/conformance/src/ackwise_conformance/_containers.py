"""Broker containers through testcontainers, when a Docker engine answers (asked once)."""

from __future__ import annotations

import contextlib
import importlib
import importlib.util
import threading
import time
from typing import Any

from ackwise_conformance._ports import free_port
from ackwise_conformance._servers import Server, track, untrack
from ackwise_conformance.provisioning import BrokerUnavailable, ContainerSpec, Provisioner

__all__ = ["Container", "docker_unavailable_reason"]

_DOCKER_PING_TIMEOUT = 5.0

_docker_reason: list[str | None] = []


def docker_unavailable_reason() -> str | None:
    """``None`` when testcontainers can run here, else why not.  Asked once per process."""
    if not _docker_reason:
        _docker_reason.append(_probe_docker())
    return _docker_reason[0]


def _probe_docker() -> str | None:
    if importlib.util.find_spec("testcontainers") is None:
        return "testcontainers is not installed"
    outcome: list[str | None] = []

    def ping() -> None:
        try:
            docker: Any = importlib.import_module("docker")
            client = docker.from_env(timeout=_DOCKER_PING_TIMEOUT)
            try:
                client.ping()
            finally:
                client.close()
        except Exception as exc:
            outcome.append(f"no Docker engine answers ({type(exc).__name__}: {exc})")
        else:
            outcome.append(None)

    # A thread with a deadline: a misconfigured DOCKER_HOST must not hang the test session.
    thread = threading.Thread(target=ping, name="docker-ping", daemon=True)
    thread.start()
    thread.join(_DOCKER_PING_TIMEOUT + 1.0)
    if not outcome:
        return f"no Docker engine answered within {_DOCKER_PING_TIMEOUT:.0f}s"
    return outcome[0]


class Container(Server):
    """A broker container, bound to a host port chosen here so that a restart keeps it."""

    def __init__(self, provisioner: Provisioner, spec: ContainerSpec) -> None:
        self.name = provisioner.name
        self.provisioner = provisioner
        self.spec = spec
        self.host_port = free_port()
        module: Any = importlib.import_module("testcontainers.core.container")
        container = module.DockerContainer(spec.image).with_bind_ports(spec.port, self.host_port)
        if spec.command:
            container = container.with_command(list(spec.command))
        for key, value in spec.env.items():
            container = container.with_env(key, value)
        self.container = container
        self.host = "127.0.0.1"
        self.started = False

    @property
    def url(self) -> str:
        return self.spec.url.format(host=self.host, port=self.host_port)

    def start(self) -> None:
        try:
            self.container.start()
        except Exception as exc:
            raise BrokerUnavailable(f"could not start {self.name} container: {exc}") from exc
        self.started = True
        track(self)
        with contextlib.suppress(Exception):
            self.host = str(self.container.get_container_host_ip())
        self.wait_ready()

    def wait_ready(self) -> None:
        timeout = self.provisioner.ready_timeout * 2  # image start-up on top of the server's
        deadline = time.monotonic() + timeout
        while not self.provisioner.ready(self.host, self.host_port):
            if time.monotonic() >= deadline:
                self.stop()
                raise BrokerUnavailable(
                    f"{self.name} container did not answer on {self.host}:{self.host_port} "
                    f"within {timeout:.0f}s"
                )
            time.sleep(0.2)

    def restart(self, *, hard: bool = False) -> None:
        wrapped = self.container.get_wrapped_container()
        if hard:
            wrapped.kill()
            wrapped.start()
        else:
            wrapped.restart(timeout=int(self.provisioner.stop_timeout))
        self.wait_ready()

    def stop(self) -> None:
        if self.started:
            self.started = False
            with contextlib.suppress(Exception):
                self.container.stop()
        untrack(self)
