"""Registers the Redis adapter, leader lock, idempotency and result stores, rate limiter and worker registry: names the classes by import path, imports no driver."""

from __future__ import annotations

from ackwise.spi import AdapterRegistry, LockRegistry, hookimpl

_ADAPTER = "ackwise_redis._adapter:RedisAdapter"
_LOCK = "ackwise_redis._lock:RedisLeaderLock"
_IDEMPOTENCY = "ackwise_redis._idempotency:RedisIdempotencyStore"
_RESULTS = "ackwise_redis._results:RedisResultStore"
_RATE = "ackwise_redis._ratelimit:RedisRateLimiter"
_WORKERS = "ackwise_redis._presence:RedisWorkerRegistry"
# As ackwise_redis._url.ALL_SCHEMES (not imported: this module imports no driver).
_SCHEMES = (
    "redis",
    "rediss",
    "unix",
    "redis+cluster",
    "rediss+cluster",
    "redis+sentinel",
    "rediss+sentinel",
)


@hookimpl
def ackwise_register_adapters(registry: AdapterRegistry) -> None:
    for scheme in _SCHEMES:
        registry.add(scheme, _ADAPTER, distribution="ackwise-redis")
        registry.add_idempotency_store(scheme, _IDEMPOTENCY)
        registry.add_result_store(scheme, _RESULTS)
        registry.add_rate_limiter(scheme, _RATE)
        registry.add_worker_registry(scheme, _WORKERS)


@hookimpl
def ackwise_register_lock_backends(registry: LockRegistry) -> None:
    for scheme in _SCHEMES:
        registry.add(scheme, _LOCK, distribution="ackwise-redis")
