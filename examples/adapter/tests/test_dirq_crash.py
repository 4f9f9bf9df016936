"""Level 2 (the crash scenarios, real worker processes) against the example ``dirq://`` adapter."""

from __future__ import annotations

from pathlib import Path

import pytest

from ackwise_conformance.crash import CrashConformance
from ackwise_conformance.harness import SimpleBroker

pytestmark = pytest.mark.slow


class TestDirQueueCrashConformance(CrashConformance):
    @pytest.fixture
    def broker(self, tmp_path: Path) -> SimpleBroker:
        # The workers find the adapter through its entry point (the workspace installs it).
        return SimpleBroker(f"dirq://{tmp_path / 'queues'}", name="dirq")
