"""Level 1 against the broker named by ACKWISE_CONFORMANCE_URL (used by `ackwise conformance`)."""

from __future__ import annotations

import os
from collections.abc import Callable

import pytest

from ackwise import Adapter, open_adapter
from ackwise_conformance import AdapterConformance


class TestSPI(AdapterConformance):
    @pytest.fixture
    def adapter_factory(self) -> Callable[[], Adapter]:
        url = os.environ["ACKWISE_CONFORMANCE_URL"]
        return lambda: open_adapter(url)

    @pytest.fixture
    def time_scale(self) -> float:
        return float(os.environ.get("ACKWISE_CONFORMANCE_TIME_SCALE", "1.0"))

    @pytest.fixture
    def queue_prefix(self) -> str:
        return os.environ.get("ACKWISE_CONFORMANCE_PREFIX", "conformance-")
