"""What follows a call's end, decided once for the worker (:mod:`ackwise.worker._settlement`)
and for eager mode (:mod:`ackwise.app._eager`): a chain's next step, a chord member's count
and its callback, the record of a chain that ended early (docs/workflows.md), and the attempt
an envelope carries into its retry or dead letter.

The workflows' headers are written by :mod:`ackwise.app._canvas` when a chain or chord is sent;
everything that reads them after a call ran is here.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import msgspec

from ackwise.contract import _envelope
from ackwise.contract._spi import MAX_PRIORITY, Outgoing
from ackwise.stores._results import ResultState, ResultStore, TaskResult, value_of

__all__ = [
    "CHAIN",
    "CHAIN_END",
    "CHORD",
    "Publish",
    "callback_message",
    "chord_member_finished",
    "follow_up",
    "in_workflow",
    "next_step",
    "retries_done",
    "with_attempt",
]

#: Envelope headers of a chain step: the steps to come, and the last step's message id.
CHAIN = "ackwise.chain"
CHAIN_END = "ackwise.chain_end"
#: Envelope header of a chord member: the chord's id, size, members, callback and its index.
CHORD = "ackwise.chord"

#: Publishes one message to a queue (a chain's next step, a chord's callback).
Publish = Callable[[str, Outgoing], None]


def retries_done(env: _envelope.Envelope) -> int:
    """The retries of the call ``env`` has had: the ``retry`` attempts of its history (a wait
    for a busy idempotency key is not one)."""
    return sum(1 for h in env.history if h.outcome == "retry")


def with_attempt(
    env: _envelope.Envelope,
    attempt: int,
    outcome: str,
    error: str | None,
    traceback: str | None,
    worker: str,
) -> _envelope.Envelope:
    """``env`` with one more attempt in its history: what its retry (``outcome="retry"``) or
    its dead letter carries."""
    note = _envelope.Attempt(
        attempt=attempt,
        at=time.time(),
        outcome=outcome,
        error=error,
        traceback=traceback,
        worker=worker,
    )
    return msgspec.structs.replace(env, history=[*env.history, note])


def in_workflow(env: _envelope.Envelope) -> bool:
    """Whether something follows the end of the call ``env`` (:func:`follow_up`)."""
    headers = env.headers
    return CHORD in headers or CHAIN in headers or CHAIN_END in headers


def follow_up(
    env: _envelope.Envelope,
    task: str,
    message_id: str,
    record: TaskResult,
    results: ResultStore | None,
    publish: Publish,
) -> None:
    """What follows the call ``env`` of ``task`` (the message ``message_id``), which ended for
    good with ``record``; done before the call is settled (docs/workflows.md).

    A chord member is counted in ``results`` (a failure fails the chord), and the member that
    finds every member counted publishes the callback; a chain step that succeeded publishes
    the next step; one that did not ends the chain, and the last step's record says why.
    ``results``: the app's result store (``None``: it has none, and neither a chord's count nor
    a chain's end can be recorded; the caller says so where it logs).
    """
    headers = env.headers
    info = headers.get(CHORD)
    if info is not None and results is not None:
        callback = chord_member_finished(results, info, record, message_id)
        if callback is not None:
            publish(*callback)
    if record.status is ResultState.SUCCEEDED:
        step = next_step(env, record.value)
        if step is not None:
            publish(*step)
        return
    end = headers.get(CHAIN_END)
    if results is not None and isinstance(end, str):
        why = f"chain step {task} ({message_id}) {record.state}: {record.error}"
        results.put([msgspec.structs.replace(record, id=end, task=None, error=why)])


def callback_message(info: dict[str, Any], values: list[Any]) -> tuple[str, Outgoing]:
    """A chord's callback message, given its members' values in order.  Its id is fixed and
    its idempotency key is ``chord:<id>``: every member that finds the chord complete sends
    it, and it runs once."""
    return _message(info["callback"], values, {"idempotency_key": f"chord:{info['id']}"})


def chord_member_finished(
    results: ResultStore, info: dict[str, Any], record: TaskResult, message_id: str
) -> tuple[str, Outgoing] | None:
    """A chord member's final record (``info``: its ``chord`` header): a failure fails the
    chord, naming the member; a success is stored, then counted once.  Returns the callback
    message when this member found every member counted, else ``None``."""
    if record.status is not ResultState.SUCCEEDED:
        why = (
            f"chord member {record.task} ({message_id}, #{info['index']}) "
            f"{record.state}: {record.error}"
        )
        results.put([msgspec.structs.replace(record, id=info["id"], task=None, error=why)])
        return None
    results.put([record])  # stored before it is counted: the callback reads it
    if results.join(info["id"], int(info["index"])) < int(info["size"]):
        return None
    values = []
    for mid in info["members"]:
        member = results.get(mid)
        if member is None or member.status is not ResultState.SUCCEEDED:
            return None  # a member's record expired or changed: the chord's record says so
        values.append(value_of(member))
    return callback_message(info, values)


def next_step(env: _envelope.Envelope, value_json: str | None) -> tuple[str, Outgoing] | None:
    """The chain's next message after ``env`` succeeded with ``value_json``, or ``None``."""
    rest = env.headers.get(CHAIN)
    if not rest:
        return None
    step = rest[0]
    value = msgspec.json.decode(value_json) if value_json is not None else None
    headers: dict[str, Any] = {"idempotency_key": f"chain:{step['id']}"}
    if rest[1:]:
        headers[CHAIN], headers[CHAIN_END] = rest[1:], env.headers.get(CHAIN_END)
    return _message(step, value, headers)


def _priority_of(step: dict[str, Any]) -> int:
    """A step's priority as its header carries it (0 for anything but 0-9: a header ackwise
    did not write does not stop the step)."""
    p = step.get("priority")
    return p if type(p) is int and 0 <= p <= MAX_PRIORITY else 0


def _message(step: dict[str, Any], value: Any, headers: dict[str, Any]) -> tuple[str, Outgoing]:
    created = time.time()
    delay = float(step.get("countdown") or 0.0)
    nxt = _envelope.Envelope(
        v=_envelope.ENVELOPE_VERSION,
        id=step["id"],
        task=step["task"],
        args=[value, *step.get("args", [])],
        kwargs=step.get("kwargs", {}),
        queue=step["queue"],
        created_at=created,
        eta=created + delay if delay else None,
        priority=_priority_of(step),
        headers=headers,
    )
    return step["queue"], Outgoing(nxt.id, _envelope.encode(nxt), delay, nxt.priority)
