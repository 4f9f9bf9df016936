"""Brokers for the conformance suite: found, or started on free ports, and cleaned up.

:func:`provide` resolves a broker name in this order (docs/adapter-authors.md):

1. an explicit URL in ``ACKWISE_TEST_<NAME>_URL`` (``ACKWISE_TEST_REDIS_URL``, ...): used as
   it is, never restarted nor stopped by the suite;
2. a container through testcontainers, when that package is importable *and* a Docker engine
   answers a ping within a few seconds;
3. a local server binary on free ports: ``redis-server``, ``rabbitmq-server`` (a private node),
   moto's server for SQS.

``sqlite`` and ``memory`` are embedded: there is nothing to start.  A broker that cannot be
had raises :class:`BrokerUnavailable` naming why; a test turns that into
:func:`missing_broker`: a skip with the reason on a laptop, a failure under ``CI=true``::

    try:
        broker = provide("redis", tmp_dir=tmp_path)
    except BrokerUnavailable as exc:
        missing_broker(exc.reason)
    request.addfinalizer(broker.stop)

Servers the suite starts run in their own process group, on ports outside the kernel's
ephemeral range (so no outgoing connection can take the port while a broker restarts), never
on the shared services' ports; :meth:`BrokerHandle.stop` ends them and an ``atexit`` hook
catches the ones a test forgot.
"""

from __future__ import annotations

import atexit
import contextlib
import importlib
import importlib.util
import logging
import os
import random
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, NoReturn
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

import pytest

from ackwise import redact_url

__all__ = [
    "BrokerHandle",
    "BrokerUnavailable",
    "NotRestartable",
    "free_port",
    "missing_broker",
    "provide",
]

logger = logging.getLogger(__name__)

EMBEDDED = ("sqlite", "memory")
NETWORKED = ("redis", "rabbitmq", "sqs")

# The shared services on this kind of machine (and their usual defaults elsewhere): redis,
# AMQP, RabbitMQ's Erlang distribution port, the management UI, epmd.  Never listen there.
_RESERVED_PORTS = frozenset({4369, 5672, 6379, 15672, 25672})
_DEFAULT_PORTS = {"redis": 6379, "rediss": 6379, "amqp": 5672, "amqps": 5671}

_READY_TIMEOUT = {"redis": 15.0, "rabbitmq": 60.0, "sqs": 30.0}
_STOP_TIMEOUT = {"redis": 10.0, "rabbitmq": 30.0, "sqs": 5.0}
_DOCKER_PING_TIMEOUT = 5.0
_START_ATTEMPTS = 3  # a free port can be taken between choosing it and the server binding it

_EMBEDDED_REASON = "embedded broker: there is no broker process to restart"


class BrokerUnavailable(Exception):
    """The broker cannot be had here; :attr:`reason` says why (for the skip message)."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


class NotRestartable(Exception):
    """The suite does not own this broker's process (or it keeps no data across a restart)."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


