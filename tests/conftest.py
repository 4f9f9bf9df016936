"""Fixtures shared by the cross-package tests."""

from __future__ import annotations

import os
import socket
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

import ackwise
from ackwise_conformance.brokers import missing_broker


@pytest.fixture
def plugins_serving() -> Callable[[str, str], ackwise.Plugins]:
    """``make(scheme, "module:Class")``: plugins (no autoload) under which ``scheme://`` URLs
    open that adapter class, for tests of the worker against an adapter of their own."""

    def make(scheme: str, import_path: str) -> ackwise.Plugins:
        class Plugin:
            @ackwise.hookimpl
            def ackwise_register_adapters(self, registry: Any) -> None:
                registry.add(scheme, import_path, distribution="tests")

        plugins = ackwise.Plugins(autoload=False)
        plugins.register(Plugin(), name=f"{scheme}-plugin")
        return plugins

    return make


#: The shared PostgreSQL server's test database (trust auth on loopback).
PG_URL = "postgresql://postgres@127.0.0.1:5432/test"


def _pg_schema(prefix: str) -> Iterator[tuple[str, str]]:
    """A new, empty schema on the shared PostgreSQL: ``(url seeing it first, schema)``."""
    psycopg = pytest.importorskip("psycopg")
    schema = f"{prefix}_{uuid.uuid4().hex[:12]}"
    try:
        with psycopg.connect(PG_URL, autocommit=True, connect_timeout=3) as conn:
            conn.execute(f"CREATE SCHEMA {schema}")
    except psycopg.OperationalError as exc:
        missing_broker(f"no PostgreSQL at {PG_URL}: {exc}")  # skips; fails under CI=true
    yield f"{PG_URL}?options=-csearch_path%3D{schema}", schema
    with psycopg.connect(PG_URL, autocommit=True) as conn:
        conn.execute(f"DROP SCHEMA {schema} CASCADE")


@pytest.fixture
def pg_schema_url() -> Iterator[str]:
    """``PG_URL`` seen through a new, empty schema of this test's own (dropped after it)."""
    for url, _ in _pg_schema("t"):
        yield url


@pytest.fixture(scope="module")
def pg_module_schema() -> Iterator[tuple[str, str]]:
    """A schema of this test module's own: ``(url seeing it first, schema name)``."""
    yield from _pg_schema("m")


