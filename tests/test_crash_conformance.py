"""Level 2 of the conformance suite (the scenario catalogue C01-C28, B01-B04) on the built-in brokers."""

from __future__ import annotations

import uuid

import pytest

from ackwise_conformance.crash import CrashConformance
from ackwise_conformance.harness import SimpleBroker

pytestmark = pytest.mark.slow


class TestSQLiteCrashConformance(CrashConformance):
    @pytest.fixture
    def broker(self, tmp_path):
        return SimpleBroker(f"sqlite:///{tmp_path / 'broker.db'}", name="sqlite")


class TestMemoryCrashConformance(CrashConformance):
    @pytest.fixture
    def broker(self):
        return SimpleBroker(f"memory://{uuid.uuid4().hex}", name="memory")