# -- the handle --------------------------------------------------------------------------------
class BrokerHandle:
    """A broker a scenario can use: its URL, where to put a fault proxy, how to restart it.

    :ivar name: ``"redis"``, ``"rabbitmq"``, ``"sqs"``, ``"sqlite"`` or ``"memory"``.
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
        server: _Server | None = None,
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
        return _replace_address(self.url, host, port)

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


def free_port(host: str = "127.0.0.1") -> int:
    """Return a TCP port that is free on ``host`` now.

    It lies below the kernel's ephemeral range when there is room, so that no outgoing
    connection is given it while a broker on it restarts; never one of the shared services'
    ports.
    """
    low, _ = _ephemeral_range()
    rng = random.SystemRandom()
    if low > 12000:
        for _ in range(200):
            port = rng.randrange(10000, low)
            if port not in _RESERVED_PORTS and _bindable(host, port):
                return port
    while True:  # fall back to the kernel's choice
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
            sock.bind((host, 0))
            port = int(sock.getsockname()[1])
        if port not in _RESERVED_PORTS:
            return port


def provide(
    name: str, *, tmp_dir: Path, durable: bool = True, rabbitmq_conf: str = ""
) -> BrokerHandle:
    """Find or start the broker ``name`` for a test; see the module documentation for the order.

    :param tmp_dir: where a started broker keeps its data and logs (and ``sqlite`` its file).
    :param durable: configure a started broker to keep acknowledged writes across a restart
        (Redis: append-only file, fsync always).
    :param rabbitmq_conf: lines added to a private RabbitMQ node's ``rabbitmq.conf`` (e.g.
        ``"consumer_timeout = 3000"``); a node given this way is always a private one.
    :raises BrokerUnavailable: unknown name, or no way to have this broker here.
    """
    name = name.lower()
    if name not in EMBEDDED + NETWORKED:
        raise BrokerUnavailable(
            f"unknown broker {name!r}; the suite knows {', '.join(NETWORKED + EMBEDDED)}"
        )
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
    reasons: list[str] = []
    docker_reason = _docker_unavailable_reason()
    if name == "rabbitmq" and rabbitmq_conf:
        try:
            return _local_rabbitmq(tmp_dir, durable, rabbitmq_conf)
        except BrokerUnavailable as exc:
            raise BrokerUnavailable(f"no private rabbitmq node: {exc.reason}") from None
    if docker_reason is None:
        try:
            return _start_container(name, durable=durable)
        except BrokerUnavailable as exc:
            reasons.append(f"container: {exc.reason}")
    else:
        reasons.append(docker_reason)
    starter = {"redis": _local_redis, "rabbitmq": _local_rabbitmq, "sqs": _local_moto}[name]
    try:
        return starter(tmp_dir, durable)
    except BrokerUnavailable as exc:
        reasons.append(exc.reason)
    raise BrokerUnavailable(f"no {name} broker: set {env_name}, or " + "; ".join(reasons)) from None


# -- explicit URLs -----------------------------------------------------------------------------
def _external(name: str, url: str, env_name: str) -> BrokerHandle:
    host, port = _address_of(url)
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


def _address_of(url: str) -> tuple[str | None, int | None]:
    parts = urlsplit(url)
    if parts.scheme == "sqs":
        endpoint = dict(parse_qsl(parts.query)).get("endpoint_url")
        if not endpoint:
            return None, None  # real AWS: no address of ours to proxy
        parts = urlsplit(endpoint)
    if not parts.hostname:
        return None, None
    return parts.hostname, parts.port or _DEFAULT_PORTS.get(parts.scheme)


def _replace_address(url: str, host: str, port: int) -> str:
    parts = urlsplit(url)
    if parts.scheme == "sqs":
        query = parse_qsl(parts.query, keep_blank_values=True)
        replaced = []
        for key, value in query:
            if key == "endpoint_url":
                value = _replace_address(value, host, port)
            replaced.append((key, value))
        # Not urlunsplit: with an empty host it would write "sqs:?..." without the "//".
        query_text = urlencode(replaced, safe=":/")
        fragment = f"#{parts.fragment}" if parts.fragment else ""
        return f"{parts.scheme}://{parts.netloc}{parts.path}?{query_text}{fragment}"
    userinfo, at, _ = parts.netloc.rpartition("@")
    hostport = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
    return urlunsplit(parts._replace(netloc=f"{userinfo}{at}{hostport}"))


# -- servers the suite owns --------------------------------------------------------------------
class _Server:
    """A broker server the suite started (a process group, or a container)."""

    name = "broker"

    def restart(self, *, hard: bool = False) -> None:
        raise NotImplementedError

    def stop(self) -> None:
        raise NotImplementedError


_live: set[_Server] = set()
_live_lock = threading.Lock()
_atexit_registered = False


def _track(server: _Server) -> None:
    global _atexit_registered
    with _live_lock:
        _live.add(server)
        if not _atexit_registered:
            atexit.register(_stop_all)
            _atexit_registered = True


def _untrack(server: _Server) -> None:
    with _live_lock:
        _live.discard(server)


def _stop_all() -> None:
    with _live_lock:
        servers = list(_live)
    for server in servers:
        try:
            server.stop()
        except Exception:  # at exit: stop what can be stopped
            logger.exception("could not stop %s", server.name)


class _Process(_Server):
    """A local broker process in its own process group, restartable on the same port."""

    def __init__(
        self,
        name: str,
        argv: Sequence[str],
        *,
        port: int,
        data_dir: Path,
        ready: Callable[[], bool],
        env: dict[str, str] | None = None,
        log_files: Sequence[Path] = (),
    ) -> None:
        self.name = name
        self.argv = list(argv)
        self.port = port
        self.data_dir = data_dir
        self.ready = ready
        self.env = env
        self.log_path = data_dir / "stdout.log"
        self.log_files = [self.log_path, *log_files]
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        """Start the process and wait until it answers; clean up and raise if it does not."""
        with self.log_path.open("ab") as log:
            self.proc = subprocess.Popen(
                self.argv,
                env=self.env,
                cwd=self.data_dir,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,  # its own process group: stop() ends its children too
            )
        _track(self)
        started = time.monotonic()
        timeout = _READY_TIMEOUT[self.name]
        deadline = started + timeout
        while True:
            if self.proc.poll() is not None:
                code = self.proc.returncode
                self.stop()
                raise BrokerUnavailable(
                    f"{self.argv[0]} exited with status {code} before answering on port "
                    f"{self.port}{self.log_tail()}"
                )
            if self.ready():
                logger.info(
                    "%s answers on port %d after %.1fs",
                    self.name,
                    self.port,
                    time.monotonic() - started,
                )
                return
            if time.monotonic() >= deadline:
                self.stop()
                raise BrokerUnavailable(
                    f"{self.argv[0]} did not answer on port {self.port} within {timeout:.0f}s"
                    f"{self.log_tail()}"
                )
            time.sleep(0.1)

    def stop(self, *, hard: bool = False) -> None:
        proc = self.proc
        if proc is None:
            return
        pgid = proc.pid  # the leader of its own session and group
        if not hard:
            _signal_group(pgid, signal.SIGTERM)
            _wait_group(proc, _STOP_TIMEOUT[self.name])
        if _group_alive(proc, pgid):
            _signal_group(pgid, signal.SIGKILL)
            if not _wait_group(proc, 5.0):
                logger.warning("%s (process group %d) survived SIGKILL", self.name, pgid)
        self.proc = None
        _untrack(self)

    def restart(self, *, hard: bool = False) -> None:
        self.stop(hard=hard)
        self.start()

    def log_tail(self, lines: int = 30) -> str:
        tail: list[str] = []
        for path in self.log_files:
            with contextlib.suppress(OSError):
                text = path.read_text(errors="replace").rstrip()
                if text:
                    tail.append(f"\n--- {path} (last {lines} lines) ---\n")
                    tail.append("\n".join(text.splitlines()[-lines:]))
        return "".join(tail)


def _signal_group(pgid: int, sig: signal.Signals) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, sig)


def _group_alive(proc: subprocess.Popen[bytes], pgid: int) -> bool:
    """True while any process of the group is alive (zombies do not count)."""
    if proc.poll() is None:
        return True
    proc_dir = Path("/proc")
    if not proc_dir.is_dir():  # not Linux: ask the kernel, zombies included
        try:
            os.killpg(pgid, 0)
        except ProcessLookupError:
            return False
        except PermissionError:
            return True
        return True
    for stat in proc_dir.glob("[0-9]*/stat"):
        try:
            # "pid (comm) state ppid pgrp ...": comm may contain spaces and parentheses.
            fields = stat.read_text().rpartition(")")[2].split()
        except OSError:
            continue
        if len(fields) > 2 and fields[2] == str(pgid) and fields[0] != "Z":
            return True
    return False


def _wait_group(proc: subprocess.Popen[bytes], timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while _group_alive(proc, proc.pid):
        if time.monotonic() >= deadline:
            return False
        time.sleep(0.05)
    return True


def _data_dir(tmp_dir: Path, name: str) -> Path:
    tmp_dir.mkdir(parents=True, exist_ok=True)
    return Path(tempfile.mkdtemp(prefix=f"{name}-", dir=tmp_dir))


def _start_local(
    name: str,
    tmp_dir: Path,
    build: Callable[[Path, int], _Process],
) -> _Process:
    """Start a local server, on a new free port when the chosen one was taken meanwhile."""
    last: BrokerUnavailable | None = None
    for _ in range(_START_ATTEMPTS):
        port = free_port()
        server = build(_data_dir(tmp_dir, name), port)
        try:
            server.start()
            return server
        except BrokerUnavailable as exc:
            last = exc
            if _bindable("127.0.0.1", port):  # not a lost race for the port: do not retry
                break
    assert last is not None
    raise last


def _local_redis(tmp_dir: Path, durable: bool) -> BrokerHandle:
    binary = shutil.which("redis-server")
    if binary is None:
        raise BrokerUnavailable("redis-server is not on PATH")

    def build(data_dir: Path, port: int) -> _Process:
        argv = [binary, "--port", str(port), "--bind", "127.0.0.1", "--save", ""]
        argv += ["--dir", str(data_dir), "--daemonize", "no"]
        # Durable: every acknowledged write is in the append-only file, fsynced, before the
        # reply, so a restart (even a SIGKILL) loses nothing that was confirmed.
        if durable:
            argv += ["--appendonly", "yes", "--appendfsync", "always"]
        else:
            argv += ["--appendonly", "no"]
        return _Process(
            "redis", argv, port=port, data_dir=data_dir, ready=lambda: _redis_pings(port)
        )

    server = _start_local("redis", tmp_dir, build)
    return BrokerHandle(
        "redis",
        f"redis://127.0.0.1:{server.port}/0",
        host="127.0.0.1",
        port=server.port,
        owned=True,
        source="local",
        server=server,
    )


def _rabbitmq_binary() -> str | None:
    explicit = os.environ.get("ACKWISE_TEST_RABBITMQ_SERVER")
    if explicit:
        return explicit
    # Debian's /usr/sbin/rabbitmq-server is a wrapper that, run as root, re-runs the real
    # script as the rabbitmq user through su: that user cannot write our temporary directory.
    real = Path("/usr/lib/rabbitmq/bin/rabbitmq-server")
    if real.exists():
        return str(real)
    return shutil.which("rabbitmq-server")


def _local_rabbitmq(tmp_dir: Path, durable: bool, extra_conf: str = "") -> BrokerHandle:
    """Start a private RabbitMQ node.

    It shares the machine's epmd (``ERL_EPMD_PORT`` is one per host), so its node name is
    unique; its Erlang distribution port (``RABBITMQ_DIST_PORT``, else AMQP port + 20000) must
    differ from every other node's, the shared one's 25672 included, so it is a free port too.
    ``RABBITMQ_CONF_ENV_FILE`` points at an empty file: the system's ``rabbitmq-env.conf``
    would otherwise set the shared node's name.  The management plugin listens on a free
    port of its own (the URL's ``management`` option): AMQP cannot count unacknowledged
    messages, and the conformance checks need the broker's own in-flight count.
    """
    binary = _rabbitmq_binary()
    if binary is None:
        raise BrokerUnavailable("rabbitmq-server is not on PATH")
    node = f"ackwise-{uuid.uuid4().hex[:12]}@localhost"
    management: dict[int, int] = {}

    def build(data_dir: Path, port: int) -> _Process:
        dist_port = free_port()
        while dist_port == port:
            dist_port = free_port()
        mgmt_port = free_port()
        while mgmt_port in (port, dist_port):
            mgmt_port = free_port()
        management[port] = mgmt_port
        log_dir = data_dir / "log"
        log_dir.mkdir()
        config = data_dir / "rabbitmq.conf"
        config.write_text(
            f"listeners.tcp.default = 127.0.0.1:{port}\n"
            f"management.tcp.ip = 127.0.0.1\nmanagement.tcp.port = {mgmt_port}\n"
            # Queue totals read from the queues themselves at each request, not from the
            # statistics database (sampled every 5 s): exact in-flight counts for the checks.
            "management.disable_stats = true\nmanagement.enable_queue_totals = true\n"
            + extra_conf
            + "\n"
        )
        # Quorum queues report their counts on every leader tick (default 5 s).
        advanced = data_dir / "advanced.config"
        advanced.write_text(
            # A channel checks its consumers' consumer_timeout once per tick (default 60 s).
            "[{rabbit, [{quorum_tick_interval, 200}, {collect_statistics_interval, 100},\n"
            "           {channel_tick_interval, 1000}]},\n"
            " {rabbitmq_management_agent, [{collect_statistics_interval, 100}]},\n"
            " {rabbitmq_management, [{collect_statistics_interval, 100}]}].\n"
        )
        plugins = data_dir / "enabled_plugins"
        plugins.write_text("[rabbitmq_management].\n")
        env_file = data_dir / "rabbitmq-env.conf"
        env_file.write_text("")
        env = dict(os.environ)
        env.update(
            HOME=str(data_dir),  # its own Erlang cookie
            RABBITMQ_CONF_ENV_FILE=str(env_file),
            RABBITMQ_NODENAME=node,
            RABBITMQ_NODE_IP_ADDRESS="127.0.0.1",
            RABBITMQ_NODE_PORT=str(port),
            RABBITMQ_DIST_PORT=str(dist_port),
            RABBITMQ_MNESIA_BASE=str(data_dir / "mnesia"),
            RABBITMQ_LOG_BASE=str(log_dir),
            RABBITMQ_CONFIG_FILE=str(config),
            RABBITMQ_ADVANCED_CONFIG_FILE=str(advanced),
            RABBITMQ_ENABLED_PLUGINS_FILE=str(plugins),
            RABBITMQ_SERVER_ADDITIONAL_ERL_ARGS="-kernel inet_dist_use_interface {127,0,0,1}",
            ERL_EPMD_ADDRESS="127.0.0.1",
        )
        return _Process(
            "rabbitmq",
            [binary],
            port=port,
            data_dir=data_dir,
            env=env,
            ready=lambda: _amqp_answers(port),
            log_files=[log_dir / f"{node}.log"],
        )

    server = _start_local("rabbitmq", tmp_dir, build)
    return BrokerHandle(
        "rabbitmq",
        f"amqp://guest:guest@127.0.0.1:{server.port}/%2F"
        f"?management=http://127.0.0.1:{management[server.port]}",
        host="127.0.0.1",
        port=server.port,
        owned=True,
        source="local",
        server=server,
    )


def _moto_command() -> list[str] | None:
    # The environment running the tests first, then PATH (a system-wide moto[server]).  In
    # this environment: moto with atomic SQS receives (see ackwise_conformance.moto_server).
    if importlib.util.find_spec("moto") is not None and importlib.util.find_spec("flask"):
        return [sys.executable, "-m", "ackwise_conformance.moto_server"]
    venv_script = Path(sys.executable).parent / "moto_server"
    if venv_script.exists():
        return [str(venv_script)]
    found = shutil.which("moto_server")
    return [found] if found else None


def _local_moto(tmp_dir: Path, durable: bool) -> BrokerHandle:
    command = _moto_command()
    if command is None:
        raise BrokerUnavailable("moto's server is not installed (pip install 'moto[server]')")

    def build(data_dir: Path, port: int) -> _Process:
        argv = [*command, "-H", "127.0.0.1", "-p", str(port)]
        return _Process("sqs", argv, port=port, data_dir=data_dir, ready=lambda: _http(port))

    server = _start_local("sqs", tmp_dir, build)
    return BrokerHandle(
        "sqs",
        f"sqs://?endpoint_url=http://127.0.0.1:{server.port}&region=us-east-1",
        host="127.0.0.1",
        port=server.port,
        owned=True,
        source="local",
        server=server,
        not_restartable="moto keeps its queues in memory: a restart would lose them all",
    )


# -- containers --------------------------------------------------------------------------------
_docker_reason: list[str | None] = []


def _docker_unavailable_reason() -> str | None:
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


# name -> (image, container port, command, environment)
_IMAGES: dict[str, tuple[str, int, list[str] | None, dict[str, str]]] = {
    "redis": ("redis:7-alpine", 6379, None, {}),
    # guest may only log in over loopback; through Docker's port mapping it is not loopback.
    "rabbitmq": (
        "rabbitmq:3.13-alpine",
        5672,
        None,
        {"RABBITMQ_DEFAULT_USER": "ackwise", "RABBITMQ_DEFAULT_PASS": "ackwise"},
    ),
    "sqs": ("motoserver/moto:latest", 5000, None, {}),
}


class _Container(_Server):
    """A broker container, bound to a host port chosen here so that a restart keeps it."""

    def __init__(self, name: str, durable: bool) -> None:
        self.name = name
        image, container_port, command, env = _IMAGES[name]
        if name == "redis":
            command = ["redis-server", "--save", ""]
            command += (
                ["--appendonly", "yes", "--appendfsync", "always"]
                if durable
                else ["--appendonly", "no"]
            )
        self.host_port = free_port()
        module: Any = importlib.import_module("testcontainers.core.container")
        container = module.DockerContainer(image).with_bind_ports(container_port, self.host_port)
        if command:
            container = container.with_command(command)
        for key, value in env.items():
            container = container.with_env(key, value)
        self.container = container
        self.host = "127.0.0.1"
        self.started = False

    def start(self) -> None:
        try:
            self.container.start()
        except Exception as exc:
            raise BrokerUnavailable(f"could not start {self.name} container: {exc}") from exc
        self.started = True
        _track(self)
        with contextlib.suppress(Exception):
            self.host = str(self.container.get_container_host_ip())
        self.wait_ready()

    def wait_ready(self) -> None:
        probe = {"redis": _redis_pings, "rabbitmq": _amqp_answers, "sqs": _http}[self.name]
        timeout = _READY_TIMEOUT[self.name] * 2  # image start-up on top of the server's
        deadline = time.monotonic() + timeout
        while not probe(self.host_port, self.host):
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
            wrapped.restart(timeout=int(_STOP_TIMEOUT[self.name]))
        self.wait_ready()

    def stop(self) -> None:
        if self.started:
            self.started = False
            with contextlib.suppress(Exception):
                self.container.stop()
        _untrack(self)


def _start_container(name: str, *, durable: bool) -> BrokerHandle:
    server = _Container(name, durable)
    server.start()
    host, port = server.host, server.host_port
    url = {
        "redis": f"redis://{host}:{port}/0",
        "rabbitmq": f"amqp://ackwise:ackwise@{host}:{port}/%2F",
        "sqs": f"sqs://?endpoint_url=http://{host}:{port}&region=us-east-1",
    }[name]
    not_restartable = None
    if name == "sqs":
        not_restartable = "moto keeps its queues in memory: a restart would lose them all"
    return BrokerHandle(
        name,
        url,
        host=host,
        port=port,
        owned=True,
        source="container",
        server=server,
        not_restartable=not_restartable,
    )


# -- readiness probes (raw sockets: no client library needed) --------------------------------
def _redis_pings(port: int, host: str = "127.0.0.1") -> bool:
    """True when Redis answers PING with PONG (not ``-LOADING`` while it replays its AOF)."""
    try:
        with socket.create_connection((host, port), timeout=1.0) as sock:
            sock.sendall(b"*1\r\n$4\r\nPING\r\n")
            return sock.recv(64).startswith(b"+PONG")
    except OSError:
        return False


def _amqp_answers(port: int, host: str = "127.0.0.1") -> bool:
    """True when the AMQP 0-9-1 protocol header gets a frame back (``Connection.Start``).

    The port accepts connections a little before the broker can serve them.
    """
    try:
        with socket.create_connection((host, port), timeout=1.0) as sock:
            sock.settimeout(3.0)
            sock.sendall(b"AMQP\x00\x00\x09\x01")
            return sock.recv(8).startswith(b"\x01")  # frame type 1: a method frame
    except OSError:
        return False


def _http(port: int, host: str = "127.0.0.1") -> bool:
    try:
        with socket.create_connection((host, port), timeout=1.0) as sock:
            sock.settimeout(3.0)
            sock.sendall(b"GET / HTTP/1.0\r\nHost: localhost\r\n\r\n")
            return sock.recv(16).startswith(b"HTTP/")
    except OSError:
        return False


def _ephemeral_range() -> tuple[int, int]:
    try:
        low, high = Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()
        return int(low), int(high)
    except (OSError, ValueError):
        return 32768, 60999


def _bindable(host: str, port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        try:
            sock.bind((host, port))
        except OSError:
            return False
    return True
