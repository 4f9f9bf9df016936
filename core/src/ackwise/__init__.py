"""ackwise: a Python task queue with explicit, provable delivery guarantees."""

from ackwise._app import TRANSIENT_ERRORS, App, Retry, RetryPolicy, Signature, Task, TaskContext
from ackwise._envelope import ENVELOPE_VERSION, Attempt, Envelope
from ackwise._envelope import decode as decode_envelope
from ackwise._hookspecs import hookimpl
from ackwise._plugins import AdapterRegistry, Plugins, get_plugins, open_adapter
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
    Adapter,
    AttemptCount,
    BrokerURL,
    Capabilities,
    DeadLetter,
    Delivery,
    LeaseExtension,
    Outgoing,
    QueueSpec,
    QueueStats,
    redact_url,
)
from ackwise._worker import Worker, WorkerConfig

__version__ = "0.1.0"

__all__ = [
    "ENVELOPE_VERSION",
    "TRANSIENT_ERRORS",
    "Ack",
    "AckMessage",
    "Adapter",
    "AdapterRegistry",
    "App",
    "Attempt",
    "AttemptCount",
    "BrokerURL",
    "Capabilities",
    "DeadLetter",
    "DeadLetterMessage",
    "Delivery",
    "Envelope",
    "Hold",
    "LeaseExtension",
    "LostMessage",
    "NackMessage",
    "Outcome",
    "Outgoing",
    "Plugins",
    "QueueSpec",
    "QueueStats",
    "Retry",
    "RetryMessage",
    "RetryPolicy",
    "Settlement",
    "Signature",
    "Task",
    "TaskContext",
    "Worker",
    "WorkerConfig",
    "__version__",
    "decode_envelope",
    "get_plugins",
    "hookimpl",
    "open_adapter",
    "redact_url",
    "settle",
]
