"""Level 1 of the conformance suite (the SPI) against the PostgreSQL adapter."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from ackwise import Adapter, open_adapter
from ackwise_conformance import AdapterConformance


class TestPostgreSQLAdapterConformance(AdapterConformance):
    @pytest.fixture
    def adapter_factory(self, postgresql_url: str) -> Callable[[], Adapter]:
        return lambda: open_adapter(postgresql_url)
