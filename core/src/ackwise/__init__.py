"""ackwise: a Python task queue with explicit, provable delivery guarantees."""

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
