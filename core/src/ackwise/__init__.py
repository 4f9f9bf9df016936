"""ackwise: a Python task queue with explicit, provable delivery guarantees."""

# The names below are imported when first used (PEP 562): ``import ackwise`` stays cheap (not
# even ``typing``), so the ``ackwise`` command takes SIGTERM and SIGINT before anything heavy
# is imported (ackwise._startup); a type checker sees them imported here.
from __future__ import annotations

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

    from ackwise._app import App
    from ackwise._beat import Beat, BeatConfig
    from ackwise._canvas import Chain, Chord, Group, GroupHandle, chain, chord, group
    from ackwise._envelope import ENVELOPE_VERSION, Attempt, Envelope
    from ackwise._envelope import decode as decode_envelope
    from ackwise._handle import TaskHandle
    from ackwise._hookspecs import hookimpl
    from ackwise._idempotency import ClaimResult, IdempotencyStore, KeyState
    from ackwise._locks import Claim, LeaderLock, Leadership, LockInfo
    from ackwise._plugins import (
        Plugins,
        get_plugins,
        open_adapter,
        open_lock,
        open_rate_limiter,
        open_result_store,
        open_worker_registry,
    )
    from ackwise._plugins import open_store as open_idempotency_store
    from ackwise._presence import WorkerInfo, WorkerRegistry
    from ackwise._ratelimit import RateLimiter
    from ackwise._registries import AdapterRegistry, LockRegistry
    from ackwise._results import ResultState, ResultStore, TaskResult
    from ackwise._schedule import Cron, Interval, Periodic, Schedule
    from ackwise._semantics import (
        Ack,
        AckMessage,
        DeadLetterMessage,
        Hold,
        LostMessage,
        NackMessage,
        Outcome,
        RetryMessage,
        Settlement,
        settle,
    )
    from ackwise._spi import (
        MAX_PRIORITY,
        Adapter,
        AttemptCount,
        BrokerURL,
        Capabilities,
        DeadLetter,
        Delivery,
        Execute,
        LeaseExtension,
        Outgoing,
        QueueSpec,
        QueueStats,
        fork_generation,
        redact_url,
    )
    from ackwise._task import TRANSIENT_ERRORS, Retry, RetryPolicy, Signature, Task, TaskContext
    from ackwise._version import __version__
    from ackwise._worker import Worker, WorkerConfig


__all__ = [
    "ENVELOPE_VERSION",
    "MAX_PRIORITY",
    "TRANSIENT_ERRORS",
    "Ack",
    "AckMessage",
    "Adapter",
    "AdapterRegistry",
    "App",
    "Attempt",
    "AttemptCount",
    "Beat",
    "BeatConfig",
    "BrokerURL",
    "Capabilities",
    "Chain",
    "Chord",
    "Claim",
    "ClaimResult",
    "Cron",
    "DeadLetter",
    "DeadLetterMessage",
    "Delivery",
    "Envelope",
    "Execute",
    "Group",
    "GroupHandle",
    "Hold",
    "IdempotencyStore",
    "Interval",
    "KeyState",
    "LeaderLock",
    "Leadership",
    "LeaseExtension",
    "LockInfo",
    "LockRegistry",
    "LostMessage",
    "NackMessage",
    "Outcome",
    "Outgoing",
    "Periodic",
    "Plugins",
    "QueueSpec",
    "QueueStats",
    "RateLimiter",
    "ResultState",
    "ResultStore",
    "Retry",
    "RetryMessage",
    "RetryPolicy",
    "Schedule",
    "Settlement",
    "Signature",
    "Task",
    "TaskContext",
    "TaskHandle",
    "TaskResult",
    "Worker",
    "WorkerConfig",
    "WorkerInfo",
    "WorkerRegistry",
    "__version__",
    "chain",
    "chord",
    "decode_envelope",
    "fork_generation",
    "get_plugins",
    "group",
    "hookimpl",
    "open_adapter",
    "open_idempotency_store",
    "open_lock",
    "open_rate_limiter",
    "open_result_store",
    "open_worker_registry",
    "redact_url",
    "settle",
]

