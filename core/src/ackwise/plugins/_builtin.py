"""The built-in adapters, registered through the same entry-point path as any plugin.

This module must stay light: it names adapter classes by import path and imports none.  Core's
backends are ``memory://`` and ``sqlite://`` (:mod:`ackwise.backends`); every other scheme,
PostgreSQL's included, is an adapter distribution's, registered by that distribution's plugin.
"""

from __future__ import annotations

from ackwise.plugins._hookspecs import hookimpl
from ackwise.plugins._registries import AdapterRegistry, LockRegistry


@hookimpl
def ackwise_register_adapters(registry: AdapterRegistry) -> None:
    registry.add("memory", "ackwise.backends.memory._adapter:MemoryAdapter", distribution="ackwise")
    registry.add("sqlite", "ackwise.backends.sqlite._adapter:SQLiteAdapter", distribution="ackwise")
    registry.add_idempotency_store(
        "memory", "ackwise.backends.memory._idempotency:MemoryIdempotencyStore"
    )
    registry.add_idempotency_store(
        "sqlite", "ackwise.backends.sqlite._idempotency:SQLiteIdempotencyStore"
    )
    registry.add_result_store("memory", "ackwise.backends.memory._results:MemoryResultStore")
    registry.add_result_store("sqlite", "ackwise.backends.sqlite._results:SQLiteResultStore")
    registry.add_rate_limiter("memory", "ackwise.backends.memory._ratelimit:MemoryRateLimiter")
    registry.add_rate_limiter("sqlite", "ackwise.backends.sqlite._ratelimit:SQLiteRateLimiter")
    registry.add_worker_registry("memory", "ackwise.backends.memory._presence:MemoryWorkerRegistry")
    registry.add_worker_registry("sqlite", "ackwise.backends.sqlite._presence:SQLiteWorkerRegistry")


@hookimpl
def ackwise_register_lock_backends(registry: LockRegistry) -> None:
    registry.add("memory", "ackwise.backends.memory._lock:MemoryLeaderLock", distribution="ackwise")
    registry.add("sqlite", "ackwise.backends.sqlite._lock:SQLiteLeaderLock", distribution="ackwise")
