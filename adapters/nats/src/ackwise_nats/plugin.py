"""Registers the NATS adapter: names the class by import path, imports no driver."""

from __future__ import annotations

from ackwise.spi import AdapterRegistry, hookimpl

_ADAPTER = "ackwise_nats._adapter:NatsAdapter"
# As ackwise_nats._url.SCHEMES (not imported: this module imports no driver).
_SCHEMES = ("nats", "nats+tls")


@hookimpl
def ackwise_register_adapters(registry: AdapterRegistry) -> None:
    for scheme in _SCHEMES:
        registry.add(scheme, _ADAPTER, distribution="ackwise-nats")
