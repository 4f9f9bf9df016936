"""``rediss://``: the adapter over TLS, against a private redis-server with a self-signed cert."""

from __future__ import annotations

import shutil
import subprocess
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from ackwise import open_adapter
from ackwise.errors import AdapterError, BrokerUnavailable
from ackwise.spi import Outgoing, QueueSpec
from ackwise_conformance.brokers import free_port, missing_broker
from ackwise_conformance.helpers import eventually


@pytest.fixture
def tls_redis(tmp_path: Path) -> Iterator[tuple[int, Path]]:
    """A redis-server serving TLS only; yields (port, the certificate that signs itself)."""
    server, openssl = shutil.which("redis-server"), shutil.which("openssl")
    if server is None or openssl is None:
        missing_broker("redis-server and openssl are needed for the TLS test")
    cert, key = tmp_path / "cert.pem", tmp_path / "key.pem"
    subprocess.run(
        [
            *(openssl, "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1"),
            *("-keyout", str(key), "-out", str(cert), "-subj", "/CN=127.0.0.1"),
            *("-addext", "subjectAltName=IP:127.0.0.1"),
        ],
        check=True,
        capture_output=True,
    )
    port = free_port()
    proc = subprocess.Popen(
        [
            *(server, "--port", "0", "--tls-port", str(port), "--bind", "127.0.0.1"),
            *("--tls-cert-file", str(cert), "--tls-key-file", str(key)),
            *("--tls-ca-cert-file", str(cert), "--tls-auth-clients", "no"),
            *("--save", "", "--appendonly", "no", "--dir", str(tmp_path)),
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        yield port, cert
    finally:
        proc.kill()
        proc.wait(10)


def test_rediss_round_trip_with_a_verified_certificate(tls_redis: tuple[int, Path]) -> None:
    port, cert = tls_redis
    adapter = open_adapter(f"rediss://127.0.0.1:{port}/0?ssl_ca_certs={cert}")

    def opened() -> bool:
        try:
            adapter.open()
        except BrokerUnavailable:
            return False
        return True

    eventually(opened, 15.0, description="redis-server to serve TLS")
    queue = f"tls-{uuid.uuid4().hex[:8]}"
    adapter.declare(QueueSpec(queue))
    adapter.publish(queue, [Outgoing("m", b"over tls")])
    (d,) = adapter.receive(queue, max_messages=1, wait=2.0, lease=5.0)
    assert (d.message_id, d.body) == ("m", b"over tls")
    adapter.ack([d])
    assert adapter.stats(queue).in_flight == 0
    adapter.close()


def test_rediss_refuses_a_certificate_it_cannot_verify(tls_redis: tuple[int, Path]) -> None:
    port, cert = tls_redis
    trusting = open_adapter(f"rediss://127.0.0.1:{port}/0?ssl_ca_certs={cert}")

    def up() -> bool:
        try:
            trusting.open()
        except BrokerUnavailable:
            return False
        trusting.close()
        return True

    eventually(up, 15.0, description="redis-server to serve TLS")
    # The system's CAs did not sign the self-signed certificate.
    with pytest.raises(AdapterError, match=r"certificate|CERTIFICATE|SSL"):
        open_adapter(f"rediss://127.0.0.1:{port}/0").open()
    # Verification off (ssl_cert_reqs=none) connects.
    unverified = open_adapter(f"rediss://127.0.0.1:{port}/0?ssl_cert_reqs=none")
    unverified.open()
    unverified.close()
