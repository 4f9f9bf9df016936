"""The provisioning SPI: adapter packages register how the suite starts their brokers."""

from __future__ import annotations

import socket
import subprocess
import sys
import textwrap
import types
from importlib.metadata import EntryPoint
from pathlib import Path

import pytest

from ackwise_conformance import provisioning
from ackwise_conformance.brokers import BrokerUnavailable, NotRestartable, provide
from ackwise_conformance.provisioning import LocalServer, Provisioner, Slot

pytestmark = pytest.mark.timeout(60)

ADAPTERS = {
    "redis": "ackwise_redis._provision:RedisProvisioner",
    "nats": "ackwise_nats._provision:NatsProvisioner",
    "rabbitmq": "ackwise_rabbitmq._provision:RabbitmqProvisioner",
    "sqs": "ackwise_sqs._provision:SqsProvisioner",
    "postgresql": "ackwise_postgresql._provision:PostgreSQLProvisioner",
}


@pytest.fixture(autouse=True)
def _no_explicit_urls(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("REDIS", "RABBITMQ", "SQS", "POSTGRESQL", "KAFKA", "HTTPD"):
        monkeypatch.delenv(f"ACKWISE_TEST_{name}_URL", raising=False)


def test_the_adapters_of_this_repository_register_their_provisioners() -> None:
    installed = provisioning.installed()
    for name, value in ADAPTERS.items():
        assert installed[name].value == value
        assert installed[name].group == "ackwise.conformance.provisioners"
        provisioner = provisioning.load(name)
        assert isinstance(provisioner, Provisioner)
        assert provisioner.name == name


def test_an_unknown_broker_names_the_installed_provisioners(tmp_path: Path) -> None:
    with pytest.raises(BrokerUnavailable) as caught:
        provide("kafka", tmp_dir=tmp_path)
    reason = caught.value.reason
    assert reason.startswith("unknown broker 'kafka'")
    assert "ackwise.conformance.provisioners" in reason
    assert "installed: nats, postgresql, rabbitmq, redis, sqs" in reason
    assert "embedded: sqlite, memory" in reason
    assert "ACKWISE_TEST_KAFKA_URL" in reason


def test_an_explicit_url_needs_no_provisioner(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("ACKWISE_TEST_KAFKA_URL", "kafka://10.0.0.7:9092")
    handle = provide("kafka", tmp_dir=tmp_path)
    assert (handle.url, handle.host, handle.port, handle.source) == (
        "kafka://10.0.0.7:9092",
        "10.0.0.7",
        9092,
        "env",
    )


# -- a provisioner of another package: the suite's machinery around it ------------------------
class HttpdProvisioner(Provisioner):
    """Python's http.server plays a broker: enough to start, probe, restart and stop."""

    name = "httpd"
    ready_timeout = 15.0
    stop_timeout = 5.0

    def __init__(self) -> None:
        self.slots: list[Slot] = []

    def local(self, slot: Slot) -> LocalServer:
        self.slots.append(slot)
        other = slot.free_port()
        assert other != slot.port
        argv = [sys.executable, "-m", "http.server", str(slot.port), "--bind", slot.host]
        return LocalServer(argv=argv, url=f"httpd://{slot.host}:{slot.port}?other={other}")

    def ready(self, host: str, port: int) -> bool:
        try:
            with socket.create_connection((host, port), timeout=1.0) as sock:
                sock.sendall(b"GET / HTTP/1.0\r\n\r\n")
                return sock.recv(16).startswith(b"HTTP/")
        except OSError:
            return False


@pytest.fixture
def httpd(monkeypatch: pytest.MonkeyPatch) -> HttpdProvisioner:
    """An entry point ``httpd`` naming an instance in a module of this test's own."""
    instance = HttpdProvisioner()
    module = types.ModuleType("fake_provisioners")
    module.httpd = instance  # type: ignore[attr-defined]
    module.nothing = object()  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, module.__name__, module)
    group = provisioning.ENTRY_POINT_GROUP
    eps = {
        **provisioning.installed(),
        "httpd": EntryPoint("httpd", "fake_provisioners:httpd", group),
        "nothing": EntryPoint("nothing", "fake_provisioners:nothing", group),
    }
    monkeypatch.setattr(provisioning, "installed", lambda: eps)
    return instance


def test_a_registered_provisioner_is_started_restarted_and_stopped(
    httpd: HttpdProvisioner, tmp_path: Path
) -> None:
    handle = provide("HTTPD", tmp_dir=tmp_path, durable=False)
    try:
        (slot,) = httpd.slots
        assert (handle.name, handle.source, handle.owned) == ("httpd", "local", True)
        assert handle.url.startswith(f"httpd://127.0.0.1:{slot.port}?other=")
        assert (handle.host, handle.port) == ("127.0.0.1", slot.port)
        assert slot.port not in {4369, 5672, 6379, 15672, 25672}
        assert not slot.durable and slot.config == ""
        assert slot.data_dir.parent == tmp_path.resolve() and slot.data_dir.is_dir()
        assert httpd.ready("127.0.0.1", slot.port)
        handle.restart(hard=True)
        assert httpd.ready("127.0.0.1", slot.port)
    finally:
        handle.stop()
    assert not httpd.ready("127.0.0.1", slot.port)


def test_a_provisioner_says_why_restarting_is_of_no_use(
    httpd: HttpdProvisioner, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(httpd, "not_restartable", "it keeps nothing", raising=False)
    handle = provide("httpd", tmp_dir=tmp_path)
    try:
        with pytest.raises(NotRestartable, match="httpd: it keeps nothing"):
            handle.restart()
    finally:
        handle.stop()


def test_an_entry_point_that_is_no_provisioner_is_an_error(httpd: HttpdProvisioner) -> None:
    with pytest.raises(TypeError, match="not a Provisioner"):
        provisioning.load("nothing")


def test_importing_an_adapter_never_imports_the_suite() -> None:
    """Only the suite loads a provisioner (``_provision``) or the moto launcher."""
    code = textwrap.dedent(
        """
        import importlib, pkgutil, sys
        for package in (
            *("ackwise_redis", "ackwise_rabbitmq", "ackwise_sqs", "ackwise_postgresql"),
            "ackwise_nats",
        ):
            module = importlib.import_module(package)
            for info in pkgutil.iter_modules(module.__path__, package + "."):
                if info.name.rpartition(".")[2] not in ("_provision", "_moto_server"):
                    importlib.import_module(info.name)
        suite = sorted(name for name in sys.modules if name.startswith("ackwise_conformance"))
        assert not suite, suite
        """
    )
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=False
    )
    assert result.returncode == 0, result.stderr
