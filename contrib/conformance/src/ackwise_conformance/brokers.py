"""Brokers for the conformance suite: found, or started on free ports, and cleaned up.

:func:`provide` resolves a broker name in this order (docs/adapter-authors.md):

1. an explicit URL in ``ACKWISE_TEST_<NAME>_URL`` (``ACKWISE_TEST_REDIS_URL``, ...): used as
   it is, never restarted nor stopped by the suite;
2. a container through testcontainers, when that package is importable *and* a Docker engine
   answers a ping within a few seconds, and the broker's provisioner names an image;
3. a local server on free ports, as the broker's provisioner says to run it.

``sqlite`` and ``memory`` are embedded: there is nothing to start.  Every other name is the
name of a provisioner an adapter package registers under the entry-point group
``ackwise.conformance.provisioners`` (:mod:`ackwise_conformance.provisioning`): the Redis,
RabbitMQ and SQS adapters of this repository each register theirs.  A broker that cannot be
had raises :class:`BrokerUnavailable` naming why; :func:`provide_or_skip` turns that into
:func:`missing_broker`: a skip with the reason on a laptop, a failure under ``CI=true``::

    broker = provide_or_skip("redis", tmp_dir=tmp_path)
    request.addfinalizer(broker.stop)

Servers the suite starts run in their own process group, on ports outside the kernel's
ephemeral range (so no outgoing connection can take the port while a broker restarts), never
on the shared services' ports; :meth:`BrokerHandle.stop` ends them and an ``atexit`` hook
catches the ones a test forgot.  The machinery lives in ``_ports`` (free ports), ``_servers``
(process groups, tracking), ``_containers`` (testcontainers) and ``_urls`` (the address in a
URL).
"""

from __future__ import annotations

import os
import uuid
from pathlib import Path
from typing import NoReturn

import pytest

from ackwise import redact_url
from ackwise_conformance import provisioning
from ackwise_conformance._containers import Container, docker_unavailable_reason
from ackwise_conformance._ports import free_port
from ackwise_conformance._servers import Process, Server, start_local
from ackwise_conformance._urls import address_of, replace_address
from ackwise_conformance.provisioning import BrokerUnavailable, Provisioner

__all__ = [
    "BrokerHandle",
    "BrokerUnavailable",
    "NotRestartable",
    "free_port",
    "missing_broker",
    "provide",
]

EMBEDDED = ("sqlite", "memory")

_EMBEDDED_REASON = "embedded broker: there is no broker process to restart"


