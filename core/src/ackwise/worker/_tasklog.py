"""The worker's task log: one line per thing that happened to a delivery, on ``ackwise.task``.

Each line names the event, the task, the message id, the queue, the delivery mode and the
attempt, then the event's own fields (duration, delay, error, reason…); the JSON format
(:mod:`ackwise.contract._logconfig`) gives the same fields as keys.  An event whose level the logger
does not let through at worker start is not subscribed to, so it costs nothing per message.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import time
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from ackwise.contract._logconfig import TASK_LOGGER
from ackwise.worker._events import (
    DeadLettered,
    Events,
    Failed,
    Interrupted,
    Lost,
    Received,
    Retried,
    Returned,
    Skipped,
    Stale,
    Started,
    Succeeded,
    TaskEvent,
)

if TYPE_CHECKING:
    from ackwise.app._task import Task

__all__ = ["LEVELS", "TASK_LOGGER", "TaskLog"]


#: The level of each event's line.
LEVELS: dict[type[TaskEvent], int] = {
    Received: logging.DEBUG,
    Started: logging.INFO,
    Succeeded: logging.INFO,
    Retried: logging.INFO,
    Returned: logging.INFO,
    Skipped: logging.INFO,
    Failed: logging.WARNING,
    Interrupted: logging.WARNING,
    Stale: logging.WARNING,
    DeadLettered: logging.ERROR,
    Lost: logging.ERROR,
}

#: What each event's extra fields mean, in words, after the common ones.
_EXPLAIN: dict[type[TaskEvent], str] = {
    Lost: "it was acked before it started (Ack.EARLY) and did not complete",
    Skipped: "not run: its idempotency key is done",
}

#: The line's first words where the event's name alone would say less.
_WORDS: dict[type[TaskEvent], str] = {Stale: "stale receipt"}

_STALE_WHY = {
    "early ack": "its lease had expired (it may run again elsewhere), or an earlier try whose "
    "answer was lost went through; not run here (at most once)",
    "start": "its lease ran out before it could start (the worker was blocked or the broker "
    "answered late); not run here, the broker gives it again",
}
_STALE_DEFAULT = "its lease had expired and it may run again elsewhere; nothing was changed"


class TaskLog:
    """Subscribes ``logger`` (default ``ackwise.task``) to the events its level lets through.

    :param tasks: the app's tasks by name, for each line's delivery mode.
    """

    def __init__(
        self,
        events: Events,
        tasks: Mapping[str, Task[..., Any]],
        logger: logging.Logger | None = None,
    ) -> None:
        self.log = logger or logging.getLogger(TASK_LOGGER)
        self._modes = {name: task.ack.value for name, task in tasks.items()}
        enabled = [cls for cls, level in LEVELS.items() if self.log.isEnabledFor(level)]
        if enabled:
            events.subscribe(enabled, self.write)

    def write(self, event: TaskEvent) -> None:
        fields: dict[str, Any] = {
            "event": event.kind,
            "task": event.task,
            "message_id": event.message_id,
            "queue": event.queue,
            "mode": self._modes.get(event.task) if event.task is not None else None,
            "attempt": event.attempt,
        }
        for name in _OWN[type(event)]:
            fields[name] = getattr(event, name)
        if isinstance(event, Started) and event.due_at:
            fields["waited"] = max(0.0, time.time() - event.due_at)  # enqueue (or ETA) to start
        extra = " ".join(f"{k}={_text(k, v)}" for k, v in fields.items() if k not in _HEAD)
        why = _why(event)
        self.log.log(
            LEVELS[type(event)],
            "%s %s id=%s queue=%s mode=%s attempt=%s%s%s",
            _WORDS.get(type(event), event.kind),
            event.task or "-",
            event.message_id,
            event.queue,
            fields["mode"] or "-",
            event.attempt,
            f" {extra}" if extra else "",
            f": {why}" if why else "",
            extra={"ackwise": fields},
        )


_HEAD = ("event", "task", "message_id", "queue", "mode", "attempt")
_COMMON = {f.name for f in dataclasses.fields(TaskEvent)}
#: Each event's own fields, in order (``due_at`` is logged as ``waited``).
_OWN = {
    cls: tuple(f.name for f in dataclasses.fields(cls) if f.name not in _COMMON | {"due_at"})
    for cls in LEVELS
}


def _why(event: TaskEvent) -> str | None:
    if isinstance(event, Stale):
        return _STALE_WHY.get(event.operation, _STALE_DEFAULT)
    return _EXPLAIN.get(type(event))


def _text(name: str, value: Any) -> str:
    if value is None:
        return "-"
    if isinstance(value, float) and name in ("duration", "delay", "waited"):
        return f"{value:.3f}s"
    if isinstance(value, str) and (not value or any(c in value for c in ' "=\n')):
        return json.dumps(value, ensure_ascii=False)  # logfmt: quoted, escapes as JSON
    return str(value)