#: Where each public name lives: ``name: (module, attribute)``.
_LAZY: dict[str, tuple[str, str]] = {
    "__version__": ("ackwise._version", "__version__"),
    "App": ("ackwise._app", "App"),
    "Beat": ("ackwise._beat", "Beat"),
    "BeatConfig": ("ackwise._beat", "BeatConfig"),
    "Chain": ("ackwise._canvas", "Chain"),
    "Chord": ("ackwise._canvas", "Chord"),
    "Group": ("ackwise._canvas", "Group"),
    "GroupHandle": ("ackwise._canvas", "GroupHandle"),
    "chain": ("ackwise._canvas", "chain"),
    "chord": ("ackwise._canvas", "chord"),
    "group": ("ackwise._canvas", "group"),
    "ENVELOPE_VERSION": ("ackwise._envelope", "ENVELOPE_VERSION"),
    "Attempt": ("ackwise._envelope", "Attempt"),
    "Envelope": ("ackwise._envelope", "Envelope"),
    "decode_envelope": ("ackwise._envelope", "decode"),
    "TaskHandle": ("ackwise._handle", "TaskHandle"),
    "hookimpl": ("ackwise._hookspecs", "hookimpl"),
    "ClaimResult": ("ackwise._idempotency", "ClaimResult"),
    "IdempotencyStore": ("ackwise._idempotency", "IdempotencyStore"),
    "KeyState": ("ackwise._idempotency", "KeyState"),
    "Claim": ("ackwise._locks", "Claim"),
    "LeaderLock": ("ackwise._locks", "LeaderLock"),
    "Leadership": ("ackwise._locks", "Leadership"),
    "LockInfo": ("ackwise._locks", "LockInfo"),
    "Plugins": ("ackwise._plugins", "Plugins"),
    "get_plugins": ("ackwise._plugins", "get_plugins"),
    "open_adapter": ("ackwise._plugins", "open_adapter"),
    "open_lock": ("ackwise._plugins", "open_lock"),
    "open_rate_limiter": ("ackwise._plugins", "open_rate_limiter"),
    "open_result_store": ("ackwise._plugins", "open_result_store"),
    "open_worker_registry": ("ackwise._plugins", "open_worker_registry"),
    "open_idempotency_store": ("ackwise._plugins", "open_store"),
    "WorkerInfo": ("ackwise._presence", "WorkerInfo"),
    "WorkerRegistry": ("ackwise._presence", "WorkerRegistry"),
    "RateLimiter": ("ackwise._ratelimit", "RateLimiter"),
    "AdapterRegistry": ("ackwise._registries", "AdapterRegistry"),
    "LockRegistry": ("ackwise._registries", "LockRegistry"),
    "ResultState": ("ackwise._results", "ResultState"),
    "ResultStore": ("ackwise._results", "ResultStore"),
    "TaskResult": ("ackwise._results", "TaskResult"),
    "Cron": ("ackwise._schedule", "Cron"),
    "Interval": ("ackwise._schedule", "Interval"),
    "Periodic": ("ackwise._schedule", "Periodic"),
    "Schedule": ("ackwise._schedule", "Schedule"),
    "Ack": ("ackwise._semantics", "Ack"),
    "AckMessage": ("ackwise._semantics", "AckMessage"),
    "DeadLetterMessage": ("ackwise._semantics", "DeadLetterMessage"),
    "Hold": ("ackwise._semantics", "Hold"),
    "LostMessage": ("ackwise._semantics", "LostMessage"),
    "NackMessage": ("ackwise._semantics", "NackMessage"),
    "Outcome": ("ackwise._semantics", "Outcome"),
    "RetryMessage": ("ackwise._semantics", "RetryMessage"),
    "Settlement": ("ackwise._semantics", "Settlement"),
    "settle": ("ackwise._semantics", "settle"),
    "MAX_PRIORITY": ("ackwise._spi", "MAX_PRIORITY"),
    "Adapter": ("ackwise._spi", "Adapter"),
    "AttemptCount": ("ackwise._spi", "AttemptCount"),
    "BrokerURL": ("ackwise._spi", "BrokerURL"),
    "Capabilities": ("ackwise._spi", "Capabilities"),
    "DeadLetter": ("ackwise._spi", "DeadLetter"),
    "Delivery": ("ackwise._spi", "Delivery"),
    "Execute": ("ackwise._spi", "Execute"),
    "LeaseExtension": ("ackwise._spi", "LeaseExtension"),
    "Outgoing": ("ackwise._spi", "Outgoing"),
    "QueueSpec": ("ackwise._spi", "QueueSpec"),
    "QueueStats": ("ackwise._spi", "QueueStats"),
    "fork_generation": ("ackwise._spi", "fork_generation"),
    "redact_url": ("ackwise._spi", "redact_url"),
    "TRANSIENT_ERRORS": ("ackwise._task", "TRANSIENT_ERRORS"),
    "Retry": ("ackwise._task", "Retry"),
    "RetryPolicy": ("ackwise._task", "RetryPolicy"),
    "Signature": ("ackwise._task", "Signature"),
    "Task": ("ackwise._task", "Task"),
    "TaskContext": ("ackwise._task", "TaskContext"),
    "Worker": ("ackwise._worker", "Worker"),
    "WorkerConfig": ("ackwise._worker", "WorkerConfig"),
}


def __getattr__(name: str) -> Any:
    """Import a public name the first time it is asked for."""
    try:
        module, attribute = _LAZY[name]
    except KeyError:
        raise AttributeError(f"module 'ackwise' has no attribute {name!r}") from None
    from importlib import import_module

    value = getattr(import_module(module), attribute)
    globals()[name] = value  # the next access does not come here
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
