"""One event type per event: the hooks, their reference page and the listeners agree."""

from __future__ import annotations

import inspect
import re
from pathlib import Path

from ackwise.plugins import _hookspecs
from ackwise.worker._events import TASK_EVENTS, Events, Received, Started, TaskEvent

ROOT = Path(__file__).resolve().parents[1]


def _hooked() -> list[type[TaskEvent]]:
    return [e for e in TASK_EVENTS if e.hook_fields is not None]


def test_every_task_hook_is_an_event_and_every_hooked_event_a_hook() -> None:
    specs = {n for n in dir(_hookspecs) if n.startswith("ackwise_task_")}
    assert specs == {f"ackwise_task_{e.kind}" for e in _hooked()}


def test_hook_arguments_are_the_event_fields_the_spec_names() -> None:
    for event in _hooked():
        spec = getattr(_hookspecs, f"ackwise_task_{event.kind}")
        params = list(inspect.signature(spec).parameters)
        assert params == ["task", "message_id", *(event.hook_fields or ())], event.kind
        fields = set(event.__dataclass_fields__)
        assert set(params) <= fields, f"{event.kind}: hook names a field the event lacks"


def test_the_hook_reference_lists_each_event_hook_with_its_arguments() -> None:
    doc = (ROOT / "docs" / "hooks.md").read_text()
    for event in _hooked():
        row = re.search(rf"^\| `ackwise_task_{event.kind}` \| `([^`]*)` \|", doc, re.M)
        assert row, f"ackwise_task_{event.kind} has no row in docs/hooks.md"
        assert row.group(1) == ", ".join(["task", "message_id", *(event.hook_fields or ())])


def test_emit_feeds_listeners_and_hooks_the_same_event() -> None:
    seen: list[tuple[str, dict[str, object]]] = []
    calls: list[dict[str, object]] = []

    class Plugins:
        def emitter(self, hook: str):  # type: ignore[no-untyped-def]
            return (lambda **kw: calls.append({"hook": hook, **kw})) if "started" in hook else None

    events = Events([lambda kind, info: seen.append((kind, info))], Plugins())  # type: ignore[arg-type]
    events.emit(Started("t", "m1", "q", 2))
    assert seen == [
        ("started", {"task": "t", "message_id": "m1", "queue": "q", "attempt": 2, "due_at": 0.0})
    ]
    assert calls == [
        {
            "hook": "ackwise_task_started",
            "task": "t",
            "message_id": "m1",
            "attempt": 2,
            "queue": "q",
        }
    ]


def test_the_events_of_every_task_are_heard_by_a_hook_without_listeners() -> None:
    # The worker builds started/succeeded events only when heard: a plugin's hook alone must
    # be enough (run_worker always adds a listener, so worker tests do not show this).
    class Plugins:
        def __init__(self, hooks: set[str]) -> None:
            self.hooks = hooks

        def emitter(self, hook: str):  # type: ignore[no-untyped-def]
            return (lambda **kw: None) if hook in self.hooks else None

    assert Events([], Plugins({"ackwise_task_started"})).heard == {Started}  # type: ignore[arg-type]
    assert Events([], Plugins(set())).heard == frozenset()  # type: ignore[arg-type]
    everyone = Events([lambda kind, info: None], Plugins(set()))  # type: ignore[arg-type]
    assert everyone.heard == frozenset(TASK_EVENTS)  # listeners hear every task event


def test_a_subscriber_gets_the_event_objects_of_the_types_it_named() -> None:
    class Plugins:
        def emitter(self, hook: str) -> None:
            return None

    events = Events([], Plugins())  # type: ignore[arg-type]
    got: list[TaskEvent] = []
    events.subscribe([Started], got.append)
    assert events.heard == {Started}
    started = Started("t", "m1", "q", 1, due_at=5.0)
    events.emit(started)
    events.emit(Received("t", "m2", "q", 1))  # nobody asked for it: dropped
    assert got == [started]
