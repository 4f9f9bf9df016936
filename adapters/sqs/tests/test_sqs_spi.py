"""Level 1 of the conformance suite (the SPI) against the SQS adapter, on moto's server.

SQS counts visibility in whole seconds, so the suite's leases are scaled to whole seconds (2 s).
"""

from __future__ import annotations

from collections.abc import Callable

import pytest

from ackwise import Adapter, open_adapter
from ackwise_conformance import AdapterConformance


class TestSQSAdapterConformance(AdapterConformance):
    ordered = False
    unordered_reason = (
        "SQS standard queues deliver in no guaranteed order (best-effort ordering); "
        "FIFO (.fifo) queues keep order per message group"
    )

    @pytest.fixture
    def adapter_factory(self, sqs_url: str) -> Callable[[], Adapter]:
        return lambda: open_adapter(sqs_url)

    @pytest.fixture
    def time_scale(self) -> float:
        return 2.0
