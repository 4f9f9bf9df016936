"""The check of what a test run left in the shared services (``tests/shared_services.py``).

Each run here is a pytest subprocess (pytester) whose check looks at a Redis and a NATS of
this module's own, never at the shared ones, which other runs may be using.
"""

from __future__ import annotations

import asyncio
import json
import shutil
import subprocess
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import shared_services

from ackwise_conformance.brokers import BrokerHandle, provide_or_skip

pytest_plugins = ["pytester"]

TESTS = Path(__file__).parent

#: The inner run's conftest: the check, as the root conftest.py registers it.
CONFTEST = f"""
import sys
sys.path.insert(0, {str(TESTS)!r})
import shared_services


def pytest_configure(config):
    shared_services.register(config)
"""

#: The inner run's tests: one leaves a key and a stream, one cleans up after itself, one
#: leaves a key that expires in seconds (a lease: it goes by itself).
INNER = """
import asyncio
import json

import nats
import redis

REDIS, NATS = {redis_url!r}, {nats_url!r}


def test_leaves_a_key_and_a_stream():
    redis.Redis.from_url(REDIS).set("{{leaky1a2b3c4d:default}}:seq", 1)

    async def create():
        client = await nats.connect(NATS)
        config = {{"name": "leaky-5e6f7a8b9c0d-q", "subjects": ["leaky.5e6f7a8b9c0d"]}}
        await client.request("$JS.API.STREAM.CREATE.leaky-5e6f7a8b9c0d-q",
                             json.dumps(config).encode(), 5)
        await client.close()

    asyncio.run(create())


def test_cleans_up():
    client = redis.Redis.from_url(REDIS)
    client.set("{{tidy9f8e7d6c}}:workers", 1)
    client.delete("{{tidy9f8e7d6c}}:workers")


def test_leaves_a_lease_that_expires():
    redis.Redis.from_url(REDIS).set("{{brief5a6b7c8d}}:lock", 1, px=20_000)
"""


@pytest.fixture(scope="module")
def private_nats(tmp_path_factory: pytest.TempPathFactory) -> Iterator[BrokerHandle]:
    handle = provide_or_skip("nats", tmp_dir=tmp_path_factory.mktemp("nats"), durable=False)
    yield handle
    handle.stop()


@pytest.fixture
def inner(
    pytester: pytest.Pytester,
    monkeypatch: pytest.MonkeyPatch,
    private_redis: Any,
    private_nats: BrokerHandle,
) -> Iterator[pytest.Pytester]:
    """A pytester directory whose run leaves ``{leaky…}`` and a stream ``leaky-…`` behind, its
    check pointed at this module's Redis and NATS (RabbitMQ left out)."""
    monkeypatch.setenv("ACKWISE_SHARED_REDIS", private_redis.url.split("?")[0])
    monkeypatch.setenv("ACKWISE_SHARED_NATS", private_nats.url.split("?")[0])
    monkeypatch.setenv("ACKWISE_SHARED_RABBITMQ", "")
    pytester.makeconftest(CONFTEST)
    pytester.makepyfile(
        test_inner=INNER.format(
            redis_url=private_redis.url.split("?")[0], nats_url=private_nats.url.split("?")[0]
        )
    )
    yield pytester
    import redis

    with redis.Redis.from_url(private_redis.url.split("?")[0]) as client:
        client.flushdb()  # the module's own server: the next run starts from nothing
    _delete_stream(private_nats.url.split("?")[0], "leaky-5e6f7a8b9c0d-q")


def _delete_stream(url: str, name: str) -> None:
    import nats

    async def delete() -> None:
        client = await nats.connect(url)
        await client.request(f"$JS.API.STREAM.DELETE.{name}", b"", 5)
        await client.close()

    asyncio.run(delete())


