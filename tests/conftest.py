"""Fixtures shared by the cross-package tests."""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterator
from typing import Any

import pytest

import ackwise


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
        pytest.skip(f"no PostgreSQL at {PG_URL}: {exc}")
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
