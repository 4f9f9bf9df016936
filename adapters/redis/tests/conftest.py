"""Fixtures of the Redis adapter's tests: one private redis-server per session.

The server is started by the conformance suite (as ``ackwise_redis._provision`` says) on a free
port (never the shared Redis on 6379, which these tests neither flush nor restart), with the
durable configuration (append-only file, fsync always), so the restart scenario C19 and the
fault proxy of C18 can use it.  ``ACKWISE_TEST_REDIS_URL`` points the tests at another Redis
instead (C19 is then n/a).  Without redis-server the tests skip, or fail under ``CI=true``.
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from redis_topologies import LocalCluster, LocalSentinels, TopologyUnavailable

from ackwise_conformance.brokers import (
    BrokerHandle,
    missing_broker,
    provide_or_skip,
)
from ackwise_conformance.helpers import eventually


@pytest.fixture(scope="session")
def redis_broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[BrokerHandle]:
    handle = provide_or_skip("redis", tmp_dir=tmp_path_factory.mktemp("redis"), durable=True)
    yield handle
    handle.stop()


@pytest.fixture
def redis_url(redis_broker: BrokerHandle) -> Iterator[str]:
    """The private broker's URL with a key prefix of this test's own; every key under the
    prefix is deleted after the test (``ACKWISE_TEST_REDIS_URL`` may name a shared Redis)."""
    prefix = f"t-{uuid.uuid4().hex[:12]}"
    sep = "&" if "?" in redis_broker.url else "?"
    yield f"{redis_broker.url}{sep}prefix={prefix}"
    import redis

    # Queues, workers, locks, results, rate-limit slots and quarantined keys alike: every key
    # of the prefix is ``{<prefix>}…`` or ``{<prefix>:…}…``.
    with redis.Redis.from_url(redis_broker.url.split("?")[0]) as client:
        for pattern in (f"{{{prefix}}}*", f"{{{prefix}:*"):
            keys = list(client.scan_iter(match=pattern, count=1000))
            for i in range(0, len(keys), 500):
                client.unlink(*keys[i : i + 500])


@pytest.fixture
def own_redis(tmp_path: Path) -> Iterator[BrokerHandle]:
    """A redis-server of this test alone (the test changes its configuration)."""
    if os.environ.get("ACKWISE_TEST_REDIS_URL"):
        pytest.skip("ACKWISE_TEST_REDIS_URL is set: this test needs a redis-server of its own")
    handle = provide_or_skip("redis", tmp_dir=tmp_path, durable=False)
    yield handle
    handle.stop()


@pytest.fixture
def own_redis_with_socket(tmp_path: Path) -> Iterator[Path]:
    """A redis-server listening on a unix socket only; yields the socket's path."""
    binary = shutil.which("redis-server")
    if binary is None:
        missing_broker("redis-server is not on PATH")
    path = tmp_path / "redis.sock"
    proc = subprocess.Popen(
        [binary, "--port", "0", "--unixsocket", str(path), "--save", "", "--appendonly", "no"],
        cwd=tmp_path,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )

    def answers() -> bool:
        try:
            with socket.socket(socket.AF_UNIX) as sock:
                sock.settimeout(1.0)
                sock.connect(str(path))
                sock.sendall(b"*1\r\n$4\r\nPING\r\n")
                return sock.recv(16).startswith(b"+PONG")
        except OSError:
            return False

    try:
        eventually(answers, 15.0, description="redis-server on a unix socket")
        yield path
    finally:
        proc.kill()
        proc.wait(10)


@pytest.fixture(scope="session")
def redis_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    """A Redis Cluster of the session: 3 primaries, each with a replica (never failed over)."""
    try:
        cluster = LocalCluster(tmp_path_factory.mktemp("cluster")).start()
    except TopologyUnavailable as exc:
        missing_broker(str(exc))
    yield cluster
    cluster.stop()


@pytest.fixture(scope="session")
def redis_sentinels(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalSentinels]:
    """A master, a replica and 3 sentinels of the session (never failed over)."""
    try:
        sentinels = LocalSentinels(tmp_path_factory.mktemp("sentinel")).start()
    except TopologyUnavailable as exc:
        missing_broker(str(exc))
    yield sentinels
    sentinels.stop()
