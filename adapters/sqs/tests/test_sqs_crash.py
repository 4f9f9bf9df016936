"""Level 2 of the conformance suite (crash scenarios C01-C28) against moto's server.

Real ``ackwise worker`` processes, real signals, and a TCP fault proxy in front of moto (C18),
every applicable scenario in all three modes, C21's 5,000 messages included.  C19 is n/a: moto
keeps its queues in memory, so the suite cannot restart it.  Leases are whole seconds on SQS:
the scenarios run at time scale 3 (leases of 3 s, renewed every second).  At scale 2 (leases
of 2 s) CI once saw C26 dead-letter all three chord members: its workers' loops, sharing two
CPUs with seven other cases, their workers and the one moto process they all call, were
blocked past their leases (renewals 1.3-1.6 s late) until each member had been received four
times; locally it passed under two busy CPU hogs.  moto runs as this
package's provisioner starts it (``ackwise_sqs._moto_server``): atomic receives, and
bookkeeping whose cost does not grow with the queue's depth (stock moto took ~0.5 s for a
receive of 10 at 1,000 messages).
"""

from __future__ import annotations

import pytest

from ackwise_conformance.brokers import BrokerHandle
from ackwise_conformance.crash import CrashConformance

pytestmark = pytest.mark.slow


class TestSQSCrashConformance(CrashConformance):
    @pytest.fixture
    def broker(self, sqs_broker: BrokerHandle) -> BrokerHandle:
        return sqs_broker

    @pytest.fixture
    def time_scale(self) -> float:
        return 3.0
