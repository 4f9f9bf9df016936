"""Registers the PostgreSQL adapter, leader lock, idempotency and result stores and worker
registry: names the classes by import path, imports no driver.

An app on this broker keeps its results, keys, worker records and beat lock in the same
database by default; any app may point a store at a PostgreSQL database
(``App(result_store="postgresql://…")``) once this distribution is installed
(``ackwise[postgresql]``).
"""

from __future__ import annotations

from ackwise.spi import AdapterRegistry, LockRegistry, hookimpl

_ADAPTER = "ackwise_postgresql._adapter:PostgreSQLAdapter"
_LOCK = "ackwise_postgresql._lock:PostgresLeaderLock"
_IDEMPOTENCY = "ackwise_postgresql._idempotency:PostgresIdempotencyStore"
_RESULTS = "ackwise_postgresql._results:PostgresResultStore"
_WORKERS = "ackwise_postgresql._presence:PostgresWorkerRegistry"
_SCHEMES = ("postgresql", "postgres")


@hookimpl
def ackwise_register_adapters(registry: AdapterRegistry) -> None:
    for scheme in _SCHEMES:
        registry.add(scheme, _ADAPTER, distribution="ackwise-postgresql")
        registry.add_idempotency_store(scheme, _IDEMPOTENCY)
        registry.add_result_store(scheme, _RESULTS)
        registry.add_worker_registry(scheme, _WORKERS)


@hookimpl
def ackwise_register_lock_backends(registry: LockRegistry) -> None:
    for scheme in _SCHEMES:
        registry.add(scheme, _LOCK, distribution="ackwise-postgresql")
