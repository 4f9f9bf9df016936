"""ackwise: a Python task queue with explicit, provable delivery guarantees."""

# The names below are imported when first used (PEP 562): ``import ackwise`` stays cheap (not
# even ``typing``), so the ``ackwise`` command takes SIGTERM and SIGINT before anything heavy
# is imported (ackwise.cli._startup); a type checker sees them imported here.  The names
# imported ``as`` themselves are deprecated here (``_MOVED_TO_SPI``): ackwise.spi has them.
from __future__ import annotations

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

    from ackwise._version import __version__
    from ackwise.app._app import App
    from ackwise.app._canvas import Chain, Chord, Group, GroupHandle, chain, chord, group
    from ackwise.app._handle import TaskHandle
    from ackwise.app._schedule import Cron, Interval, Periodic, Schedule
    from ackwise.app._task import TRANSIENT_ERRORS, Retry, RetryPolicy, Signature, Task, TaskContext
    from ackwise.beat._loop import Beat, BeatConfig
    from ackwise.contract._envelope import ENVELOPE_VERSION, Attempt, Envelope
    from ackwise.contract._envelope import decode as decode_envelope
    from ackwise.contract._semantics import (
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
    from ackwise.contract._spi import (
        MAX_PRIORITY,
        Adapter,
        AttemptCount,
        BrokerURL,
        Capabilities,
        DeadLetter,
        LeaseExtension,
        QueueStats,
        redact_url,
    )
    from ackwise.contract._spi import Delivery as Delivery
    from ackwise.contract._spi import Execute as Execute
    from ackwise.contract._spi import Outgoing as Outgoing
    from ackwise.contract._spi import QueueSpec as QueueSpec
    from ackwise.contract._spi import fork_generation as fork_generation
    from ackwise.plugins._hookspecs import hookimpl
    from ackwise.plugins._manager import (
        Plugins,
        get_plugins,
        open_adapter,
        open_lock,
        open_rate_limiter,
        open_result_store,
        open_worker_registry,
    )
    from ackwise.plugins._manager import open_store as open_idempotency_store
    from ackwise.plugins._registries import AdapterRegistry as AdapterRegistry
    from ackwise.plugins._registries import LockRegistry as LockRegistry
    from ackwise.stores._idempotency import ClaimResult, IdempotencyStore, KeyState
    from ackwise.stores._locks import Claim, LeaderLock, Leadership, LockInfo
    from ackwise.stores._presence import WorkerInfo, WorkerRegistry
    from ackwise.stores._ratelimit import RateLimiter
    from ackwise.stores._results import ResultState, ResultStore, TaskResult
    from ackwise.worker._loop import Worker, WorkerConfig


__all__ = [
    "ENVELOPE_VERSION",
    "MAX_PRIORITY",
    "TRANSIENT_ERRORS",
    "Ack",
    "AckMessage",
    "Adapter",
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
    "Envelope",
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
    "LostMessage",
    "NackMessage",
    "Outcome",
    "Periodic",
    "Plugins",
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
    "App": ("ackwise.app._app", "App"),
    "Beat": ("ackwise.beat._loop", "Beat"),
    "BeatConfig": ("ackwise.beat._loop", "BeatConfig"),
    "Chain": ("ackwise.app._canvas", "Chain"),
    "Chord": ("ackwise.app._canvas", "Chord"),
    "Group": ("ackwise.app._canvas", "Group"),
    "GroupHandle": ("ackwise.app._canvas", "GroupHandle"),
    "chain": ("ackwise.app._canvas", "chain"),
    "chord": ("ackwise.app._canvas", "chord"),
    "group": ("ackwise.app._canvas", "group"),
    "ENVELOPE_VERSION": ("ackwise.contract._envelope", "ENVELOPE_VERSION"),
    "Attempt": ("ackwise.contract._envelope", "Attempt"),
    "Envelope": ("ackwise.contract._envelope", "Envelope"),
    "decode_envelope": ("ackwise.contract._envelope", "decode"),
    "TaskHandle": ("ackwise.app._handle", "TaskHandle"),
    "hookimpl": ("ackwise.plugins._hookspecs", "hookimpl"),
    "ClaimResult": ("ackwise.stores._idempotency", "ClaimResult"),
    "IdempotencyStore": ("ackwise.stores._idempotency", "IdempotencyStore"),
    "KeyState": ("ackwise.stores._idempotency", "KeyState"),
    "Claim": ("ackwise.stores._locks", "Claim"),
    "LeaderLock": ("ackwise.stores._locks", "LeaderLock"),
    "Leadership": ("ackwise.stores._locks", "Leadership"),
    "LockInfo": ("ackwise.stores._locks", "LockInfo"),
    "Plugins": ("ackwise.plugins._manager", "Plugins"),
    "get_plugins": ("ackwise.plugins._manager", "get_plugins"),
    "open_adapter": ("ackwise.plugins._manager", "open_adapter"),
    "open_lock": ("ackwise.plugins._manager", "open_lock"),
    "open_rate_limiter": ("ackwise.plugins._manager", "open_rate_limiter"),
    "open_result_store": ("ackwise.plugins._manager", "open_result_store"),
    "open_worker_registry": ("ackwise.plugins._manager", "open_worker_registry"),
    "open_idempotency_store": ("ackwise.plugins._manager", "open_store"),
    "WorkerInfo": ("ackwise.stores._presence", "WorkerInfo"),
    "WorkerRegistry": ("ackwise.stores._presence", "WorkerRegistry"),
    "RateLimiter": ("ackwise.stores._ratelimit", "RateLimiter"),
    "AdapterRegistry": ("ackwise.plugins._registries", "AdapterRegistry"),
    "LockRegistry": ("ackwise.plugins._registries", "LockRegistry"),
    "ResultState": ("ackwise.stores._results", "ResultState"),
    "ResultStore": ("ackwise.stores._results", "ResultStore"),
    "TaskResult": ("ackwise.stores._results", "TaskResult"),
    "Cron": ("ackwise.app._schedule", "Cron"),
    "Interval": ("ackwise.app._schedule", "Interval"),
    "Periodic": ("ackwise.app._schedule", "Periodic"),
    "Schedule": ("ackwise.app._schedule", "Schedule"),
    "Ack": ("ackwise.contract._semantics", "Ack"),
    "AckMessage": ("ackwise.contract._semantics", "AckMessage"),
    "DeadLetterMessage": ("ackwise.contract._semantics", "DeadLetterMessage"),
    "Hold": ("ackwise.contract._semantics", "Hold"),
    "LostMessage": ("ackwise.contract._semantics", "LostMessage"),
    "NackMessage": ("ackwise.contract._semantics", "NackMessage"),
    "Outcome": ("ackwise.contract._semantics", "Outcome"),
    "RetryMessage": ("ackwise.contract._semantics", "RetryMessage"),
    "Settlement": ("ackwise.contract._semantics", "Settlement"),
    "settle": ("ackwise.contract._semantics", "settle"),
    "MAX_PRIORITY": ("ackwise.contract._spi", "MAX_PRIORITY"),
    "Adapter": ("ackwise.contract._spi", "Adapter"),
    "AttemptCount": ("ackwise.contract._spi", "AttemptCount"),
    "BrokerURL": ("ackwise.contract._spi", "BrokerURL"),
    "Capabilities": ("ackwise.contract._spi", "Capabilities"),
    "DeadLetter": ("ackwise.contract._spi", "DeadLetter"),
    "Delivery": ("ackwise.contract._spi", "Delivery"),
    "Execute": ("ackwise.contract._spi", "Execute"),
    "LeaseExtension": ("ackwise.contract._spi", "LeaseExtension"),
    "Outgoing": ("ackwise.contract._spi", "Outgoing"),
    "QueueSpec": ("ackwise.contract._spi", "QueueSpec"),
    "QueueStats": ("ackwise.contract._spi", "QueueStats"),
    "fork_generation": ("ackwise.contract._spi", "fork_generation"),
    "redact_url": ("ackwise.contract._spi", "redact_url"),
    "TRANSIENT_ERRORS": ("ackwise.app._task", "TRANSIENT_ERRORS"),
    "Retry": ("ackwise.app._task", "Retry"),
    "RetryPolicy": ("ackwise.app._task", "RetryPolicy"),
    "Signature": ("ackwise.app._task", "Signature"),
    "Task": ("ackwise.app._task", "Task"),
    "TaskContext": ("ackwise.app._task", "TaskContext"),
    "Worker": ("ackwise.worker._loop", "Worker"),
    "WorkerConfig": ("ackwise.worker._loop", "WorkerConfig"),
}


#: Names of the adapter SPI that ``ackwise`` used to export: :mod:`ackwise.spi` has them now.
#: They still work for the deprecation period, with a ``DeprecationWarning`` naming the new
#: import; ``__all__`` no longer lists them (docs/adapter-authors.md has the table).
_MOVED_TO_SPI = frozenset(
    {"AdapterRegistry", "Delivery", "Execute", "LockRegistry", "Outgoing", "QueueSpec"}
    | {"fork_generation"}
)


def __getattr__(name: str) -> Any:
    """Import a public name the first time it is asked for."""
    try:
        module, attribute = _LAZY[name]
    except KeyError:
        raise AttributeError(f"module 'ackwise' has no attribute {name!r}") from None
    from importlib import import_module

    value = getattr(import_module(module), attribute)
    if name not in _MOVED_TO_SPI:
        globals()[name] = value  # the next access does not come here
    else:
        import sys

        # `from ackwise import X` asks twice: importlib's hasattr first, then the importing
        # line; the warning goes to that line, once.
        if sys._getframe(1).f_globals.get("__name__") != "importlib._bootstrap":
            import warnings

            warnings.warn(
                f"ackwise.{name} is deprecated: import it from ackwise.spi (the old name stays "
                "for at least two more minor releases and six months)",
                DeprecationWarning,
                stacklevel=2,
            )
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