@pytest.fixture(scope="module")
def private_redis(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    """A redis-server of this test module's own, on a free port (no persistence)."""
    from ackwise_conformance.brokers import (
        provide_or_skip,
    )

    handle = provide_or_skip("redis", tmp_dir=tmp_path_factory.mktemp("redis"), durable=False)
    yield handle
    handle.stop()


#: Every broker ackwise ships an adapter for, as :func:`each_broker` provides them.
BROKERS = ("memory", "sqlite", "redis", "rabbitmq", "sqs", "postgresql", "nats")


@dataclass(frozen=True)
class BrokerPlace:
    """A broker of :func:`each_broker`: its name, a URL seeing a namespace of this test's own,
    and a queue name of this test's own (deleted after it, with everything under the URL's
    prefix)."""

    name: str
    url: str
    queue: str


def _answers(port: int) -> bool:
    try:
        socket.create_connection(("127.0.0.1", port), timeout=1).close()
    except OSError:
        return False
    return True


@pytest.fixture(scope="session")
def moto_sqs(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    """One moto SQS server of this session, over real HTTP (started by the conformance suite,
    as ``ackwise_sqs._provision`` says), with dummy credentials in the environment."""
    from ackwise_conformance.brokers import provide_or_skip

    for name, value in (
        ("AWS_ACCESS_KEY_ID", "testing"),
        ("AWS_SECRET_ACCESS_KEY", "testing"),
        ("AWS_DEFAULT_REGION", "us-east-1"),
    ):
        os.environ.setdefault(name, value)
    handle = provide_or_skip("sqs", tmp_dir=tmp_path_factory.mktemp("sqs"))
    yield handle
    handle.stop()


@pytest.fixture(params=BROKERS)
def each_broker(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[BrokerPlace]:
    """Each broker in turn: the shared services on loopback (RabbitMQ without its management
    plugin), a moto SQS server, SQLite and memory; a test's own prefix, schema or file, and
    its own queue, deleted after it."""
    from ackwise_conformance.brokers import missing_broker

    name: str = request.param
    tag = f"m{uuid.uuid4().hex[:10]}"
    queue = f"{tag}-q"
    if name == "memory":
        yield BrokerPlace(name, f"memory://{tag}", queue)
        return
    if name == "sqlite":
        yield BrokerPlace(name, f"sqlite:///{tmp_path / 'broker.db'}", queue)
        return
    if name == "postgresql":
        for url, _ in _pg_schema(tag):
            yield BrokerPlace(name, url, queue)
        return
    if name == "sqs":
        handle = request.getfixturevalue("moto_sqs")
        sep = "&" if "?" in handle.url else "?"
        url = f"{handle.url}{sep}prefix={tag}-"
    else:
        port = {"redis": 6379, "rabbitmq": 5672, "nats": 4222}[name]
        if not _answers(port):
            missing_broker(f"no {name} answering on 127.0.0.1:{port}")
        url = {
            "redis": f"redis://127.0.0.1:6379/0?prefix={tag}",
            "rabbitmq": f"amqp://guest:guest@127.0.0.1:5672/%2F?prefix={tag}",
            "nats": f"nats://127.0.0.1:4222?prefix={tag}",
        }[name]
    try:
        yield BrokerPlace(name, url, queue)
    finally:
        _delete_place(name, url, queue, tag)


def _delete_place(name: str, url: str, queue: str, tag: str) -> None:
    """Delete the queue and, on Redis, every key under the test's prefix (the worker
    registry's hash too)."""
    adapter = ackwise.open_adapter(url)
    adapter.open()
    try:
        adapter.delete_queue(queue)
    finally:
        adapter.close()
    if name == "redis":
        import redis

        client = redis.Redis(host="127.0.0.1", port=6379, db=0)
        try:
            keys = list(client.scan_iter(match=f"*{tag}*", count=1000))
            if keys:
                client.delete(*keys)
        finally:
            client.close()


#: The shared Redis, database 0: a test there uses a key prefix of its own (:func:`shared_redis`).
SHARED_REDIS = "redis://127.0.0.1:6379/0"


@pytest.fixture
def shared_redis() -> Iterator[Callable[[str], str]]:
    """``url(name)``: a URL of the shared Redis whose key prefix is ``name`` and a random part.

    After the test, what is left under each prefix is deleted through ackwise's own delete
    paths (``delete_queue`` of every queue, the worker registry's ``forget``), and then the
    prefix must hold no key: one left names a gap in those paths.
    """
    made: list[str] = []

    def url(name: str) -> str:
        try:
            socket.create_connection(("127.0.0.1", 6379), timeout=1).close()
        except OSError:
            missing_broker("Redis is not answering on 127.0.0.1:6379")
        made.append(f"{SHARED_REDIS}?prefix={name}{uuid.uuid4().hex[:8]}")
        return made[-1]

    yield url
    for made_url in made:
        _delete_under_prefix(made_url)


def _delete_under_prefix(url: str) -> None:
    import redis

    adapter = ackwise.open_adapter(url)
    adapter.open()
    try:
        for queue in adapter.queues():
            adapter.delete_queue(queue)
    finally:
        adapter.close()
    registry = ackwise.open_worker_registry(url)
    try:
        registry.forget([w.id for w in registry.workers()])
    finally:
        registry.close()
    prefix = ackwise.BrokerURL.parse(url).query["prefix"]
    with redis.Redis.from_url(SHARED_REDIS) as client:
        left = sorted(
            k.decode()
            for pattern in (f"{{{prefix}}}*", f"{{{prefix}:*")
            for k in client.scan_iter(match=pattern, count=1000)
        )
    assert not left, f"left in the shared Redis after delete_queue and forget: {left}"
