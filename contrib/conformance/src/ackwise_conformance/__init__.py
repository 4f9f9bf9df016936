"""ackwise-conformance: prove that an ackwise adapter keeps the delivery contract.

Level 1 (SPI conformance): subclass :class:`AdapterConformance` and override its
``adapter_factory`` fixture::

    import pytest
    from ackwise import open_adapter
    from ackwise_conformance import AdapterConformance

    class TestMyBroker(AdapterConformance):
        @pytest.fixture
        def adapter_factory(self):
            return lambda: open_adapter("mybroker://localhost/0")
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ackwise_conformance.helpers import eventually

if TYPE_CHECKING:
    from ackwise_conformance.locks import LeaderLockConformance
    from ackwise_conformance.spi import AdapterConformance

__all__ = ["AdapterConformance", "LeaderLockConformance", "eventually"]


def __getattr__(name: str) -> Any:
    # Lazy, so that the pytest plugin (loaded in every session) does not import ackwise.
    if name == "AdapterConformance":
        from ackwise_conformance.spi import AdapterConformance

        return AdapterConformance
    if name == "LeaderLockConformance":
        from ackwise_conformance.locks import LeaderLockConformance

        return LeaderLockConformance
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
