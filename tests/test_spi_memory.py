"""The SPI conformance suite against the in-process ``memory://`` adapter."""

from __future__ import annotations

import dataclasses
import uuid
from collections.abc import Callable

import pytest

from ackwise import Adapter, BrokerURL, open_adapter
from ackwise.backends.memory._adapter import MemoryAdapter
from ackwise_conformance import AdapterConformance


class TestMemoryAdapterConformance(AdapterConformance):
    @pytest.fixture
    def adapter_factory(self) -> Callable[[], Adapter]:
        url = f"memory://conformance-{uuid.uuid4().hex}"
        return lambda: open_adapter(url)


# The capability gates of the suite, exercised against memory adapters that declare less than
# the memory broker can do (only the gate tests run for these).
class _NoDelayMemoryAdapter(MemoryAdapter):
    capabilities = dataclasses.replace(MemoryAdapter.capabilities, native_delay=False)


class _ShortDelayMemoryAdapter(MemoryAdapter):
    capabilities = dataclasses.replace(MemoryAdapter.capabilities, max_delay=5.0)


_GATES = ("test_delay_is_refused_without_native_delay", "test_delay_beyond_max_delay_is_refused")


def _gates_only(adapter_cls: type[Adapter]) -> type[AdapterConformance]:
    def adapter_factory(self: AdapterConformance) -> Callable[[], Adapter]:
        url = BrokerURL.parse(f"memory://gates-{uuid.uuid4().hex}")
        return lambda: adapter_cls(url)

    body: dict[str, object] = {"adapter_factory": pytest.fixture(adapter_factory)}
    body.update({n: None for n in dir(AdapterConformance) if n.startswith("test_")})
    body.update({n: getattr(AdapterConformance, n) for n in _GATES})
    return type(f"Test{adapter_cls.__name__.strip('_')}Gates", (AdapterConformance,), body)


TestNoDelayMemoryAdapterGates = _gates_only(_NoDelayMemoryAdapter)
TestShortDelayMemoryAdapterGates = _gates_only(_ShortDelayMemoryAdapter)
