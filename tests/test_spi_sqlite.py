"""The SPI conformance suite against the ``sqlite://`` adapter (a database file in tmp_path)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from ackwise import Adapter, open_adapter
from ackwise_conformance import AdapterConformance


class TestSQLiteAdapterConformance(AdapterConformance):
    @pytest.fixture
    def adapter_factory(self, tmp_path: Path) -> Callable[[], Adapter]:
        url = f"sqlite:///{tmp_path / 'broker.db'}"  # tmp_path is absolute: four slashes
        return lambda: open_adapter(url)
