"""Registers the ``dirq-old://`` adapter: names the class by import path, imports nothing else."""

from __future__ import annotations

from ackwise import AdapterRegistry, hookimpl


@hookimpl
def ackwise_register_adapters(registry: AdapterRegistry) -> None:
    registry.add(
        "dirq-old", "ackwise_dirq_old.adapter:DirQueueAdapter", distribution="ackwise-dirq-old"
    )
