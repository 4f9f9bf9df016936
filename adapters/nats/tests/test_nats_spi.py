"""Level 1 of the conformance suite (the SPI) against the NATS JetStream adapter."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from ackwise import Adapter, open_adapter
from ackwise_conformance import AdapterConformance


class TestNatsAdapterConformance(AdapterConformance):
    @pytest.fixture
    def adapter_factory(self, nats_url: str) -> Callable[[], Adapter]:
        return lambda: open_adapter(nats_url)
