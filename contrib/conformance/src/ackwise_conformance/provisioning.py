"""How an adapter package lets the conformance suite start a private broker of its kind.

An adapter package implements a :class:`Provisioner` and registers it under the entry-point
group ``ackwise.conformance.provisioners``, named after the broker::

    # pyproject.toml of the adapter package
    [project.entry-points."ackwise.conformance.provisioners"]
    kafka = "ackwise_kafka._provision:KafkaProvisioner"

:func:`ackwise_conformance.brokers.provide` loads it by name, only when a test asks for that
broker.  The provisioner says *what* to run (a command line, its URL, how to tell it answers,
optionally a container image); the suite does the rest: the free port (outside the kernel's
ephemeral range, never a shared service's), the data directory, the process group, retries on
a port lost meanwhile, stop/restart/hard restart, the ``atexit`` cleanup,
``ACKWISE_TEST_<NAME>_URL`` and the container fallback.

This module depends on the standard library alone, so a provisioner module importing it costs
its adapter nothing; the adapter itself must never import its provisioner.
"""

from __future__ import annotations

import abc
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from importlib.metadata import EntryPoint, entry_points
from pathlib import Path

__all__ = [
    "ENTRY_POINT_GROUP",
    "BrokerUnavailable",
    "ContainerSpec",
    "LocalServer",
    "Provisioner",
    "Slot",
    "installed",
    "load",
]

ENTRY_POINT_GROUP = "ackwise.conformance.provisioners"


class BrokerUnavailable(Exception):
    """The broker cannot be had here; :attr:`reason` says why (for the skip message).

    A provisioner raises it when its server cannot run here (``redis-server is not on PATH``).
    """

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


@dataclass(frozen=True)
class Slot:
    """Where the suite will run one private server: given to :meth:`Provisioner.local`."""

    #: the port the server must listen on (free now; the suite retries on another if lost).
    port: int
    #: an empty directory of this server's own, for its data, configuration and logs.
    data_dir: Path
    #: keep every acknowledged write across a restart, a SIGKILL included.
    durable: bool
    #: extra lines for the server's configuration file (``""`` when none were asked for).
    config: str
    #: another free port (a second listener of the server); never :attr:`port`.
    free_port: Callable[[], int]
    host: str = "127.0.0.1"


@dataclass(frozen=True)
class LocalServer:
    """The server to run on a :class:`Slot`: the suite starts ``argv`` in ``data_dir``."""

    argv: Sequence[str]
    #: the broker URL for ackwise, pointing at the slot's host and port.
    url: str
    #: the whole environment of the process (``None``: the suite's own).
    env: Mapping[str, str] | None = None
    #: log files to quote when the server fails to start (its stdout and stderr always are).
    log_files: Sequence[Path] = field(default_factory=tuple)


@dataclass(frozen=True)
class ContainerSpec:
    """A container image serving the broker (the suite publishes ``port`` on a free host port)."""

    image: str
    port: int
    #: the broker URL, with ``{host}`` and ``{port}`` for the published address.
    url: str
    command: Sequence[str] | None = None
    env: Mapping[str, str] = field(default_factory=dict)


class Provisioner(abc.ABC):
    """Starts private servers of one broker kind for the suite; registered by entry point.

    The entry point names a class (called without arguments) or an instance.
    """

    #: the broker's name, as in ``provide(name)`` and ``ACKWISE_TEST_<NAME>_URL``.
    name: str
    #: seconds a server may take to answer after its start (a container gets twice this).
    ready_timeout: float = 30.0
    #: seconds a graceful stop (SIGTERM) may take before the suite kills the process group.
    stop_timeout: float = 10.0
    #: why a restart would be of no use (the server keeps nothing), or ``None``.
    not_restartable: str | None = None

    @abc.abstractmethod
    def local(self, slot: Slot) -> LocalServer:
        """The command of a server on ``slot``; called again for each start attempt.

        :raises BrokerUnavailable: the server cannot run here (its binary is missing...).
        """

    @abc.abstractmethod
    def ready(self, host: str, port: int) -> bool:
        """Whether the server on ``host:port`` serves requests now (polled, so be quick)."""

    def container(self, *, durable: bool) -> ContainerSpec | None:
        """The container to use when a Docker engine answers, or ``None`` (local only)."""
        return None


def installed() -> dict[str, EntryPoint]:
    """The provisioners' entry points installed in this environment, by name (not loaded)."""
    found: dict[str, EntryPoint] = {}
    for ep in entry_points(group=ENTRY_POINT_GROUP):
        found.setdefault(ep.name.lower(), ep)
    return found


def load(name: str) -> Provisioner:
    """Load the provisioner registered as ``name``.

    :raises BrokerUnavailable: none is installed under that name; the reason lists those that are.
    :raises TypeError: the entry point does not give a :class:`Provisioner`.
    """
    eps = installed()
    ep = eps.get(name.lower())
    if ep is None:
        known = ", ".join(sorted(eps)) or "none"
        raise BrokerUnavailable(
            f"no provisioner for broker {name!r} is installed (entry-point group "
            f"{ENTRY_POINT_GROUP!r}; installed: {known})"
        )
    target = ep.load()
    provisioner = target() if isinstance(target, type) else target
    if not isinstance(provisioner, Provisioner):
        raise TypeError(
            f"entry point {ep.name} = {ep.value} gives {provisioner!r}, not a Provisioner"
        )
    return provisioner
