"""Registers the ``dirq://`` adapter: names the class by import path, imports nothing else."""

from __future__ import annotations

from ackwise.spi import AdapterRegistry, hookimpl


@hookimpl
def ackwise_register_adapters(registry: AdapterRegistry) -> None:
    registry.add("dirq", "ackwise_dirq.adapter:DirQueueAdapter", distribution="ackwise-dirq")
