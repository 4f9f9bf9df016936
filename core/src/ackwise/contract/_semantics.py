"""The delivery-semantics contract (docs/semantics.md) as one pure function.

:func:`settle` maps (mode, what happened, the delivery's count) to what the worker must tell the
broker.  No adapter and no other module decides this; the worker only carries out the
:data:`Settlement` it returns.  ``tests/test_settle.py`` checks every cell of the table.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

__all__ = [
    "Ack",
    "AckMessage",
    "DeadLetterMessage",
    "Hold",
    "LostMessage",
    "NackMessage",
    "Outcome",
    "RetryMessage",
    "Settlement",
    "settle",
]


class Ack(enum.Enum):
    """When the broker is told a task's message is done."""

    #: Just before the task body starts (never at fetch): at most once.
    EARLY = "early"
    #: After the task finished (success, or final failure): at least once.
    LATE = "late"
    #: As LATE; and if the process executing the task dies, the message is requeued.
    REJECT_ON_LOST = "reject_on_lost"


class Outcome(enum.Enum):
    """What happened to a delivery, as far as the worker knows."""

    #: Received with a delivery count above ``max_deliveries`` (a crash loop): not run.
    OVER_LIMIT = "over_limit"
    #: The body cannot become a runnable task (undecodable, bad envelope…): not run.
    REJECTED = "rejected"
    #: No task of that name is registered here (yet: a rolling deploy may be under way).
    UNKNOWN_TASK = "unknown_task"
    #: The task body is about to start.
    STARTING = "starting"
    #: The task returned.
    SUCCEEDED = "succeeded"
    #: The task raised.  ``retry_delay`` says whether a retry is due.
    FAILED = "failed"
    #: The process executing the task died (SIGKILL, OOM, hard time limit).
    EXECUTOR_LOST = "executor_lost"
    #: Prefetched but not started when the worker shut down gracefully.
    NOT_STARTED = "not_started"
    #: Still running when the worker stopped cold (grace exceeded, second signal).
    ABANDONED = "abandoned"
    #: Its idempotency key completed before: the effect happened; not run.
    ALREADY_DONE = "already_done"
    #: Its idempotency key is held by a live execution: not run now.
    KEY_BUSY = "key_busy"


@dataclass(frozen=True, slots=True)
class Hold:
    """Tell the broker nothing now."""


@dataclass(frozen=True, slots=True)
class AckMessage:
    """Remove the message for good.

    ``batch``: the ack may wait a moment to share one broker call with others (a success's
    late ack: a crash in that window redelivers, which at-least-once allows).
    """

    batch: bool = False


@dataclass(frozen=True, slots=True)
class NackMessage:
    """Return the message to its queue, ready after ``delay`` seconds."""

    delay: float = 0.0


@dataclass(frozen=True, slots=True)
class RetryMessage:
    """Publish the task again after ``delay`` (same id, history extended).

    When ``original_settled`` is false the original is acked after the retry is published
    (that order can duplicate, never lose).  ``counts``: the retry uses up one of the task's
    ``max_retries`` (a failure's does; a wait for a busy idempotency key does not).
    """

    delay: float
    original_settled: bool
    counts: bool = True


@dataclass(frozen=True, slots=True)
class DeadLetterMessage:
    """Move the message to the dead-letter store with ``reason``.

    When ``original_settled`` is true (an early-acked task) the broker no longer has it: the
    worker stores a copy in the dead-letter store instead of moving the delivery.
    """

    reason: str
    original_settled: bool = False


@dataclass(frozen=True, slots=True)
class LostMessage:
    """The message is gone (early-acked and not completed); count it as lost."""

    reason: str


#: Outcomes of deliveries that may name no task of this worker (``settle(None, ...)``).
_WITHOUT_TASK = frozenset({Outcome.REJECTED, Outcome.UNKNOWN_TASK, Outcome.OVER_LIMIT})

Settlement = Hold | AckMessage | NackMessage | RetryMessage | DeadLetterMessage | LostMessage
"""What :func:`settle` tells the worker to do with one delivery: one of the six decisions."""

_HOLD = Hold()
_ACK = AckMessage()
_ACK_BATCHED = AckMessage(batch=True)
_NACK_NOW = NackMessage(0.0)

# The members settle() compares against, bound once: reading one as a class attribute costs
# ~65 ns on CPython 3.11, and the worker asks settle() at least twice per task.
_EARLY, _LATE = Ack.EARLY, Ack.LATE
_STARTING, _SUCCEEDED, _FAILED = Outcome.STARTING, Outcome.SUCCEEDED, Outcome.FAILED


def settle(
    mode: Ack | None,
    outcome: Outcome,
    *,
    attempt: int,
    max_deliveries: int,
    retry_delay: float | None = None,
    reason: str | None = None,
) -> Settlement:
    """Decide what to tell the broker about one delivery.

    :param mode: the task's delivery mode; ``None`` for a delivery that names no task this
        worker has (``REJECTED``, ``UNKNOWN_TASK``, ``OVER_LIMIT`` only).
    :param outcome: what happened.
    :param attempt: the delivery count of this delivery (1 for the first delivery).
    :param max_deliveries: bound on deliveries of one message; crash loops end there.
    :param retry_delay: for ``FAILED``: the delay of the retry that is due, or ``None`` when no
        retry is left or the error is not retryable; for ``UNKNOWN_TASK``: the delay before
        the message is offered again (``max_deliveries`` then bounds how often).
    :param reason: for ``REJECTED``: why (``decode_error``, ``unknown_task``, …); for
        ``EXECUTOR_LOST``: the cause (``worker_lost`` by default, or ``time_limit``).
    """
    if mode is None and outcome not in _WITHOUT_TASK:
        raise ValueError(f"{outcome!r} needs the task's mode")
    early = mode is _EARLY
    if outcome is _STARTING:
        return _ACK if early else _HOLD
    if outcome is _SUCCEEDED:
        return _HOLD if early else _ACK_BATCHED
    if outcome is _FAILED:
        if retry_delay is not None:
            return RetryMessage(max(0.0, retry_delay), original_settled=early)
        return DeadLetterMessage("failed", original_settled=early)
    if outcome is Outcome.EXECUTOR_LOST:
        cause = reason or "worker_lost"
        if early:
            return LostMessage(cause)
        if mode is _LATE:
            return DeadLetterMessage(cause)
        if attempt >= max_deliveries:
            return DeadLetterMessage("max_deliveries")
        return _NACK_NOW
    if outcome is Outcome.OVER_LIMIT:
        return DeadLetterMessage("max_deliveries")
    if outcome is Outcome.REJECTED:
        return DeadLetterMessage(reason or "rejected")
    if outcome is Outcome.UNKNOWN_TASK:
        # Survive a rolling deploy: offer it again a bounded number of times, then park it.
        if retry_delay is not None and attempt < max_deliveries:
            return NackMessage(max(0.0, retry_delay))
        return DeadLetterMessage("unknown_task")
    if outcome is Outcome.NOT_STARTED:
        return _NACK_NOW
    if outcome is Outcome.ALREADY_DONE:
        return _ACK
    if outcome is Outcome.KEY_BUSY:
        # Checked again later, as a new message: waiting must not use up max_deliveries.
        return RetryMessage(max(0.0, retry_delay or 0.0), original_settled=False, counts=False)
    if outcome is Outcome.ABANDONED:
        # Cold stop: early messages were acked before they started (lost with the task);
        # late ones come back when the lease expires or the connection closes.
        return LostMessage("abandoned") if early else _HOLD
    raise ValueError(f"unknown outcome {outcome!r}")  # pragma: no cover
