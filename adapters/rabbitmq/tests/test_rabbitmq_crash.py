"""Level 2 of the conformance suite (crash scenarios C01-C28) against a private RabbitMQ node.

Real ``ackwise worker`` processes, real signals, a TCP fault proxy (C18) and a restart of the
suite-owned, durable node (C19).  The URL asks for 2 s heartbeats: a frozen worker (C07, C08)
loses its connection, and so its deliveries, within seconds; that is RabbitMQ's lease.
"""

from __future__ import annotations

from typing import Any

import pytest

from ackwise_conformance.crash import CrashConformance

pytestmark = pytest.mark.slow


class TestRabbitMQCrashConformance(CrashConformance):
    @pytest.fixture
    def broker(self, rabbitmq_heartbeat_2s: Any) -> Any:
        return rabbitmq_heartbeat_2s
