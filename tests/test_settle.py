"""Every cell of the delivery table (docs/semantics.md), as decided by the one pure function ``settle``."""

from __future__ import annotations

import pytest

from ackwise import (
    Ack,
    AckMessage,
    DeadLetterMessage,
    Hold,
    LostMessage,
    NackMessage,
    Outcome,
    RetryMessage,
    settle,
)

E, L, R = Ack.EARLY, Ack.LATE, Ack.REJECT_ON_LOST

# (row of the delivery table, mode, outcome, kwargs, expected settlement)
TABLE = [
    # when the broker is told "done"
    ("early: acked just before the body starts", E, Outcome.STARTING, {}, AckMessage()),
    ("late: nothing at start", L, Outcome.STARTING, {}, Hold()),
    ("reject_on_lost: nothing at start", R, Outcome.STARTING, {}, Hold()),
    # task returns
    ("early: returns, acked before run", E, Outcome.SUCCEEDED, {}, Hold()),
    ("late: returns -> ack, may share a broker call", L, Outcome.SUCCEEDED, {}, AckMessage(True)),
    (
        "reject_on_lost: returns -> ack, may share a broker call",
        R,
        Outcome.SUCCEEDED,
        {},
        AckMessage(batch=True),
    ),
    # task raises, retries left
    (
        "early: retry published, original settled",
        E,
        Outcome.FAILED,
        {"retry_delay": 2.0},
        RetryMessage(2.0, original_settled=True),
    ),
    (
        "late: retry published, then original acked",
        L,
        Outcome.FAILED,
        {"retry_delay": 2.0},
        RetryMessage(2.0, original_settled=False),
    ),
    (
        "reject_on_lost: retry published, then original acked",
        R,
        Outcome.FAILED,
        {"retry_delay": 2.0},
        RetryMessage(2.0, original_settled=False),
    ),
    # task raises, no retries left or non-retryable
    (
        "early: dead-lettered failed (copy: original acked)",
        E,
        Outcome.FAILED,
        {},
        DeadLetterMessage("failed", original_settled=True),
    ),
    ("late: dead-lettered failed", L, Outcome.FAILED, {}, DeadLetterMessage("failed")),
    ("reject_on_lost: dead-lettered failed", R, Outcome.FAILED, {}, DeadLetterMessage("failed")),
    # executor dies, supervisor lives
    ("early: executor lost -> lost", E, Outcome.EXECUTOR_LOST, {}, LostMessage("worker_lost")),
    (
        "late: executor lost -> dead-lettered worker_lost",
        L,
        Outcome.EXECUTOR_LOST,
        {},
        DeadLetterMessage("worker_lost"),
    ),
    (
        "reject_on_lost: executor lost -> requeued",
        R,
        Outcome.EXECUTOR_LOST,
        {"attempt": 1, "max_deliveries": 3},
        NackMessage(0.0),
    ),
    (
        "reject_on_lost: executor lost on the last delivery -> dead-lettered max_deliveries",
        R,
        Outcome.EXECUTOR_LOST,
        {"attempt": 3, "max_deliveries": 3},
        DeadLetterMessage("max_deliveries"),
    ),
    (
        "late: hard time limit -> dead-lettered time_limit",
        L,
        Outcome.EXECUTOR_LOST,
        {"reason": "time_limit"},
        DeadLetterMessage("time_limit"),
    ),
    (
        "early: hard time limit -> lost",
        E,
        Outcome.EXECUTOR_LOST,
        {"reason": "time_limit"},
        LostMessage("time_limit"),
    ),
    # whole worker died: the broker redelivers; a crash loop ends at max_deliveries
    (
        "early: redelivered past max_deliveries",
        E,
        Outcome.OVER_LIMIT,
        {"attempt": 4, "max_deliveries": 3},
        DeadLetterMessage("max_deliveries"),
    ),
    (
        "late: redelivered past max_deliveries",
        L,
        Outcome.OVER_LIMIT,
        {"attempt": 4, "max_deliveries": 3},
        DeadLetterMessage("max_deliveries"),
    ),
    (
        "reject_on_lost: redelivered past max_deliveries",
        R,
        Outcome.OVER_LIMIT,
        {"attempt": 4, "max_deliveries": 3},
        DeadLetterMessage("max_deliveries"),
    ),
    # graceful shutdown: prefetched-unstarted returned at once
    ("early: unstarted returned at once", E, Outcome.NOT_STARTED, {}, NackMessage(0.0)),
    ("late: unstarted returned at once", L, Outcome.NOT_STARTED, {}, NackMessage(0.0)),
    ("reject_on_lost: unstarted returned at once", R, Outcome.NOT_STARTED, {}, NackMessage(0.0)),
    # grace exceeded (cold stop)
    ("early: running at cold stop -> lost", E, Outcome.ABANDONED, {}, LostMessage("abandoned")),
    ("late: running at cold stop -> back by lease", L, Outcome.ABANDONED, {}, Hold()),
    ("reject_on_lost: running at cold stop -> back by lease", R, Outcome.ABANDONED, {}, Hold()),
    # cannot be decoded / unknown task / bad envelope
    (
        "decode error -> dead-lettered",
        L,
        Outcome.REJECTED,
        {"reason": "decode_error"},
        DeadLetterMessage("decode_error"),
    ),
    (
        "bad envelope reason -> dead-lettered with it",
        E,
        Outcome.REJECTED,
        {"reason": "bad_envelope"},
        DeadLetterMessage("bad_envelope"),
    ),
    (
        "idempotency key done -> acked without running",
        E,
        Outcome.ALREADY_DONE,
        {},
        AckMessage(),
    ),
    (
        "idempotency key done -> acked without running (late)",
        L,
        Outcome.ALREADY_DONE,
        {},
        AckMessage(),
    ),
    (
        "idempotency key held by a live execution -> checked again later",
        R,
        Outcome.KEY_BUSY,
        {"retry_delay": 2.0},
        RetryMessage(2.0, original_settled=False, counts=False),
    ),
    (
        "unknown task -> offered again later (rolling deploy)",
        E,
        Outcome.UNKNOWN_TASK,
        {"attempt": 1, "max_deliveries": 3, "retry_delay": 5.0},
        NackMessage(5.0),
    ),
    (
        "unknown task, last delivery -> dead-lettered",
        L,
        Outcome.UNKNOWN_TASK,
        {"attempt": 3, "max_deliveries": 3, "retry_delay": 5.0},
        DeadLetterMessage("unknown_task"),
    ),
    (
        "unknown task, no requeue configured -> dead-lettered",
        R,
        Outcome.UNKNOWN_TASK,
        {"attempt": 1, "max_deliveries": 3},
        DeadLetterMessage("unknown_task"),
    ),
    (
        "unknown envelope version -> dead-lettered",
        R,
        Outcome.REJECTED,
        {"reason": "unknown_envelope_version"},
        DeadLetterMessage("unknown_envelope_version"),
    ),
    # deliveries that name no task of this worker: no mode
    (
        "no task: corrupt record -> dead-lettered",
        None,
        Outcome.REJECTED,
        {"reason": "corrupt_record"},
        DeadLetterMessage("corrupt_record"),
    ),
    (
        "no task: unknown task -> offered again later",
        None,
        Outcome.UNKNOWN_TASK,
        {"attempt": 1, "max_deliveries": 3, "retry_delay": 5.0},
        NackMessage(5.0),
    ),
    (
        "no task: unknown task, last delivery -> dead-lettered",
        None,
        Outcome.UNKNOWN_TASK,
        {"attempt": 3, "max_deliveries": 3, "retry_delay": 5.0},
        DeadLetterMessage("unknown_task"),
    ),
]


