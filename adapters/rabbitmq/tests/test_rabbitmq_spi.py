"""Level 1 of the conformance suite (the SPI) against the RabbitMQ adapter."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from ackwise import Adapter, open_adapter
from ackwise_conformance import AdapterConformance


class TestRabbitMQAdapterConformance(AdapterConformance):
    @pytest.fixture
    def adapter_factory(self, rabbitmq_url: str) -> Callable[[], Adapter]:
        return lambda: open_adapter(rabbitmq_url)
