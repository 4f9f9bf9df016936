"""Broker provisioning for the conformance suite: explicit URLs, containers, local servers."""

from __future__ import annotations

import importlib.machinery
import os
import shutil
import signal
import socket
import subprocess
import sys
import textwrap
import time
import types
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from ackwise import open_adapter
from ackwise_conformance import _containers, _servers
from ackwise_conformance.brokers import (
    BrokerHandle,
    BrokerUnavailable,
    NotRestartable,
    free_port,
    missing_broker,
    provide,
    provide_or_skip,
)
from ackwise_conformance.helpers import eventually

pytestmark = pytest.mark.timeout(120)


@pytest.fixture(autouse=True)
def _no_explicit_urls(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("REDIS", "RABBITMQ", "SQS", "SQLITE", "MEMORY"):
        monkeypatch.delenv(f"ACKWISE_TEST_{name}_URL", raising=False)


@pytest.fixture
def started(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Any]:
    """``started(name, **options)``: provide a broker (or skip/fail as the suite would)."""
    handles: list[BrokerHandle] = []

    def start(name: str, **options: Any) -> BrokerHandle:
        handle = provide_or_skip(name, tmp_dir=tmp_path, **options)
        handles.append(handle)
        return handle

    yield start
    for handle in handles:
        handle.stop()


def resp(host: str, port: int, *args: str) -> bytes:
    """Send one command in raw RESP and return the raw reply."""
    command = f"*{len(args)}\r\n" + "".join(f"${len(a)}\r\n{a}\r\n" for a in args)
    with socket.create_connection((host, port), timeout=5) as sock:
        sock.sendall(command.encode())
        return sock.recv(65536)


def refuses(port: int) -> bool:
    try:
        socket.create_connection(("127.0.0.1", port), timeout=1).close()
    except ConnectionRefusedError:
        return True
    return False


def no_process_listens(port: int) -> bool:
    out = subprocess.run(
        ["ss", "-Htln", f"sport = :{port}"], capture_output=True, text=True, check=False
    )
    return out.returncode != 0 or not out.stdout.strip()


# -- embedded brokers --------------------------------------------------------------------------
def test_sqlite_is_a_file_in_the_temporary_directory(tmp_path: Path) -> None:
    handle = provide("sqlite", tmp_dir=tmp_path)
    assert handle.url == f"sqlite:///{tmp_path.resolve() / 'broker.db'}"
    assert (handle.name, handle.host, handle.port, handle.owned) == ("sqlite", None, None, True)
    assert (handle.pid, handle.log_path) == (None, None)  # no process of its own
    open_adapter(handle.url)  # a URL ackwise accepts
    with pytest.raises(NotRestartable, match="embedded broker: there is no broker process"):
        handle.restart()
    with pytest.raises(ValueError, match="no network address"):
        handle.url_via("127.0.0.1", 1234)
    handle.stop()  # nothing to stop, and harmless


def test_every_memory_broker_is_a_new_one(tmp_path: Path) -> None:
    first, second = provide("memory", tmp_dir=tmp_path), provide("memory", tmp_dir=tmp_path)
    assert first.url.startswith("memory://")
    assert first.url != second.url
    open_adapter(first.url)
    assert first.host is None and first.owned
    assert not first.restartable
    with pytest.raises(NotRestartable):
        first.restart()


def test_an_unknown_broker_is_unavailable_with_the_known_names(tmp_path: Path) -> None:
    with pytest.raises(BrokerUnavailable) as caught:
        provide("kafka", tmp_dir=tmp_path)
    assert "kafka" in caught.value.reason and "rabbitmq" in caught.value.reason


# -- explicit URLs -----------------------------------------------------------------------------
def test_an_explicit_url_is_used_as_it_is_and_never_restarted(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("ACKWISE_TEST_REDIS_URL", "redis://:s3cret@10.1.2.3:6390/2")
    handle = provide("redis", tmp_dir=tmp_path)
    assert handle.url == "redis://:s3cret@10.1.2.3:6390/2"
    assert (handle.host, handle.port, handle.owned, handle.source) == (
        "10.1.2.3",
        6390,
        False,
        "env",
    )
    assert handle.url_via("127.0.0.1", 4000) == "redis://:s3cret@127.0.0.1:4000/2"
    assert (handle.pid, handle.log_path) == (None, None)  # not a process the suite started
    assert "s3cret" not in repr(handle)
    with pytest.raises(NotRestartable, match="ACKWISE_TEST_REDIS_URL") as caught:
        handle.restart()
    assert "s3cret" not in caught.value.reason
    handle.stop()  # not ours: nothing happens


def test_an_explicit_url_without_a_port_gets_the_scheme_default(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("ACKWISE_TEST_RABBITMQ_URL", "amqp://u:p@rabbit.internal/vhost")
    handle = provide("rabbitmq", tmp_dir=tmp_path)
    assert (handle.host, handle.port) == ("rabbit.internal", 5672)
    assert handle.url_via("127.0.0.1", 7000) == "amqp://u:p@127.0.0.1:7000/vhost"


def test_an_sqs_url_is_proxied_through_its_endpoint(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    url = "sqs://?endpoint_url=http://127.0.0.1:4566&region=eu-west-1"
    monkeypatch.setenv("ACKWISE_TEST_SQS_URL", url)
    handle = provide("sqs", tmp_dir=tmp_path)
    assert (handle.host, handle.port) == ("127.0.0.1", 4566)
    assert (
        handle.url_via("127.0.0.1", 9999)
        == "sqs://?endpoint_url=http://127.0.0.1:9999&region=eu-west-1"
    )


# -- free ports --------------------------------------------------------------------------------
def test_free_ports_are_bindable_and_never_the_shared_services() -> None:
    ports = {free_port() for _ in range(50)}
    assert not ports & {4369, 5672, 6379, 15672, 25672}
    for port in list(ports)[:5]:
        with socket.create_server(("127.0.0.1", port)):
            pass
    low = int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    assert all(port < low for port in ports)  # no outgoing connection can be given it


def test_a_free_port_is_never_handed_out_twice_before_it_is_bound() -> None:
    """A cluster node is given its client and bus ports before it binds either: two picks of
    one process must differ, even while both are still free."""
    ports = [free_port() for _ in range(2000)]
    assert len(set(ports)) == len(ports)


# -- local redis-server ------------------------------------------------------------------------
def test_a_local_redis_answers_and_keeps_its_data_across_a_restart(started: Any) -> None:
    if shutil.which("redis-server") is None:
        missing_broker("redis-server is not on PATH")
    handle = started("redis")
    assert handle.source in ("local", "container") and handle.owned
    assert handle.url == f"redis://{handle.host}:{handle.port}/0"
    assert handle.port != 6379
    assert resp(handle.host, handle.port, "PING") == b"+PONG\r\n"
    if handle.source == "local":  # the process the suite started, and where it writes
        assert handle.pid is not None and handle.log_path is not None
        assert Path(f"/proc/{handle.pid}").exists()
        assert handle.log_path.is_file()
    assert resp(handle.host, handle.port, "SET", "survivor", "yes") == b"+OK\r\n"

    handle.restart()
    assert resp(handle.host, handle.port, "GET", "survivor") == b"$3\r\nyes\r\n"

    # Durable means fsynced before the reply: even a SIGKILL loses no acknowledged write.
    assert resp(handle.host, handle.port, "SET", "after-kill", "yes") == b"+OK\r\n"
    handle.restart(hard=True)
    assert resp(handle.host, handle.port, "GET", "after-kill") == b"$3\r\nyes\r\n"

    handle.stop()
    assert refuses(handle.port)
    assert no_process_listens(handle.port)
    assert handle.pid is None
    handle.stop()  # idempotent


def test_a_non_durable_redis_forgets_on_restart(started: Any) -> None:
    if shutil.which("redis-server") is None:
        missing_broker("redis-server is not on PATH")
    handle = started("redis", durable=False)
    resp(handle.host, handle.port, "SET", "gone", "soon")
    handle.restart()
    assert resp(handle.host, handle.port, "GET", "gone") == b"$-1\r\n"


def test_a_redis_that_cannot_start_is_unavailable_with_its_log(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    fake = tmp_path / "bin" / "redis-server"
    fake.parent.mkdir()
    fake.write_text("#!/bin/sh\necho 'FATAL: no can do' >&2\nexit 3\n")
    fake.chmod(0o755)
    monkeypatch.setenv("PATH", f"{fake.parent}{os.pathsep}{os.environ['PATH']}")
    with pytest.raises(BrokerUnavailable) as caught:
        provide("redis", tmp_dir=tmp_path)
    assert "status 3" in caught.value.reason
    assert "FATAL: no can do" in caught.value.reason
    assert "ACKWISE_TEST_REDIS_URL" in caught.value.reason


def test_the_atexit_hook_stops_what_a_test_forgot(
    started: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    if shutil.which("redis-server") is None:
        missing_broker("redis-server is not on PATH")
    handle = started("redis")
    assert handle._server in _servers._live
    # Only this test's server: other tests' brokers in this session must live on.
    monkeypatch.setattr(_servers, "_live", {handle._server})
    _servers._stop_all()
    assert refuses(handle.port)
    assert not _servers._live


# -- local moto (SQS) --------------------------------------------------------------------------
def test_a_local_moto_serves_sqs_and_is_not_restartable(started: Any) -> None:
    handle = started("sqs")
    assert handle.url == (
        f"sqs://?endpoint_url=http://{handle.host}:{handle.port}&region=us-east-1"
    )
    with socket.create_connection((handle.host, handle.port), timeout=5) as sock:
        sock.sendall(b"GET / HTTP/1.0\r\n\r\n")
        assert sock.recv(16).startswith(b"HTTP/")
    with pytest.raises(NotRestartable, match="in memory"):
        handle.restart()
    handle.stop()
    assert refuses(handle.port)


# -- local rabbitmq-server ---------------------------------------------------------------------
@pytest.mark.slow
def test_a_private_rabbitmq_node_starts_restarts_and_stops(started: Any) -> None:
    if (
        shutil.which("rabbitmq-server") is None
        and not Path("/usr/lib/rabbitmq/bin/rabbitmq-server").exists()
    ):
        pytest.skip("rabbitmq-server is not installed")
    t0 = time.monotonic()
    handle = started("rabbitmq")
    print(f"rabbitmq started in {time.monotonic() - t0:.1f}s")
    assert handle.port not in (5672, 25672)
    assert handle.url.startswith(f"amqp://guest:guest@{handle.host}:{handle.port}/%2F")

    def amqp_answers() -> bool:
        with socket.create_connection((handle.host, handle.port), timeout=5) as sock:
            sock.sendall(b"AMQP\x00\x00\x09\x01")
            return sock.recv(8).startswith(b"\x01")

    assert amqp_answers()
    t0 = time.monotonic()
    handle.restart()
    print(f"rabbitmq restarted in {time.monotonic() - t0:.1f}s")
    assert amqp_answers()
    handle.stop()
    assert refuses(handle.port)
    eventually(lambda: no_process_listens(handle.port), timeout=10)


# -- containers (no Docker engine here: the path is exercised with fakes) ----------------------
def fake_module(name: str, **attrs: Any) -> types.ModuleType:
    module = types.ModuleType(name)
    module.__spec__ = importlib.machinery.ModuleSpec(name, None)
    for key, value in attrs.items():
        setattr(module, key, value)
    return module


@pytest.fixture
def fresh_docker_probe(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(_containers, "_docker_reason", [])


def test_without_testcontainers_the_container_step_is_skipped_at_once(
    fresh_docker_probe: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setitem(sys.modules, "testcontainers", None)  # not importable
    assert _containers.docker_unavailable_reason() == "testcontainers is not installed"


def test_a_docker_engine_that_does_not_answer_is_skipped(
    fresh_docker_probe: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    class Client:
        def ping(self) -> bool:
            raise ConnectionError("Cannot connect to the Docker daemon")

        def close(self) -> None:
            pass

    monkeypatch.setitem(sys.modules, "testcontainers", fake_module("testcontainers"))
    monkeypatch.setitem(
        sys.modules, "docker", fake_module("docker", from_env=lambda **kw: Client())
    )
    reason = _containers.docker_unavailable_reason()
    assert reason is not None and "Cannot connect to the Docker daemon" in reason


def test_a_docker_ping_that_hangs_does_not_hang_the_session(
    fresh_docker_probe: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    class Client:
        def ping(self) -> bool:
            time.sleep(30)
            return True

        def close(self) -> None:
            pass

    monkeypatch.setattr(_containers, "_DOCKER_PING_TIMEOUT", 0.2)
    monkeypatch.setitem(sys.modules, "testcontainers", fake_module("testcontainers"))
    monkeypatch.setitem(
        sys.modules, "docker", fake_module("docker", from_env=lambda **kw: Client())
    )
    started = time.monotonic()
    reason = _containers.docker_unavailable_reason()
    assert reason is not None and "within" in reason
    assert time.monotonic() - started < 2


class FakeContainer:
    """Plays testcontainers' DockerContainer by running redis-server on the bound host port."""

    instances: list[FakeContainer] = []

    def __init__(self, image: str) -> None:
        self.image = image
        self.ports: dict[int, int] = {}
        self.command: list[str] = []
        self.env: dict[str, str] = {}
        self.proc: subprocess.Popen[bytes] | None = None
        self.data_dir = Path(os.environ["FAKE_CONTAINER_DIR"])
        FakeContainer.instances.append(self)

    def with_bind_ports(self, container: int, host: int) -> FakeContainer:
        self.ports[container] = host
        return self

    def with_command(self, command: list[str]) -> FakeContainer:
        self.command = command
        return self

    def with_env(self, key: str, value: str) -> FakeContainer:
        self.env[key] = value
        return self

    def start(self) -> FakeContainer:
        port = self.ports[6379]
        argv = [*self.command, "--port", str(port), "--bind", "127.0.0.1"]
        argv += ["--dir", str(self.data_dir)]
        self.proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL)
        return self

    def get_container_host_ip(self) -> str:
        return "127.0.0.1"

    def get_wrapped_container(self) -> Any:
        outer = self

        class Wrapped:
            def restart(self, timeout: int) -> None:
                outer.stop()
                outer.start()

            def kill(self) -> None:
                assert outer.proc is not None
                outer.proc.send_signal(signal.SIGKILL)
                outer.proc.wait()

            def start(self) -> None:
                outer.start()

        return Wrapped()

    def stop(self) -> None:
        if self.proc is not None:
            self.proc.terminate()
            self.proc.wait(10)
            self.proc = None


def test_a_container_is_used_when_a_docker_engine_answers(
    fresh_docker_probe: None, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    if shutil.which("redis-server") is None:
        missing_broker("redis-server is not on PATH (it plays the container here)")

    class Client:
        def ping(self) -> bool:
            return True

        def close(self) -> None:
            pass

    monkeypatch.setenv("FAKE_CONTAINER_DIR", str(tmp_path))
    monkeypatch.setattr(FakeContainer, "instances", [])
    testcontainers = fake_module("testcontainers")
    core = fake_module("testcontainers.core")
    container_module = fake_module("testcontainers.core.container", DockerContainer=FakeContainer)
    for module in (testcontainers, core, container_module):
        monkeypatch.setitem(sys.modules, module.__name__, module)
    monkeypatch.setitem(
        sys.modules, "docker", fake_module("docker", from_env=lambda **kw: Client())
    )

    handle = provide("redis", tmp_dir=tmp_path)
    try:
        (container,) = FakeContainer.instances
        assert container.image.startswith("redis:")
        assert "--appendonly" in container.command and "always" in container.command
        assert handle.source == "container" and handle.owned
        assert handle.url == f"redis://127.0.0.1:{handle.port}/0"
        assert container.ports == {6379: handle.port}  # a fixed host port survives restarts
        resp("127.0.0.1", handle.port, "SET", "k", "v")
        handle.restart(hard=True)
        assert resp("127.0.0.1", handle.port, "GET", "k") == b"$1\r\nv\r\n"
    finally:
        handle.stop()
    assert container.proc is None


# -- missing brokers: a skip on a laptop, a failure in CI --------------------------------------
def run_pytest(tmp_path: Path, ci: str | None) -> subprocess.CompletedProcess[str]:
    test = tmp_path / "test_missing.py"
    test.write_text(
        textwrap.dedent(
            """
            from ackwise_conformance.brokers import missing_broker

            def test_needs_a_broker():
                missing_broker("no frobnicator broker here")
            """
        )
    )
    env = {k: v for k, v in os.environ.items() if k != "CI"}
    if ci is not None:
        env["CI"] = ci
    return subprocess.run(
        [sys.executable, "-m", "pytest", "-rsf", "-p", "no:cacheprovider", str(test)],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def test_a_missing_broker_is_a_skip_locally(tmp_path: Path) -> None:
    result = run_pytest(tmp_path, ci=None)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "1 skipped" in result.stdout
    assert "no frobnicator broker here" in result.stdout


def test_a_missing_broker_is_a_failure_under_ci(tmp_path: Path) -> None:
    result = run_pytest(tmp_path, ci="true")
    assert result.returncode == 1, result.stdout + result.stderr
    assert "1 failed" in result.stdout
    assert "no frobnicator broker here" in result.stdout
