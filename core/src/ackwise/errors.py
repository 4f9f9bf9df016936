"""The ackwise error hierarchy.

Every error ackwise raises on purpose is an :class:`AckwiseError`::

    AckwiseError
    ├── ConfigurationError            a setting is wrong; fix the configuration
    │   ├── InvalidBrokerURL          the URL cannot be parsed or has bad options
    │   └── UnknownBrokerScheme       no installed adapter serves the URL's scheme
    ├── PublishError                  nothing was published (raised before any I/O)
    │   ├── NotSerializable           an argument or header is not JSON-serializable
    │   ├── MessageTooLarge           the encoded envelope exceeds the adapter's limit
    │   └── InvalidSchedule           negative countdown, naive eta, both given
    ├── EnvelopeError                 a message body cannot be turned into an envelope
    │   ├── DecodeError               not JSON / not an envelope
    │   └── UnknownEnvelopeVersion    a newer producer wrote it
    ├── UnknownTask                   no task registered under that name
    ├── SoftTimeLimitExceeded         raised inside a task at its soft_time_limit
    └── AdapterError                  raised by adapters (mapped from driver errors)
        ├── TransientAdapterError     retrying later may succeed (connection lost, timeout)
        │   └── BrokerUnavailable     the broker cannot be reached
        ├── PermanentAdapterError     retrying will not help (auth, missing queue, bad request)
        │   ├── AuthenticationFailed
        │   └── QueueNotFound
        ├── StaleReceipt              the delivery's receipt no longer owns the message
        └── UnsupportedCapability     the adapter cannot do this natively

``Retry`` is not an error: raise it inside a task to ask for a retry.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

__all__ = [
    "AckwiseError",
    "AdapterError",
    "AuthenticationFailed",
    "BrokerUnavailable",
    "ConfigurationError",
    "DecodeError",
    "EnvelopeError",
    "InvalidBrokerURL",
    "InvalidSchedule",
    "MessageTooLarge",
    "NotSerializable",
    "PermanentAdapterError",
    "PublishError",
    "QueueNotFound",
    "SoftTimeLimitExceeded",
    "StaleReceipt",
    "TaskFailed",
    "TransientAdapterError",
    "UnknownBrokerScheme",
    "UnknownEnvelopeVersion",
    "UnknownTask",
    "UnsupportedCapability",
]


class AckwiseError(Exception):
    """Base class of every error ackwise raises on purpose."""


class ConfigurationError(AckwiseError):
    """A setting is wrong or two settings cannot hold together."""


class InvalidBrokerURL(ConfigurationError):
    """The broker URL cannot be parsed, or carries options the adapter does not know."""


class UnknownBrokerScheme(ConfigurationError):
    """No installed adapter serves the URL's scheme."""

    def __init__(self, scheme: str, installed: Sequence[str], hint: str | None = None) -> None:
        self.scheme = scheme
        self.installed = tuple(installed)
        message = (
            f"no adapter is installed for broker scheme {scheme!r}; "
            f"installed schemes: {', '.join(sorted(self.installed)) or '(none)'}"
        )
        if hint:
            message += f"; {hint}"
        super().__init__(message)


class PublishError(AckwiseError):
    """A message was refused before any I/O: nothing was published."""


class NotSerializable(PublishError, TypeError):
    """An argument (or header) cannot be encoded as JSON."""

    def __init__(self, task: str, path: str, value: Any, why: str | None = None) -> None:
        self.task = task
        self.path = path
        self.type_name = f"{type(value).__module__}.{type(value).__qualname__}".removeprefix(
            "builtins."
        )
        if why:
            detail = f"argument {path} of type {self.type_name} is {why}"
        else:
            detail = (
                f"argument {path} of type {self.type_name} is not JSON-serializable; expected "
                "str, int, float (finite), bool, None, list, tuple or dict with str keys"
            )
        super().__init__(f"{task}: {detail}; nothing was published")


class MessageTooLarge(PublishError):
    """The encoded envelope is larger than the broker accepts."""


class InvalidSchedule(PublishError, ValueError):
    """A countdown or eta that cannot be honoured (negative, naive, both given)."""


class InvalidPriority(PublishError, ValueError):
    """A priority outside 0-9, or above 0 on a broker that has no priorities."""


class EnvelopeError(AckwiseError):
    """A message body cannot be turned into an envelope."""


