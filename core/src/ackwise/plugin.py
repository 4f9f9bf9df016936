"""The built-in adapters, registered through the same entry-point path as any plugin.

This module must stay light: it names adapter classes by import path and imports none.
"""

from __future__ import annotations

from ackwise._hookspecs import hookimpl
from ackwise._registries import AdapterRegistry, LockRegistry


@hookimpl
def ackwise_register_adapters(registry: AdapterRegistry) -> None:
    registry.add("memory", "ackwise._memory:MemoryAdapter", distribution="ackwise")
    registry.add("sqlite", "ackwise._sqlite:SQLiteAdapter", distribution="ackwise")
    registry.add_idempotency_store("memory", "ackwise._idempotency:MemoryIdempotencyStore")
    registry.add_idempotency_store("sqlite", "ackwise._idempotency:SQLiteIdempotencyStore")
    registry.add_idempotency_store("postgresql", "ackwise._idempotency:PostgresIdempotencyStore")
    registry.add_idempotency_store("postgres", "ackwise._idempotency:PostgresIdempotencyStore")
    registry.add_result_store("memory", "ackwise._results:MemoryResultStore")
    registry.add_result_store("sqlite", "ackwise._results:SQLiteResultStore")
    registry.add_result_store("postgresql", "ackwise._results:PostgresResultStore")
    registry.add_result_store("postgres", "ackwise._results:PostgresResultStore")
    registry.add_rate_limiter("memory", "ackwise._ratelimit:MemoryRateLimiter")
    registry.add_rate_limiter("sqlite", "ackwise._ratelimit:SQLiteRateLimiter")
    registry.add_worker_registry("memory", "ackwise._presence:MemoryWorkerRegistry")
    registry.add_worker_registry("sqlite", "ackwise._presence:SQLiteWorkerRegistry")
    registry.add_worker_registry("postgresql", "ackwise._presence:PostgresWorkerRegistry")
    registry.add_worker_registry("postgres", "ackwise._presence:PostgresWorkerRegistry")


@hookimpl
def ackwise_register_lock_backends(registry: LockRegistry) -> None:
    registry.add("memory", "ackwise._locks:MemoryLeaderLock", distribution="ackwise")
    registry.add("sqlite", "ackwise._locks:SQLiteLeaderLock", distribution="ackwise")
    registry.add("postgresql", "ackwise._pglock:PostgresLeaderLock", distribution="ackwise")
    registry.add("postgres", "ackwise._pglock:PostgresLeaderLock", distribution="ackwise")
