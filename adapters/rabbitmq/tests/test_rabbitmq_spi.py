"""Level 1 of the conformance suite (the SPI) against the RabbitMQ adapter."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from ackwise import Adapter, open_adapter
from ackwise_conformance import AdapterConformance
from ackwise_conformance.spi import PriorityChecks


class TestRabbitMQAdapterConformance(AdapterConformance):
    @pytest.fixture
    def adapter_factory(self, rabbitmq_url: str) -> Callable[[], Adapter]:
        return lambda: open_adapter(rabbitmq_url)


class TestRabbitMQPriorityQueues(PriorityChecks):
    """The priority checks on classic queues declared with x-max-priority (the default quorum
    queues have none: the class above checks that they refuse a priority)."""

    @pytest.fixture
    def adapter_factory(self, rabbitmq_url: str) -> Callable[[], Adapter]:
        url = rabbitmq_url + ("&" if "?" in rabbitmq_url else "?")
        return lambda: open_adapter(url + "queue_type=classic&priorities=true")
