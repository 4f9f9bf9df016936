"""Registers the Redis adapter.  Stays light: names the class by import path, imports no driver."""

from __future__ import annotations

from ackwise import AdapterRegistry, hookimpl

_ADAPTER = "ackwise_redis._adapter:RedisAdapter"


@hookimpl
def ackwise_register_adapters(registry: AdapterRegistry) -> None:
    for scheme in ("redis", "rediss", "unix"):
        registry.add(scheme, _ADAPTER, distribution="ackwise-redis")