class NotRestartable(Exception):
    """The suite does not own this broker's process (or it keeps no data across a restart)."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


# -- the handle --------------------------------------------------------------------------------
class BrokerHandle:
    """A broker a scenario can use: its URL, where to put a fault proxy, how to restart it.

    :ivar name: ``"sqlite"``, ``"memory"`` or a provisioner's name (``"redis"``, ``"rabbitmq"``,
        ``"sqs"``, ...).
    :ivar url: the broker URL for ackwise.
    :ivar host: the broker's address, to put a :class:`~ackwise_conformance.proxy.FaultProxy`
        in front of it (``None`` for embedded brokers).
    :ivar port: likewise.
    :ivar owned: the suite started the broker, so it may restart it (embedded brokers count
        as owned, but have no process to restart).
    :ivar source: how it was found: ``"env"``, ``"container"``, ``"local"`` or ``"embedded"``.
    """

    def __init__(
        self,
        name: str,
        url: str,
        *,
        host: str | None = None,
        port: int | None = None,
        owned: bool = False,
        source: str = "env",
        server: Server | None = None,
        not_restartable: str | None = None,
    ) -> None:
        self.name = name
        self.url = url
        self.host = host
        self.port = port
        self.owned = owned
        self.source = source
        self._server = server
        self._not_restartable = not_restartable

    def __repr__(self) -> str:
        return (
            f"BrokerHandle({self.name!r}, {redact_url(self.url)!r}, source={self.source!r}, "
            f"owned={self.owned})"
        )

    def url_via(self, host: str, port: int) -> str:
        """Return :attr:`url` pointing at ``host:port`` instead (a fault proxy, typically).

        :raises ValueError: an embedded broker has no network address.
        """
        if self.host is None:
            raise ValueError(f"{self.name}: an embedded broker has no network address to proxy")
        return replace_address(self.url, host, port)

    @property
    def pid(self) -> int | None:
        """The pid of the broker process the suite started on this machine (the root of its
        process group), or ``None``: a container, a broker the suite did not start, an
        embedded one, or one stopped."""
        if isinstance(self._server, Process) and self._server.proc is not None:
            return self._server.proc.pid
        return None

    @property
    def log_path(self) -> Path | None:
        """The file that broker process writes its output to, or ``None`` where the suite
        runs no such process (a container, a broker it did not start, an embedded one)."""
        return self._server.log_path if isinstance(self._server, Process) else None

    @property
    def restartable(self) -> bool:
        """Whether :meth:`restart` can work (else it raises :class:`NotRestartable`)."""
        return self._not_restartable is None and self._server is not None

    @property
    def not_restartable_reason(self) -> str | None:
        """Why :meth:`restart` cannot work, or ``None`` when it can."""
        if self.restartable:
            return None
        return self._not_restartable or "the suite did not start this broker"

    def restart(self, *, hard: bool = False) -> None:
        """Stop the broker and start it again: same port, same data directory, durable config.

        Returns once the broker answers again.

        :param hard: kill it (SIGKILL) instead of asking it to shut down (SIGTERM).
        :raises NotRestartable: the suite does not own the broker process, or the broker keeps
            nothing across a restart; the reason says which.
        :raises BrokerUnavailable: it did not come back.
        """
        reason = self.not_restartable_reason
        if reason is not None:
            raise NotRestartable(f"{self.name}: {reason}")
        assert self._server is not None
        self._server.restart(hard=hard)

    def stop(self) -> None:
        """Stop the broker if the suite started it; otherwise do nothing.  Idempotent."""
        if self._server is not None:
            self._server.stop()


# -- public helpers ----------------------------------------------------------------------------
def missing_broker(reason: str) -> NoReturn:
    """Skip the test with ``reason``; under ``CI=true`` fail it instead.

    A laptop without RabbitMQ should still run the rest of the suite; a CI job that was meant
    to test RabbitMQ must not go green by skipping it.
    """
    if os.environ.get("CI") == "true":
        pytest.fail(f"broker missing under CI=true: {reason}", pytrace=False)
    pytest.skip(reason)


def provide(
    name: str, *, tmp_dir: Path, durable: bool = True, rabbitmq_conf: str = ""
) -> BrokerHandle:
    """Find or start the broker ``name`` for a test; see the module documentation for the order.

    :param tmp_dir: where a started broker keeps its data and logs (and ``sqlite`` its file).
    :param durable: configure a started broker to keep acknowledged writes across a restart
        (Redis: append-only file, fsync always).
    :param rabbitmq_conf: lines added to a private server's configuration file (RabbitMQ's
        ``rabbitmq.conf``, e.g. ``"consumer_timeout = 3000"``; the provisioners of Redis and
        SQS take none); a broker given this way is always a local one, never a container.
    :raises BrokerUnavailable: unknown name (the reason lists the installed provisioners), or
        no way to have this broker here.
    """
    name = name.lower()
    env_name = f"ACKWISE_TEST_{name.upper()}_URL"
    url = os.environ.get(env_name)
    if url:
        return _external(name, url, env_name)
    tmp_dir = Path(tmp_dir).resolve()
    if name == "sqlite":
        tmp_dir.mkdir(parents=True, exist_ok=True)
        return BrokerHandle(
            name,
            f"sqlite:///{tmp_dir / 'broker.db'}",
            owned=True,
            source="embedded",
            not_restartable=_EMBEDDED_REASON,
        )
    if name == "memory":
        return BrokerHandle(
            name,
            f"memory://{uuid.uuid4().hex}",
            owned=True,
            source="embedded",
            not_restartable=_EMBEDDED_REASON,
        )
    try:
        provisioner = provisioning.load(name)
    except BrokerUnavailable as exc:
        raise BrokerUnavailable(
            f"unknown broker {name!r}: {exc.reason}; embedded: {', '.join(EMBEDDED)}; "
            f"or set {env_name}"
        ) from None
    if rabbitmq_conf:
        try:
            return _local(provisioner, tmp_dir, durable, rabbitmq_conf)
        except BrokerUnavailable as exc:
            raise BrokerUnavailable(f"no private {name} server: {exc.reason}") from None
    reasons: list[str] = []
    spec = provisioner.container(durable=durable)  # None: this broker runs locally only
    if spec is not None:
        docker_reason = docker_unavailable_reason()
        if docker_reason is None:
            try:
                return _start_container(provisioner, Container(provisioner, spec))
            except BrokerUnavailable as exc:
                reasons.append(f"container: {exc.reason}")
        else:
            reasons.append(docker_reason)
    try:
        return _local(provisioner, tmp_dir, durable)
    except BrokerUnavailable as exc:
        reasons.append(exc.reason)
    raise BrokerUnavailable(f"no {name} broker: set {env_name}, or " + "; ".join(reasons)) from None


def provide_or_skip(
    name: str, *, tmp_dir: Path, durable: bool = True, rabbitmq_conf: str = ""
) -> BrokerHandle:
    """:func:`provide` for a test: a broker that cannot be had skips it, or fails it under
    ``CI=true`` (:func:`missing_broker`)."""
    try:
        return provide(name, tmp_dir=tmp_dir, durable=durable, rabbitmq_conf=rabbitmq_conf)
    except BrokerUnavailable as exc:
        missing_broker(exc.reason)


# -- explicit URLs -----------------------------------------------------------------------------
def _external(name: str, url: str, env_name: str) -> BrokerHandle:
    host, port = address_of(url)
    return BrokerHandle(
        name,
        url,
        host=host,
        port=port,
        owned=False,
        source="env",
        not_restartable=f"the broker at {redact_url(url)} ({env_name}) was not started by the "
        "suite, so the suite cannot restart it",
    )


# -- servers the suite starts ------------------------------------------------------------------
def _local(
    provisioner: Provisioner, tmp_dir: Path, durable: bool, config: str = ""
) -> BrokerHandle:
    server, spec = start_local(provisioner, tmp_dir, durable=durable, config=config)
    return BrokerHandle(
        provisioner.name,
        spec.url,
        host="127.0.0.1",
        port=server.port,
        owned=True,
        source="local",
        server=server,
        not_restartable=provisioner.not_restartable,
    )


def _start_container(provisioner: Provisioner, server: Container) -> BrokerHandle:
    server.start()
    return BrokerHandle(
        provisioner.name,
        server.url,
        host=server.host,
        port=server.host_port,
        owned=True,
        source="container",
        server=server,
        not_restartable=provisioner.not_restartable,
    )
