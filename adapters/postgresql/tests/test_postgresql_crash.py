"""Level 2 of the conformance suite (crash scenarios C01-C28) against a private PostgreSQL
cluster.

Real ``ackwise worker`` processes, real signals, a TCP fault proxy (C18) and a restart of the
suite-owned, durable cluster (C19).
"""

from __future__ import annotations

import os

import pytest

from ackwise_conformance.brokers import BrokerHandle
from ackwise_conformance.crash import CrashConformance

# Not yet in the README test command: with it, the whole run took 20 min (budget 15) and the
# extra load made SQS C26 and a Redis rate-limit test fail; to be rebalanced (issue 17).
# ACKWISE_TEST_POSTGRESQL_CONFORMANCE=1 runs it (green alone: C01-C28, every mode).
pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(
        os.environ.get("ACKWISE_TEST_POSTGRESQL_CONFORMANCE") != "1",
        reason="level 2 on PostgreSQL runs with ACKWISE_TEST_POSTGRESQL_CONFORMANCE=1",
    ),
]


class TestPostgreSQLCrashConformance(CrashConformance):
    @pytest.fixture
    def broker(self, postgresql_broker: BrokerHandle) -> BrokerHandle:
        return postgresql_broker
