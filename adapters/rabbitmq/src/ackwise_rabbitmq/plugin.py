"""Registers the RabbitMQ adapter.  Stays light: names the class by import path, imports no driver."""

from __future__ import annotations

from ackwise.spi import AdapterRegistry, hookimpl

_ADAPTER = "ackwise_rabbitmq._adapter:RabbitMQAdapter"


@hookimpl
def ackwise_register_adapters(registry: AdapterRegistry) -> None:
    for scheme in ("amqp", "amqps"):
        registry.add(scheme, _ADAPTER, distribution="ackwise-rabbitmq")