@pytest.mark.parametrize(
    ("mode", "outcome", "kwargs", "expected"),
    [pytest.param(m, o, k, x, id=name) for name, m, o, k, x in TABLE],
)
def test_settle_follows_the_semantics_table(mode, outcome, kwargs, expected):
    args = {"attempt": 1, "max_deliveries": 5, **kwargs}
    assert settle(mode, outcome, **args) == expected


def test_every_mode_and_outcome_has_a_row():
    covered = {(m, o) for _, m, o, _, _ in TABLE}
    for outcome in Outcome:
        if outcome in (
            Outcome.REJECTED,
            Outcome.UNKNOWN_TASK,
            Outcome.ALREADY_DONE,
            Outcome.KEY_BUSY,
        ):
            continue  # mode-independent: the task (and so its mode) is unknown
        for mode in Ack:
            if outcome is Outcome.OVER_LIMIT or (mode, outcome) in covered:
                continue
            pytest.fail(f"no row of the table covers {mode} / {outcome}")


@pytest.mark.parametrize("mode", list(Ack))
def test_executor_loss_never_loops_past_max_deliveries(mode):
    # Whatever the attempt, a lost executor never asks for another delivery beyond the bound.
    for attempt in range(1, 10):
        decision = settle(mode, Outcome.EXECUTOR_LOST, attempt=attempt, max_deliveries=3)
        if isinstance(decision, NackMessage):
            assert mode is Ack.REJECT_ON_LOST and attempt < 3


@pytest.mark.parametrize(
    "outcome",
    [o for o in Outcome if o not in (Outcome.REJECTED, Outcome.UNKNOWN_TASK, Outcome.OVER_LIMIT)],
)
def test_outcomes_of_a_task_need_its_mode(outcome):
    with pytest.raises(ValueError, match="mode"):
        settle(None, outcome, attempt=1, max_deliveries=5)


def test_a_failure_retry_counts_and_a_busy_key_wait_does_not():
    failed = settle(L, Outcome.FAILED, attempt=1, max_deliveries=5, retry_delay=1.0)
    busy = settle(L, Outcome.KEY_BUSY, attempt=1, max_deliveries=5, retry_delay=1.0)
    assert isinstance(failed, RetryMessage) and failed.counts
    assert isinstance(busy, RetryMessage) and not busy.counts


def test_negative_retry_delay_is_clamped():
    assert settle(L, Outcome.FAILED, attempt=1, max_deliveries=5, retry_delay=-1) == RetryMessage(
        0.0, original_settled=False
    )
