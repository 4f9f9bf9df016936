"""Registers the Redis adapter and leader lock: names the classes by import path, imports no driver."""

from __future__ import annotations

from ackwise import AdapterRegistry, LockRegistry, hookimpl

_ADAPTER = "ackwise_redis._adapter:RedisAdapter"
_LOCK = "ackwise_redis._lock:RedisLeaderLock"


@hookimpl
def ackwise_register_adapters(registry: AdapterRegistry) -> None:
    for scheme in ("redis", "rediss", "unix"):
        registry.add(scheme, _ADAPTER, distribution="ackwise-redis")


@hookimpl
def ackwise_register_lock_backends(registry: LockRegistry) -> None:
    for scheme in ("redis", "rediss", "unix"):
        registry.add(scheme, _LOCK, distribution="ackwise-redis")
