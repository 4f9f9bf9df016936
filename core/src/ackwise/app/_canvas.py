"""Workflows (docs/workflows.md): chains and groups of ordinary messages.

A **chain** ``chain(a.s(1), b.s(), c.s())`` sends its first step; each step's envelope carries
the steps still to come (header ``ackwise.chain``) and the id of the last step
(``ackwise.chain_end``).  Every step's message id is chosen at send time, so the handle the
chain returns is the last step's.  When a step succeeds, the worker publishes the next one,
with the step's return value put before its arguments, *before* it acks the step: a crash in
between runs the step again (at least once) and publishes the next step again, under the same
id and the idempotency key ``chain:<id>``, so the next step has one effect wherever the app
has an idempotency store.  A step that fails for good ends the chain; with a result store,
the last step's record says which step and why.  (What follows a step's or a member's end is
:mod:`ackwise.app._followups`'s, for the worker and for eager mode.)

A **group** ``group([a.s(1), a.s(2)])`` sends its members in one round trip per queue; its
handle waits for them all.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, cast

from ackwise.app._followups import CHAIN, CHAIN_END, CHORD
from ackwise.app._handle import TaskHandle
from ackwise.app._requirements import missing_store
from ackwise.app._task import SendOptions, Signature, Task
from ackwise.contract import _envelope
from ackwise.errors import ConfigurationError

if TYPE_CHECKING:
    from ackwise.app._app import App

__all__ = [
    "Chain",
    "Chord",
    "Group",
    "GroupHandle",
    "chain",
    "chord",
    "group",
]


def _app_of(steps: Sequence[Signature], app: App | None) -> App:
    if app is not None:
        return app
    for s in steps:
        if isinstance(s.task, Task):
            # An App made the task (its module knows it as a TaskApp only).
            return cast("App", s.task.app)
    raise ConfigurationError(
        "a workflow of task names only needs its app: chain(..., app=app) or group([...], app=app)"
    )


def _name(sig: Signature) -> str:
    return sig.task.name if isinstance(sig.task, Task) else sig.task


def _step(app: App, sig: Signature, message_id: str) -> dict[str, Any]:
    """A step to send later, as a header carries it."""
    return {
        "task": _name(sig),
        "id": message_id,
        "queue": sig.options.get("queue") or app.target(sig.task)[1],
        "args": list(sig.args),
        "kwargs": dict(sig.kwargs),
        "countdown": sig.options.get("countdown"),
        "priority": app.call_priority(sig.task, sig.options.get("priority")),
    }


def _checked(
    steps: Iterable[Signature],
    what: str,
    allowed: tuple[str, ...] = ("queue", "countdown", "priority"),
) -> tuple[Signature, ...]:
    out = tuple(steps)
    if not out:
        raise ConfigurationError(f"{what}: expected at least one signature (task.s(...))")
    for s in out:
        if not isinstance(s, Signature):
            raise ConfigurationError(f"{what}: expected signatures (task.s(...)), got {s!r}")
        unknown = set(s.options) - set(allowed)
        if unknown:
            raise ConfigurationError(
                f"{what}: a step takes the options {', '.join(allowed)}, not {sorted(unknown)}"
            )
    return out


#: The send options a chain's steps or a chord's members and callback take: they may also be
#: given their message ids.
_OPTIONS = ("queue", "countdown", "id", "priority")


def _ids(steps: Sequence[Signature], what: str) -> list[str]:
    """The steps' message ids: each the one it was given (``.set(id=...)``), else a new one."""
    ids = [str(s.options.get("id") or _envelope.new_id()) for s in steps]
    if len(set(ids)) != len(ids):
        raise ConfigurationError(
            f"a {what}'s steps need distinct ids (each has its own message and result)"
        )
    return ids


