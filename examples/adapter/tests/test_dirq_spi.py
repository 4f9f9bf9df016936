"""Level 1 (the SPI checks) against the example ``dirq://`` adapter, in a tmp directory."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from ackwise import Adapter, open_adapter
from ackwise_conformance import AdapterConformance


class TestDirQueueConformance(AdapterConformance):
    @pytest.fixture
    def adapter_factory(self, tmp_path: Path) -> Callable[[], Adapter]:
        url = f"dirq://{tmp_path / 'queues'}"  # tmp_path is absolute: dirq:///tmp/...
        return lambda: open_adapter(url)
