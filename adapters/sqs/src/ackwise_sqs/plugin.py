"""Registers the SQS adapter.  Stays light: names the class by import path, imports no driver."""

from __future__ import annotations

from ackwise.spi import AdapterRegistry, hookimpl

_ADAPTER = "ackwise_sqs._adapter:SQSAdapter"


@hookimpl
def ackwise_register_adapters(registry: AdapterRegistry) -> None:
    registry.add("sqs", _ADAPTER, distribution="ackwise-sqs")