@dataclass(frozen=True)
class Chain:
    """Steps run one after another, each given the previous one's return value first."""

    steps: tuple[Signature, ...]
    app: App | None = None

    def delay(self) -> TaskHandle:
        """Send the chain (:meth:`apply_async`)."""
        return self.apply_async()

    def apply_async(self) -> TaskHandle:
        """Send the first step; return the last step's handle (its result is the chain's)."""
        app = _app_of(self.steps, self.app)
        ids = _ids(self.steps, "chain")
        rest = [_step(app, s, mid) for s, mid in zip(self.steps[1:], ids[1:], strict=True)]
        first = self.steps[0]
        headers = {CHAIN: rest, CHAIN_END: ids[-1]} if rest else None
        options = dataclasses.replace(SendOptions.of(first.options), headers=headers, id=ids[0])
        app.send_call(first.task, first.args, first.kwargs, options)
        last = self.steps[-1]
        return app.handle(ids[-1], last.task)


def chain(*steps: Signature, app: App | None = None) -> Chain:
    """``chain(a.s(1), b.s(), c.s())``: ``c(b(a(1)))``, one message per step."""
    checked = _checked(steps, "chain", _OPTIONS)
    return Chain(checked, _app_of(checked, app))


class GroupHandle(list[TaskHandle]):
    """The members' handles, in order; :meth:`get` waits for them all."""

    def get(self, timeout: float | None = None, *, propagate: bool = True) -> list[Any]:
        """Every member's value, in order (``timeout`` is for the whole group)."""
        deadline = None if timeout is None else time.monotonic() + timeout
        out = []
        for h in self:
            left = None if deadline is None else max(0.0, deadline - time.monotonic())
            out.append(h.get(left, propagate=propagate))
        return out

    def ready(self) -> bool:
        """Whether every member's result is final."""
        return all(h.ready() for h in self)


@dataclass(frozen=True)
class Group:
    """Members sent together, run in parallel."""

    members: tuple[Signature, ...]
    app: App | None = None

    def delay(self) -> GroupHandle:
        """Send the group (:meth:`apply_async`)."""
        return self.apply_async()

    def apply_async(self) -> GroupHandle:
        """Send every member in one round trip per queue; return their handles, in order."""
        app = _app_of(self.members, self.app)
        return GroupHandle(app.send_many(self.members))


def group(members: Iterable[Signature], *, app: App | None = None) -> Group:
    """``group([a.s(1), a.s(2)])``: the members at once; ``.delay().get()`` their values."""
    checked = _checked(members, "group")
    return Group(checked, _app_of(checked, app))


@dataclass(frozen=True)
class Chord:
    """A group whose members' values, once every member succeeded, go to a callback."""

    members: tuple[Signature, ...]
    callback: Signature
    app: App | None = None

    def delay(self) -> TaskHandle:
        """Send the chord (:meth:`apply_async`)."""
        return self.apply_async()

    def apply_async(self) -> TaskHandle:
        """Send the members; return the callback's handle (its result is the chord's).

        A member or callback given an id (``.set(id=...)``) keeps it; the others get new ones.
        """
        app = _app_of((*self.members, self.callback), self.app)
        if app.result_store_url is None:
            raise missing_store(
                app, "result", f"app {app.name!r}", "a chord, which counts its members there,"
            )
        *ids, callback_id = _ids((*self.members, self.callback), "chord")
        info = {
            "id": callback_id,
            "size": len(self.members),
            "members": ids,
            "callback": _step(app, self.callback, callback_id),
        }
        app.send_many(
            [
                m.set(headers={CHORD: {**info, "index": i}}, id=mid)
                for i, (m, mid) in enumerate(zip(self.members, ids, strict=True))
            ]
        )
        return app.handle(callback_id, self.callback.task)


def chord(members: Iterable[Signature], callback: Signature, *, app: App | None = None) -> Chord:
    """``chord([a.s(1), a.s(2)], total.s())``: ``total([a(1), a(2)])`` once both succeeded."""
    checked = _checked(members, "chord", _OPTIONS)
    [cb] = _checked([callback], "chord callback", _OPTIONS)
    return Chord(checked, cb, _app_of((*checked, cb), app))
