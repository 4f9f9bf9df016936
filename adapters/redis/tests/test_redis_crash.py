"""Level 2 of the conformance suite (crash scenarios C01-C28) against a private redis-server.

Real ``ackwise worker`` processes, real signals, a TCP fault proxy (C18) and a restart of the
suite-owned, durable redis-server (C19).
"""

from __future__ import annotations

import pytest

from ackwise_conformance.brokers import BrokerHandle
from ackwise_conformance.crash import CrashConformance

pytestmark = pytest.mark.slow


class TestRedisCrashConformance(CrashConformance):
    @pytest.fixture
    def broker(self, redis_broker: BrokerHandle) -> BrokerHandle:
        return redis_broker
