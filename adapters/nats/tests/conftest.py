"""Fixtures of the NATS adapter's tests: one private nats-server (JetStream) per session.

The server is started by the conformance suite (as ``ackwise_nats._provision`` says) on a free
port, never the shared NATS on 4222, with its own store directory, so the restart scenario C19
and the fault proxy of C18 can use it.  ``ACKWISE_TEST_NATS_URL`` points the tests at another
server instead (C19 is then n/a).  Without nats-server the tests skip, or fail under ``CI=true``.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator

import pytest

from ackwise import open_adapter
from ackwise_conformance.brokers import (
    BrokerHandle,
    provide_or_skip,
)


@pytest.fixture(scope="session")
def nats_broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[BrokerHandle]:
    handle = provide_or_skip("nats", tmp_dir=tmp_path_factory.mktemp("nats"), durable=True)
    yield handle
    handle.stop()


@pytest.fixture
def nats_url(nats_broker: BrokerHandle) -> Iterator[str]:
    """The private broker's URL with a stream prefix of this test's own; every queue under the
    prefix is deleted after the test (``ACKWISE_TEST_NATS_URL`` may name a shared server)."""
    sep = "&" if "?" in nats_broker.url else "?"
    url = f"{nats_broker.url}{sep}prefix=t-{uuid.uuid4().hex[:12]}"
    yield url
    adapter = open_adapter(url)
    adapter.open()
    try:
        for queue in adapter.queues():  # this prefix's only
            adapter.delete_queue(queue)
    finally:
        adapter.close()