class DecodeError(EnvelopeError):
    """The body is not a valid JSON envelope."""


class UnknownEnvelopeVersion(EnvelopeError):
    """The envelope was written by a newer (or unknown) envelope version."""


class TaskFailed(AckwiseError):
    """A task whose result was asked for failed or was dead-lettered (``handle.get()``).

    ``state`` is ``failed`` or ``dead``; ``error`` the task's error (or why it is dead),
    ``traceback`` the task's traceback where it raised, ``reason`` the dead-letter reason.
    """

    def __init__(
        self,
        task: str,
        message_id: str,
        state: str,
        error: str | None,
        traceback: str | None = None,
        reason: str | None = None,
    ) -> None:
        self.task, self.message_id, self.state = task, message_id, state
        self.error, self.traceback, self.reason = error, traceback, reason
        why = error or reason or "no detail"
        super().__init__(f"task {task} ({message_id}) {state}: {why}")


class UnknownTask(AckwiseError, LookupError):
    """No task is registered under the envelope's task name."""


class SoftTimeLimitExceeded(AckwiseError):
    """Raised inside a task when its ``soft_time_limit`` has passed: clean up and return."""


class AdapterError(AckwiseError):
    """An adapter operation failed.  Adapters map their driver's errors into subclasses."""

    #: Whether retrying the same operation later may succeed.
    transient: bool = False


class TransientAdapterError(AdapterError):
    """Retrying later may succeed: connection lost, timeout, throttling, broker restarting."""

    transient = True


class BrokerUnavailable(TransientAdapterError):
    """The broker cannot be reached."""


class PermanentAdapterError(AdapterError):
    """Retrying will not help: bad credentials, a missing queue, a malformed request."""


class AuthenticationFailed(PermanentAdapterError):
    """The broker refused the credentials.  Credentials never appear in the message."""


class QueueNotFound(PermanentAdapterError):
    """The queue does not exist and the adapter was not allowed to declare it."""


class StaleReceipt(AdapterError):
    """A receipt no longer owns its message: the lease moved on, or it was settled already.

    A batch operation settles every delivery whose receipt is still valid and then raises
    this error naming the stale ones in :attr:`deliveries`.  Nothing of a stale delivery was
    changed.
    """

    def __init__(self, deliveries: Sequence[Any], operation: str = "settle") -> None:
        #: The stale deliveries (:class:`ackwise.spi.Delivery`), as the adapter was given them.
        self.deliveries: tuple[Any, ...] = tuple(deliveries)
        self.operation = operation
        ids = ", ".join(d.message_id for d in self.deliveries[:5])
        more = f" and {len(self.deliveries) - 5} more" if len(self.deliveries) > 5 else ""
        super().__init__(
            f"{operation}: stale receipt for message(s) {ids}{more}: the lease expired and the "
            "message was delivered again, or it was settled already; nothing was changed"
        )


class UnsupportedCapability(AdapterError):
    """The adapter cannot perform this operation (see its :class:`Capabilities`)."""

    def __init__(self, adapter: str, capability: str, detail: str = "") -> None:
        self.adapter = adapter
        self.capability = capability
        message = f"adapter {adapter!r} does not support {capability}"
        if detail:
            message += f": {detail}"
        super().__init__(message)


# -- the adapter SPI's error mapping, served here for the deprecation period -------------------
#: Names ``ackwise.errors`` used to export that belong to the adapter SPI (``ackwise.spi``):
#: they still work, with a ``DeprecationWarning`` naming the new import.
_MOVED_TO_SPI = frozenset({"ErrorTable", "from_table", "mapping_errors", "redact"})


def __getattr__(name: str) -> Any:
    """Serve a name that moved to :mod:`ackwise.spi`, warning that it did."""
    if name not in _MOVED_TO_SPI:
        raise AttributeError(f"module 'ackwise.errors' has no attribute {name!r}")
    import warnings
    from importlib import import_module

    warnings.warn(
        f"ackwise.errors.{name} is deprecated: import it from ackwise.spi (the old name stays "
        "for at least two more minor releases and six months)",
        DeprecationWarning,
        stacklevel=2,
    )
    # Looked up by name: this module is core's lowest layer and imports no other part of
    # ackwise (the layers of pyproject.toml); the lookup goes with the deprecated names.
    return getattr(import_module("ackwise.spi"), name)
