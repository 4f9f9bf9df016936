"""ackwise-redis: the Redis adapter for ackwise (``redis://``, ``rediss://``, ``unix://``).

Importing this package stays light (the entry point imports :mod:`ackwise_redis.plugin`
through it): the adapter and redis-py are imported on first use of these names.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from ackwise_redis._adapter import MAX_MESSAGE_SIZE, RedisAdapter
    from ackwise_redis._errors import ERROR_MAP, map_redis_errors, translate_redis_error
    from ackwise_redis._lock import RedisLeaderLock
    from ackwise_redis._url import RedisSettings, parse_redis_url

__all__ = [
    "ERROR_MAP",
    "MAX_MESSAGE_SIZE",
    "RedisAdapter",
    "RedisLeaderLock",
    "RedisSettings",
    "map_redis_errors",
    "parse_redis_url",
    "translate_redis_error",
]

#: Where each public name lives: imported from there on first use.
_WHERE = {
    name: module
    for module, names in {
        "_adapter": ("MAX_MESSAGE_SIZE", "RedisAdapter"),
        "_lock": ("RedisLeaderLock",),
        "_errors": ("ERROR_MAP", "map_redis_errors", "translate_redis_error"),
        "_url": ("RedisSettings", "parse_redis_url"),
    }.items()
    for name in names
}


def __getattr__(name: str) -> Any:
    module = _WHERE.get(name)
    if module is None:
        raise AttributeError(f"module 'ackwise_redis' has no attribute {name!r}")
    import importlib

    return getattr(importlib.import_module(f"ackwise_redis.{module}"), name)
