"""redis-py's exceptions mapped into :mod:`ackwise.errors`, in one place.

Every exception class of :mod:`redis.exceptions` has an explicit entry in :data:`ERROR_MAP`
(a test fails when redis-py grows one that is not listed)::

    redis-py                                   ackwise
    ConnectionError, BusyLoadingError      →   BrokerUnavailable          (transient)
    TimeoutError, MaxConnectionsError,     →   TransientAdapterError
      OutOfMemoryError, ReadOnlyError, TryAgainError, ClusterDownError, MasterDownError,
      InvalidResponse, WatchError, ClusterError,
      ResponseError "BUSY…" / "MISCONF…" / "NOREPLICAS…"
    AuthenticationError, AuthorizationError, → AuthenticationFailed       (permanent)
      AuthenticationWrongNumberOfArgsError, ExternalAuthProviderError
    everything else (ResponseError, NoPermissionError, DataError, …) → PermanentAdapterError

The worker reconnects with backoff on a transient error (it calls ``close()`` then
``open()``); a permanent one stops it with the reason.  Credentials never appear in the
messages: they name the broker by host, port and database only.
"""

from __future__ import annotations

from contextlib import AbstractContextManager

import redis.exceptions as rx

from ackwise.errors import (
    AdapterError,
    AuthenticationFailed,
    BrokerUnavailable,
    PermanentAdapterError,
    TransientAdapterError,
)
from ackwise.spi import ErrorTable, from_table, mapping_errors, redact

__all__ = ["ERROR_MAP", "map_redis_errors", "translate_redis_error"]

_T, _U, _A, _P = (
    TransientAdapterError,
    BrokerUnavailable,
    AuthenticationFailed,
    PermanentAdapterError,
)

_CLUSTER_REDIRECT = (
    "Redis Cluster redirect: this endpoint is a cluster node; ackwise-redis connects to one "
    "Redis (standalone, or the master behind a proxy)"
)

#: redis-py exception class -> (ackwise class, what it means here).
ERROR_MAP: ErrorTable = {
    rx.RedisError: (_P, "Redis error"),
    rx.ConnectionError: (_U, "cannot reach Redis"),
    rx.BusyLoadingError: (_U, "Redis is loading its data set after a restart"),
    rx.MaxConnectionsError: (_T, "no Redis connection available"),
    rx.TimeoutError: (_T, "Redis did not answer in time"),
    rx.AuthenticationError: (_A, "Redis refused the credentials"),
    rx.AuthorizationError: (_A, "Redis refused the credentials"),
    rx.AuthenticationWrongNumberOfArgsError: (
        _A,
        "Redis refused AUTH (a username needs Redis 6 ACLs; or the server has no password)",
    ),
    rx.ExternalAuthProviderError: (_A, "the credential provider failed"),
    rx.InvalidResponse: (_T, "Redis sent an unreadable reply; reconnecting"),
    rx.ResponseError: (_P, "Redis refused the command"),
    rx.DataError: (_P, "invalid data for a Redis command"),
    rx.PubSubError: (_P, "Redis pub/sub error"),
    rx.WatchError: (_T, "a watched key changed"),
    rx.NoScriptError: (_P, "Redis lost a script that was just loaded"),
    rx.OutOfMemoryError: (
        _T,
        "Redis is out of memory (maxmemory reached; with noeviction it refuses writes until "
        "consumers drain it)",
    ),
    rx.ExecAbortError: (_P, "Redis aborted a transaction"),
    rx.ReadOnlyError: (_T, "connected to a read-only replica (failover in progress?)"),
    rx.NoPermissionError: (_P, "the Redis user lacks a permission (ACL)"),
    rx.ModuleError: (_P, "Redis module error"),
    rx.NoSuchFieldsetError: (_P, "Redis fieldset error"),
    rx.LockError: (_P, "Redis lock error"),
    rx.LockNotOwnedError: (_P, "Redis lock not owned"),
    rx.ChildDeadlockedError: (_P, "a Redis connection was used across fork()"),
    rx.ClusterError: (_T, "Redis Cluster error"),
    rx.ClusterDownError: (_T, "Redis Cluster is down"),
    rx.MasterDownError: (_T, "the Redis master is down"),
    rx.TryAgainError: (_T, "Redis Cluster asks to try again"),
    rx.ClusterCrossSlotError: (_P, "keys of one script are in different cluster slots"),
    rx.AskError: (_P, _CLUSTER_REDIRECT),
    rx.MovedError: (_P, _CLUSTER_REDIRECT),
    rx.RedisClusterException: (_P, "Redis Cluster client error"),
    rx.SlotNotCoveredError: (_T, "no cluster node serves the queue's slot"),
    rx.CrossSlotTransactionError: (_P, "keys of one transaction are in different cluster slots"),
    rx.InvalidPipelineStack: (_P, "invalid Redis Cluster pipeline"),
    rx.IncorrectPolicyType: (_P, "invalid Redis Cluster request policy"),
}

#: Reply prefixes of plain ResponseErrors that a later retry may get past.
_TRANSIENT_REPLIES = {
    "BUSY": "Redis is busy running a script (or a module command)",
    "MISCONF": "Redis refuses writes because it cannot persist to disk",
    "NOREPLICAS": "Redis has too few replicas to accept writes",
    "LOADING": "Redis is loading its data set after a restart",
}

_CAUGHT: tuple[type[BaseException], ...] = tuple(ERROR_MAP)


def translate_redis_error(
    exc: BaseException, where: str = "Redis", secret: str | None = None
) -> AdapterError:
    """Return the :mod:`ackwise.errors` exception for a redis-py (or socket) error; not raised.

    :param where: the broker, for the message (never with credentials).
    :param secret: a password to blank out should the driver ever echo it.
    """
    detail = redact(str(exc) or type(exc).__name__, secret)
    if isinstance(exc, OSError) and not isinstance(exc, rx.RedisError):
        return BrokerUnavailable(f"{where}: cannot reach Redis: {detail}")
    error = from_table(exc, ERROR_MAP, where, detail)
    if type(error) is PermanentAdapterError and isinstance(exc, rx.ResponseError):
        code = detail.split(" ", 1)[0].upper()
        if code in _TRANSIENT_REPLIES:
            return TransientAdapterError(f"{where}: {_TRANSIENT_REPLIES[code]}: {detail}")
    return error


def map_redis_errors(
    where: str = "Redis", secret: str | None = None
) -> AbstractContextManager[None]:
    """Re-raise every redis-py error (and socket error) as an :mod:`ackwise.errors` one.

    Always ``from`` the driver's exception, so the cause stays in the traceback.
    """
    return mapping_errors(translate_redis_error, _CAUGHT, where, secret)
