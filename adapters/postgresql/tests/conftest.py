"""Fixtures of the PostgreSQL adapter's tests: one private cluster per session.

The cluster is made and started by the conformance suite (as ``ackwise_postgresql._provision``
says: ``initdb``, then ``postgres`` on a free port, never the shared server on 5432), durable
(fsync on), so the restart scenario C19 and the fault proxy of C18 can use it.
``ACKWISE_TEST_POSTGRESQL_URL`` points the tests at another database instead (C19 is then
n/a).  Without PostgreSQL's binaries the tests skip, or fail under ``CI=true``.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator

import psycopg
import pytest

from ackwise_conformance.brokers import (
    BrokerHandle,
    provide_or_skip,
)


@pytest.fixture(scope="session")
def postgresql_broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[BrokerHandle]:
    handle = provide_or_skip(
        "postgresql", tmp_dir=tmp_path_factory.mktemp("postgresql"), durable=True
    )
    yield handle
    handle.stop()


@pytest.fixture
def postgresql_url(postgresql_broker: BrokerHandle) -> Iterator[str]:
    """The private cluster's URL, with a schema of this test's own (dropped after it)."""
    schema = f"t_{uuid.uuid4().hex[:12]}"
    with psycopg.connect(postgresql_broker.url, autocommit=True) as conn:
        conn.execute(f"CREATE SCHEMA {schema}")
    sep = "&" if "?" in postgresql_broker.url else "?"
    yield f"{postgresql_broker.url}{sep}options=-csearch_path%3D{schema}"
    with psycopg.connect(postgresql_broker.url, autocommit=True) as conn:
        conn.execute(f"DROP SCHEMA {schema} CASCADE")
