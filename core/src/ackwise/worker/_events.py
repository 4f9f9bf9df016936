"""What the worker reports: one dataclass per event, one :class:`Events` that routes them.

Two families share the stream:

- :class:`TaskEvent`: something that happened to one delivery (received, started, succeeded,
  failed, interrupted, retried, dead-lettered, lost, returned, stale, skipped);
- :class:`WorkerEvent`: something that happened to the worker (a broker error, a reconnect,
  one receive call's deliveries, a round of lease renewals).

Every event reaches its subscribers through :meth:`Events.emit`:

- subscribers (``Events.subscribe``: the task log, the metrics) get the event object itself,
  for the event types they asked for;
- listeners (``Worker(listeners=...)``, used by :mod:`ackwise.testing`) get
  ``listener(kind, info)`` for every task event, ``info`` holding ``task``, ``message_id``,
  ``queue``, ``attempt`` and the event's own fields;
- plugins get the ``ackwise_task_<kind>`` hook (``docs/hooks.md``) of the events that have
  one (:attr:`TaskEvent.hook_fields` names its arguments beyond ``task`` and
  ``message_id``); ``tests/test_events.py`` checks them against the hook specifications.

An event type nobody receives is never built on the hot path: the worker checks
:attr:`Events.heard` first.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar

if TYPE_CHECKING:
    from ackwise.plugins._manager import Plugins

__all__ = [
    "DEAD_LETTER_REASONS",
    "EVENTS",
    "STALE_OPERATIONS",
    "TASK_EVENTS",
    "WORKER_EVENTS",
    "BrokerError",
    "DeadLettered",
    "Event",
    "Events",
    "Failed",
    "Fetched",
    "Interrupted",
    "LeasesRenewed",
    "Listener",
    "Lost",
    "Received",
    "Reconnected",
    "Retried",
    "Returned",
    "Skipped",
    "Stale",
    "Started",
    "Subscriber",
    "Succeeded",
    "TaskEvent",
    "WorkerEvent",
]

Listener = Callable[[str, dict[str, Any]], None]

#: Every :attr:`DeadLettered.reason` the worker gives (docs/failure-handling.md lists them):
#: the metrics export each at 0 from the start.
DEAD_LETTER_REASONS = (
    "failed",
    "worker_lost",
    "time_limit",
    "max_deliveries",
    "decode_error",
    "corrupt_record",
    "unknown_envelope_version",
    "unknown_task",
)
#: Every :attr:`Stale.operation` (docs/observability.md, the task log's ``stale`` line).
STALE_OPERATIONS = ("ack", "early ack", "nack", "extend", "dead_letter", "start")


@dataclass(slots=True)
class Event:
    """Anything the worker reports."""

    #: The event's name: the listener's ``kind``, the log line's ``event``.
    kind: ClassVar[str] = ""


@dataclass(slots=True)
class TaskEvent(Event):
    """Something that happened to one delivery."""

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


@dataclass(slots=True)
class Received(TaskEvent):
    """Taken from the broker (before it is decoded: ``task`` is ``None``)."""

    kind = "received"


@dataclass(slots=True)
class Started(TaskEvent):
    """Handed to an executor; ``due_at`` is when it could first run (enqueue time or ETA)."""

    kind = "started"
    hook_fields = ("attempt", "queue")
    due_at: float = 0.0


@dataclass(slots=True)
class Succeeded(TaskEvent):
    kind = "succeeded"
    hook_fields = ("attempt", "duration")
    duration: float


@dataclass(slots=True)
class Failed(TaskEvent):
    """The task raised; ``duration`` is how long it ran."""

    kind = "failed"
    hook_fields = ("attempt", "error")
    error: str | None
    duration: float = 0.0


@dataclass(slots=True)
class Interrupted(TaskEvent):
    """The execution did not finish: its process died (``worker_lost``), was killed at its
    hard time limit (``time_limit``), or a cold stop abandoned it (``abandoned``)."""

    kind = "interrupted"
    reason: str


@dataclass(slots=True)
class Retried(TaskEvent):
    kind = "retried"
    hook_fields = ("attempt", "delay")
    delay: float
    error: str | None = None


@dataclass(slots=True)
class DeadLettered(TaskEvent):
    kind = "dead_lettered"
    hook_fields = ("queue", "reason")
    reason: str
    error: str | None


@dataclass(slots=True)
class Lost(TaskEvent):
    kind = "lost"
    hook_fields = ("queue", "reason")
    reason: str


@dataclass(slots=True)
class Returned(TaskEvent):
    """Given back to the queue (not started, unknown task, idempotency key busy)."""

    kind = "returned"
    reason: str
    delay: float


@dataclass(slots=True)
class Stale(TaskEvent):
    """A settlement or renewal found the lease gone; ``operation`` says which."""

    kind = "stale"
    operation: str


@dataclass(slots=True)
class Skipped(TaskEvent):
    """Not run: its idempotency key is done."""

    kind = "skipped"
    key: str


@dataclass(slots=True)
class WorkerEvent(Event):
    """Something that happened to the worker as a whole."""


@dataclass(slots=True)
class BrokerError(WorkerEvent):
    """A broker call failed; ``transient``: the worker reconnects, else it stops."""

    kind = "broker_error"
    error: str
    transient: bool


@dataclass(slots=True)
class Reconnected(WorkerEvent):
    """The broker answers again after ``after`` seconds of errors."""

    kind = "reconnected"
    after: float


@dataclass(slots=True)
class Fetched(WorkerEvent):
    """One receive call brought ``attempts`` (one delivery count per delivery) from ``queue``.

    The per-delivery :class:`Received` events say the same one by one; counting needs only
    this, one event per broker call.
    """

    kind = "fetched"
    queue: str
    attempts: list[int]


@dataclass(slots=True)
class LeasesRenewed(WorkerEvent):
    """One round of lease renewal: ``renewed`` leases moved on, ``lost`` were gone."""

    kind = "leases_renewed"
    renewed: int
    lost: int


TASK_EVENTS: tuple[type[TaskEvent], ...] = (
    Received,
    Started,
    Succeeded,
    Failed,
    Interrupted,
    Retried,
    DeadLettered,
    Lost,
    Returned,
    Stale,
    Skipped,
)
WORKER_EVENTS: tuple[type[WorkerEvent], ...] = (BrokerError, Reconnected, Fetched, LeasesRenewed)
EVENTS: tuple[type[Event], ...] = (*TASK_EVENTS, *WORKER_EVENTS)

#: A subscriber: ``callback(event)`` for events of the types it names.
Subscriber = tuple[Iterable[type[Event]], Callable[[Any], None]]


class Events:
    """The one way the worker reports: :meth:`emit` routes each event to whoever hears it."""

    def __init__(
        self,
        listeners: Sequence[Listener],
        plugins: Plugins,
        subscribers: Sequence[Subscriber] = (),
    ) -> None:
        self.listeners = list(listeners)
        self._routes: dict[type[Event], list[Callable[[Any], None]]] = {cls: [] for cls in EVENTS}
        for cls in TASK_EVENTS:
            if self.listeners:
                self._routes[cls].append(self._to_listeners)
            if cls.hook_fields is not None:
                hook = plugins.emitter(f"ackwise_task_{cls.kind}")
                if hook is not None:
                    self._routes[cls].append(_to_hook(hook))
        #: The event types someone receives.  The worker builds the events of every task
        #: (received, started, succeeded) only when they are heard: one costs ~0.5 µs.
        self.heard: frozenset[type[Event]] = frozenset()
        for kinds, callback in subscribers:
            self.subscribe(kinds, callback)
        self._update_heard()

    def subscribe(self, kinds: Iterable[type[Event]], callback: Callable[[Any], None]) -> None:
        """Have ``callback(event)`` called for every event of the types in ``kinds``."""
        for cls in kinds:
            self._routes[cls].append(callback)
        self._update_heard()

    def _update_heard(self) -> None:
        self.heard = frozenset(cls for cls, route in self._routes.items() if route)

    def emit(self, event: Event) -> None:
        for receive in self._routes[type(event)]:
            receive(event)

    def _to_listeners(self, event: TaskEvent) -> None:
        info = event.info()
        for listener in self.listeners:
            listener(event.kind, info)


def _to_hook(hook: Callable[..., Any]) -> Callable[[TaskEvent], None]:
    def call(event: TaskEvent) -> None:
        hook(**event.hook_kwargs())

    return call
