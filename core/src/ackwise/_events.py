"""What the worker reports about each delivery: one dataclass per event, one :class:`Events`.

Every event reaches both kinds of subscriber through :meth:`Events.emit`:

- listeners (``Worker(listeners=...)``, used by :mod:`ackwise.testing`) get
  ``listener(kind, info)`` for every event, ``info`` holding ``task``, ``message_id``,
  ``queue``, ``attempt`` and the event's own fields;
- plugins get the ``ackwise_task_<kind>`` hook (``docs/hooks.md``) of the events that have
  one (:attr:`TaskEvent.hook_fields` names its arguments beyond ``task`` and
  ``message_id``); ``tests/test_events.py`` checks them against the hook specifications.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar

if TYPE_CHECKING:
    from ackwise._plugins import Plugins

__all__ = [
    "EVENTS",
    "DeadLettered",
    "Events",
    "Failed",
    "Listener",
    "Lost",
    "Retried",
    "Returned",
    "Skipped",
    "Stale",
    "Started",
    "Succeeded",
    "TaskEvent",
]

Listener = Callable[[str, dict[str, Any]], None]


@dataclass(frozen=True, slots=True)
class TaskEvent:
    """Something that happened to one delivery."""

    #: The listener's event name; the hook is ``ackwise_task_<kind>`` where there is one.
    kind: ClassVar[str] = ""
    #: Arguments of the hook besides ``task`` and ``message_id``; ``None``: no hook.
    hook_fields: ClassVar[tuple[str, ...] | None] = None

    task: str | None
    message_id: str
    queue: str
    attempt: int

    def info(self) -> dict[str, Any]:
        """The listener's payload: the four common fields, then the event's own."""
        return {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}

    def hook_kwargs(self) -> dict[str, Any]:
        assert self.hook_fields is not None
        return {
            "task": self.task,
            "message_id": self.message_id,
            **{name: getattr(self, name) for name in self.hook_fields},
        }


@dataclass(frozen=True, slots=True)
class Started(TaskEvent):
    kind = "started"
    hook_fields = ("attempt", "queue")


@dataclass(frozen=True, slots=True)
class Succeeded(TaskEvent):
    kind = "succeeded"
    hook_fields = ("attempt", "duration")
    duration: float


@dataclass(frozen=True, slots=True)
class Failed(TaskEvent):
    kind = "failed"
    hook_fields = ("attempt", "error")
    error: str | None


@dataclass(frozen=True, slots=True)
class Retried(TaskEvent):
    kind = "retried"
    hook_fields = ("attempt", "delay")
    delay: float


@dataclass(frozen=True, slots=True)
class DeadLettered(TaskEvent):
    kind = "dead_lettered"
    hook_fields = ("queue", "reason")
    reason: str
    error: str | None


@dataclass(frozen=True, slots=True)
class Lost(TaskEvent):
    kind = "lost"
    hook_fields = ("queue", "reason")
    reason: str


@dataclass(frozen=True, slots=True)
class Returned(TaskEvent):
    """Given back to the queue (not started, unknown task, idempotency key busy)."""

    kind = "returned"
    reason: str
    delay: float


@dataclass(frozen=True, slots=True)
class Stale(TaskEvent):
    """A settlement or renewal found the lease gone; ``operation`` says which."""

    kind = "stale"
    operation: str


@dataclass(frozen=True, slots=True)
class Skipped(TaskEvent):
    """Not run: its idempotency key is done."""

    kind = "skipped"
    key: str


EVENTS: tuple[type[TaskEvent], ...] = (
    Started,
    Succeeded,
    Failed,
    Retried,
    DeadLettered,
    Lost,
    Returned,
    Stale,
    Skipped,
)


class Events:
    """The one way the worker reports: :meth:`emit` feeds the listeners and the hooks."""

    def __init__(self, listeners: Sequence[Listener], plugins: Plugins) -> None:
        self.listeners = list(listeners)
        self._hooks = {
            cls.kind: plugins.emitter(f"ackwise_task_{cls.kind}")
            for cls in EVENTS
            if cls.hook_fields is not None
        }
        #: The event types someone receives.  The worker builds the events of every task
        #: (started, succeeded) only when they are heard: an event object costs ~0.5 µs.
        self.heard: frozenset[type[TaskEvent]] = frozenset(
            cls for cls in EVENTS if self.listeners or self._hooks.get(cls.kind) is not None
        )

    def emit(self, event: TaskEvent) -> None:
        if self.listeners:
            info = event.info()
            for listener in self.listeners:
                listener(event.kind, info)
        hook = self._hooks.get(event.kind)
        if hook is not None:
            hook(**event.hook_kwargs())
