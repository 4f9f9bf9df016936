"""Fixtures of the RabbitMQ adapter's tests: one private RabbitMQ node per session.

The node is started by the conformance suite (as ``ackwise_rabbitmq._provision`` says) on free
ports (never the shared RabbitMQ on 5672, which these tests neither purge nor restart), with
its management API on a free port too (the URL's ``management`` option), so that the restart
scenario C19 and the fault proxy of C18 can use it.  ``ACKWISE_TEST_RABBITMQ_URL`` points the
tests at another RabbitMQ instead (C19 is then n/a).  Without rabbitmq-server the tests skip,
or fail under ``CI=true``.  Every test uses queues of its own (unique names).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from ackwise_conformance.brokers import (
    BrokerHandle,
    provide_or_skip,
)
from ackwise_conformance.harness import WithOptions, with_options


@pytest.fixture(scope="session")
def rabbitmq_broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[BrokerHandle]:
    handle = provide_or_skip("rabbitmq", tmp_dir=tmp_path_factory.mktemp("rabbitmq"), durable=True)
    yield handle
    handle.stop()


@pytest.fixture
def rabbitmq_url(rabbitmq_broker: BrokerHandle) -> str:
    """The private node's URL: a short heartbeat (a lost consumer is noticed in seconds) and
    management totals no older than the call (the node's quorum tick is 200 ms)."""
    return with_options(rabbitmq_broker.url, heartbeat=2, management_lag=0.3)


@pytest.fixture
def rabbitmq_heartbeat_2s(rabbitmq_broker: BrokerHandle) -> Any:
    """The private node, its URLs asking for 2 s heartbeats and fresh management totals.

    The node's quorum queues refresh their totals every 200 ms (``quorum_tick_interval``).
    """
    return WithOptions(rabbitmq_broker, heartbeat=2, management_lag=0.3)