def test_under_ci_a_run_that_leaves_something_fails_naming_it_and_its_prefix(
    inner: pytest.Pytester, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("CI", "true")
    result = inner.runpytest_subprocess("-p", "xdist", "-n", "2", "--dist", "loadfile")
    out = result.stdout.str()
    assert result.ret == pytest.ExitCode.TESTS_FAILED, out
    assert "3 passed" in out  # the tests passed: the run fails for what they left
    assert "left in the shared services (CI=true: the run fails)" in out
    assert "redis db0, prefix 'leaky': 1 left: {leaky1a2b3c4d:default}:seq" in out
    assert "nats stream, prefix 'leaky-': 1 left: leaky-5e6f7a8b9c0d-q" in out
    assert "tidy" not in out and "brief" not in out


def test_without_ci_it_only_warns(inner: pytest.Pytester, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("CI", raising=False)
    result = inner.runpytest_subprocess()
    out = result.stdout.str()
    assert result.ret == pytest.ExitCode.OK, out
    assert "a warning: CI is not set" in out
    assert "{leaky1a2b3c4d:default}:seq" in out


def test_a_run_that_leaves_nothing_says_nothing(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch, private_redis: Any
) -> None:
    monkeypatch.setenv("CI", "true")
    monkeypatch.setenv("ACKWISE_SHARED_REDIS", private_redis.url.split("?")[0])
    monkeypatch.setenv("ACKWISE_SHARED_NATS", "")
    monkeypatch.setenv("ACKWISE_SHARED_RABBITMQ", "")
    pytester.makeconftest(CONFTEST)
    pytester.makepyfile(test_inner="def test_nothing():\n    pass\n")
    result = pytester.runpytest_subprocess()
    assert result.ret == pytest.ExitCode.OK, result.stdout.str()
    assert "shared services" not in result.stdout.str()


def test_a_service_that_cannot_be_listed_is_named_and_not_checked(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("CI", "true")
    monkeypatch.setenv("ACKWISE_SHARED_REDIS", "redis://127.0.0.1:1/0")
    monkeypatch.setenv("ACKWISE_SHARED_NATS", "")
    monkeypatch.setenv("ACKWISE_SHARED_RABBITMQ", "")
    pytester.makeconftest(CONFTEST)
    pytester.makepyfile(test_inner="def test_nothing():\n    pass\n")
    result = pytester.runpytest_subprocess()
    assert result.ret == pytest.ExitCode.OK, result.stdout.str()
    result.stdout.fnmatch_lines(["shared services: not checked: redis: ConnectionError: *"])


def test_what_is_left_is_grouped_by_the_part_before_the_random_one() -> None:
    assert shared_services.prefix_of("{dash1a2b3c4d:default}:seq") == "dash"
    assert shared_services.prefix_of("{ackwise:conformance-ab12cd-0f1e2d3c4b5a}:ready") == (
        "ackwise:conformance-"
    )
    assert shared_services.prefix_of("ackwise.dash-1a2b3c4d.dead") == "ackwise.dash-"
    assert shared_services.prefix_of("{ackwise}:workers") == "ackwise}:workers"


def test_the_rabbitmq_listing_sees_a_queue_come_and_go() -> None:
    """The listing of the shared RabbitMQ (``rabbitmqctl``), looked at for one queue of this
    test's own only."""
    if shutil.which("rabbitmqctl") is None:
        pytest.skip("no rabbitmqctl on PATH")
    pika = pytest.importorskip("pika")
    try:
        shared_services.list_rabbitmq("rabbitmqctl")
    except (RuntimeError, OSError, subprocess.SubprocessError) as exc:
        pytest.skip(f"rabbitmqctl cannot list the node here: {exc}")
    name = f"shared-check-{uuid.uuid4().hex[:12]}"
    connection = pika.BlockingConnection(pika.URLParameters("amqp://guest:guest@127.0.0.1:5672/"))
    try:
        channel = connection.channel()
        channel.queue_declare(name, auto_delete=False)
        try:
            assert name in shared_services.list_rabbitmq("rabbitmqctl")["rabbitmq", "queue"]
        finally:
            channel.queue_delete(name)
        assert name not in shared_services.list_rabbitmq("rabbitmqctl")["rabbitmq", "queue"]
    finally:
        connection.close()


def test_the_nats_listing_pages_through_every_stream(private_nats: BrokerHandle) -> None:
    """More streams than one page of ``STREAM.NAMES`` (1024) are all listed."""
    import nats

    url = private_nats.url.split("?")[0]
    names = [f"page-{i:04d}-{uuid.uuid4().hex[:8]}" for i in range(1030)]

    async def create(action: str) -> None:
        client = await nats.connect(url)
        try:
            for name in names:
                config = {"name": name, "subjects": [f"page.{name}"], "storage": "memory"}
                body = json.dumps(config).encode()
                await client.request(f"$JS.API.STREAM.{action}.{name}", body, 10)
        finally:
            await client.close()

    asyncio.run(create("CREATE"))
    try:
        assert set(names) <= shared_services.list_nats(url)["nats", "stream"]
    finally:
        asyncio.run(create("DELETE"))
