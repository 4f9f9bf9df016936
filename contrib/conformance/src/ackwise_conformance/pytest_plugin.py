"""pytest plugin of ackwise-conformance (entry point ``pytest11``).

Harmless in any test session: it imports nothing of ackwise and only offers the
:func:`~ackwise_conformance.helpers.eventually` helper as a fixture.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from ackwise_conformance.helpers import eventually as _eventually


@pytest.fixture
def eventually() -> Callable[..., Any]:
    """The deadline-polling helper: ``eventually(predicate, timeout, description=...)``."""
    return _eventually


def pytest_configure(config: pytest.Config) -> None:
    # CrashConformance marks its batch test with pytest-timeout's marker; without that plugin
    # the marker is inert, and registering it keeps --strict-markers runs quiet.
    config.addinivalue_line("markers", "timeout(seconds): pytest-timeout's per-test bound")
