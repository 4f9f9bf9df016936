"""The built-in adapters, registered through the same entry-point path as any plugin.

This module must stay light: it names adapter classes by import path and imports none.
"""

from __future__ import annotations

from ackwise.plugins._hookspecs import hookimpl
from ackwise.plugins._registries import AdapterRegistry, LockRegistry


@hookimpl
def ackwise_register_adapters(registry: AdapterRegistry) -> None:
    registry.add("memory", "ackwise.backends.memory._adapter:MemoryAdapter", distribution="ackwise")
    registry.add("sqlite", "ackwise.backends.sqlite._adapter:SQLiteAdapter", distribution="ackwise")
    registry.add_idempotency_store("memory", "ackwise.stores._idempotency:MemoryIdempotencyStore")
    registry.add_idempotency_store("sqlite", "ackwise.stores._idempotency:SQLiteIdempotencyStore")
    registry.add_idempotency_store(
        "postgresql", "ackwise.stores._idempotency:PostgresIdempotencyStore"
    )
    registry.add_idempotency_store(
        "postgres", "ackwise.stores._idempotency:PostgresIdempotencyStore"
    )
    registry.add_result_store("memory", "ackwise.stores._results:MemoryResultStore")
    registry.add_result_store("sqlite", "ackwise.stores._results:SQLiteResultStore")
    registry.add_result_store("postgresql", "ackwise.stores._results:PostgresResultStore")
    registry.add_result_store("postgres", "ackwise.stores._results:PostgresResultStore")
    registry.add_rate_limiter("memory", "ackwise.stores._ratelimit:MemoryRateLimiter")
    registry.add_rate_limiter("sqlite", "ackwise.stores._ratelimit:SQLiteRateLimiter")
    registry.add_worker_registry("memory", "ackwise.stores._presence:MemoryWorkerRegistry")
    registry.add_worker_registry("sqlite", "ackwise.stores._presence:SQLiteWorkerRegistry")
    registry.add_worker_registry("postgresql", "ackwise.stores._presence:PostgresWorkerRegistry")
    registry.add_worker_registry("postgres", "ackwise.stores._presence:PostgresWorkerRegistry")


@hookimpl
def ackwise_register_lock_backends(registry: LockRegistry) -> None:
    registry.add("memory", "ackwise.stores._locks:MemoryLeaderLock", distribution="ackwise")
    registry.add("sqlite", "ackwise.stores._locks:SQLiteLeaderLock", distribution="ackwise")
    registry.add(
        "postgresql", "ackwise.backends.postgresql._lock:PostgresLeaderLock", distribution="ackwise"
    )
    registry.add(
        "postgres", "ackwise.backends.postgresql._lock:PostgresLeaderLock", distribution="ackwise"
    )
