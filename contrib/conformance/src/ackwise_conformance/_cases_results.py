"""Scenarios C25-C28: task results, chords and chains under redelivery (docs/results.md,
docs/workflows.md)."""

from __future__ import annotations

import json
import signal

from ackwise import ResultStore, TaskResult, open_result_store
from ackwise_conformance._registry import EARLY, scenario
from ackwise_conformance.harness import Harness, expect
from ackwise_conformance.helpers import eventually
from ackwise_conformance.processes import WorkerHandle
from ackwise_conformance.result_faults import AFTER_CALLBACK, crashing

#: Worker processes load the faulty result stores (:mod:`ackwise_conformance.result_faults`).
FAULTS = {"ACKWISE_PLUGINS": "ackwise_conformance.result_faults"}


def _killed_by_its_store(h: Harness, worker: WorkerHandle, where: str) -> None:
    """Wait for ``worker`` to die, and check that it died by SIGKILL (its store's, ``where``)."""
    eventually(lambda: not worker.alive(), h.patience, description="the first worker's death")
    expect(
        worker.wait(h.t(1.0)) == -signal.SIGKILL,
        f"the first worker must die by SIGKILL, {where}",
        h,
    )


def _succeeded(h: Harness, store: ResultStore, mid: str, what: str) -> TaskResult:
    """The ``succeeded`` record of ``mid`` in ``store``; the case fails naming ``what``."""
    record = store.get(mid)
    expect(
        record is not None and record.state == "succeeded",
        f"{what} must be stored as succeeded; found {record}",
        h,
        mid,
    )
    assert record is not None
    return record


@scenario(
    "C25",
    "a result is written once under redelivery (killed after the store write, before the ack)",
    cost=6,
)
def c25(h: Harness) -> None:
    h.require_processes("worker processes")
    store_url = h.result_store_url
    first = h.worker(pool="threads", results=crashing(store_url), env=FAULTS)
    [mid] = h.publish(["victim"])
    # Its store SIGKILLs the worker right after the success is written: the ack never goes.
    _killed_by_its_store(h, first, "in its result store's put")
    store = open_result_store(store_url)
    try:
        stored = _succeeded(h, store, mid, "the first execution's result (written before the ack)")
        h.worker(pool="threads", results=store_url)
        h.drain()
        fate = h.history().by_key("victim")
        if h.mode is EARLY:
            expect(fate.executions == 1, "EARLY: acked before it ran: no second run", h, mid)
        else:
            expect(
                fate.executions == 2 and len(fate.ends) == 2,
                "the unacked message must be delivered again and run again (at least once)",
                h,
                mid,
            )
        now = store.get(mid)
        expect(
            now is not None and now.state == "succeeded" and now.value == stored.value,
            f"the stored success must stay the first execution's ({stored.value}); the "
            f"store now holds {now}",
            h,
            mid,
        )
        pid = json.loads(stored.value or "{}").get("pid")
        expect(
            pid == first.pid,
            f"the stored value came from pid {pid}, not the first worker's ({first.pid})",
            h,
            mid,
        )
    finally:
        store.forget([mid])  # the suite leaves nothing behind
        store.close()
    h.history().expect_broker_settled(dead=0)


@scenario(
    "C26",
    "a chord whose member is redelivered fires its callback exactly once",
    na_modes={EARLY: "no EARLY cell: an early-acked member is never delivered again"},
    cost=8,
)
def c26(h: Harness) -> None:
    h.require_processes("worker processes")
    faulty = crashing(h.result_store_url, after=AFTER_CALLBACK)
    first = h.worker(pool="threads", concurrency=3, results=faulty, env=FAULTS)
    keys = ["member-0", "member-1", "member-2"]
    members, callback = h.publish_chord(keys, callback="callback")
    # Its store SIGKILLs the worker once the member completing the chord sent the callback,
    # before that member's ack: the member is delivered again and completes the chord again.
    _killed_by_its_store(h, first, "after the callback was sent")
    h.worker(pool="threads", concurrency=3, results=h.result_store_url)
    h.drain()
    history = h.history()
    history.expect_completed(keys)
    expect(
        any(history.by_key(k).executions >= 2 for k in keys),
        "the member that sent the callback was not acked: it must run again",
        h,
        *members,
    )
    fate = history.by_key("callback")
    expect(
        len(fate.ends) == 1,
        f"the callback must complete exactly once; it completed {len(fate.ends)} time(s) "
        f"(a redelivered member completes the chord again and sends it again: its "
        f"idempotency key chord:{callback} must make that copy a no-op)",
        h,
        callback,
    )
    store = open_result_store(h.result_store_url)
    try:
        record = _succeeded(h, store, callback, "the callback's result")
        values = json.loads(record.value or "{}").get("members")
        expect(
            isinstance(values, list) and len(values) == len(keys),
            f"the callback must get every member's value, in order; got {values}",
            h,
            callback,
        )
    finally:
        store.close()
    history.expect_no_unexpected()
    history.expect_broker_settled(dead=0)


@scenario(
    "C27",
    "a chord with a dead-lettered member ends failed and says which member",
    cost=6,
)
def c27(h: Harness) -> None:
    h.worker(pool="threads", concurrency=2, results=h.result_store_url)
    keys = ["good-0", "bad", "good-1"]
    members, callback = h.publish_chord(keys, {"bad": {"fatal": True}})
    eventually(lambda: h.stats().dead == 1, h.patience, description="the member's dead letter")
    h.drain()
    history = h.history()
    history.expect_dead("bad", "failed", executions=1)
    history.expect_completed(["good-0", "good-1"])
    history.expect_no_unexpected()  # the callback was never published: it never ran
    store = open_result_store(h.result_store_url)
    try:
        record = store.get(callback)
        expect(
            record is not None
            and record.state in ("failed", "dead")
            and members[1] in (record.error or "")
            and "#1" in (record.error or ""),
            f"the chord's record must say it failed, naming member #1 ({members[1]}); "
            f"found {record}",
            h,
            members[1],
        )
    finally:
        store.close()
    history.expect_broker_settled(dead=1)


@scenario(
    "C28",
    "a chain step killed after it sent the next step, before its ack: the next step runs once",
    na_modes={EARLY: "no EARLY cell: an early-acked step is never delivered again"},
    cost=6,
)
def c28(h: Harness) -> None:
    h.require_processes("worker processes")
    first = h.worker(pool="threads", results=crashing(h.result_store_url), env=FAULTS)
    ids = h.publish_chain(["step-1", "step-2"])
    # Its store SIGKILLs the worker as it writes step 1's success, which comes after step 2 is
    # sent and before step 1's ack: step 1 runs again and sends step 2 again.
    _killed_by_its_store(h, first, "after step 1 sent step 2")
    h.worker(pool="threads", results=h.result_store_url)
    h.drain()
    history = h.history()
    expect(
        history.by_key("step-1").executions >= 2,
        "step 1 was not acked: it must run again",
        h,
        ids[0],
    )
    fate = history.by_key("step-2")
    expect(
        len(fate.ends) == 1,
        f"step 2 must complete exactly once; it completed {len(fate.ends)} time(s) (step 1 "
        f"ran again and sent it again: its idempotency key chain:{ids[1]} must make that "
        "copy a no-op)",
        h,
        ids[1],
    )
    history.expect_no_unexpected()
    history.expect_broker_settled(dead=0)
