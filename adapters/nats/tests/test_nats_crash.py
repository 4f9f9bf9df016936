"""Level 2 of the conformance suite (crash scenarios C01-C28) against a private nats-server.

Real ``ackwise worker`` processes, real signals, a TCP fault proxy (C18) and a restart of the
suite-owned nats-server with its JetStream store (C19).
"""

from __future__ import annotations

import pytest

from ackwise_conformance.brokers import BrokerHandle
from ackwise_conformance.crash import CrashConformance

pytestmark = pytest.mark.slow


class TestNatsCrashConformance(CrashConformance):
    @pytest.fixture
    def broker(self, nats_broker: BrokerHandle) -> BrokerHandle:
        return nats_broker
