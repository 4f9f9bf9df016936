"""Scenarios C12-C17: retries, errors, poison messages, undecodable bodies, unknown tasks."""

from __future__ import annotations

import time
import uuid

from ackwise.spi import Outgoing
from ackwise_conformance._case_helpers import is_early
from ackwise_conformance._registry import EARLY, LATE, scenario
from ackwise_conformance.harness import (
    Harness,
    WorkerHandle,
    expect,
)
from ackwise_conformance.helpers import eventually
from ackwise_conformance.workload import BACKOFF, BACKOFF_MAX, MAX_DELIVERIES


@scenario("C12", "retry with backoff (fails 3x, then succeeds)")
def c12(h: Harness) -> None:
    h.publish(["flaky"], {"fail_times": 3})
    h.worker(pool="threads", concurrency=1)
    h.wait_for("end", key="flaky")
    h.drain()
    hist = h.history()
    fate = hist.by_key("flaky")
    expect(
        fate.executions == 4 and len(fate.ends) == 1,
        f"expected 4 executions, got {fate.executions}",
        h,
        fate.id,
    )
    fails = h.journal.records(ev="fail", key="flaky")
    starts = fate.starts
    slack = 1.0 * h.scale + 0.5
    for i, (fail, nxt) in enumerate(zip(fails, starts[1:], strict=False)):
        bound = min(BACKOFF_MAX, BACKOFF * 2**i)
        gap = nxt["t"] - fail["t"]
        expect(
            bound - 0.05 <= gap <= bound + slack,
            f"retry {i + 1} came {gap:.3f}s after the failure; the backoff is {bound}s "
            f"(no jitter in the workload; +{slack}s of polling slack allowed, none early)",
            h,
            fate.id,
        )
    hist.expect_broker_settled(dead=0)


@scenario("C13", "non-retryable error")
def c13(h: Harness) -> None:
    h.publish(["fatal"], {"fatal": True})
    h.worker(pool="threads", concurrency=1)
    eventually(lambda: h.stats().dead == 1, h.patience, description="the dead letter")
    h.drain()
    hist = h.history()
    hist.expect_dead("fatal", "failed", executions=1)
    hist.expect_broker_settled(dead=1)


@scenario("C14", "poison message that kills its executor (max_deliveries 3)")
def c14(h: Harness) -> None:
    h.require_processes("prefork executor processes")
    h.worker(pool="prefork", concurrency=1)
    h.publish(["poison"], {"crash": "executor"})
    if is_early(h):
        h.wait_for("crash", key="poison")
        h.publish(["after"])
        h.wait_for("end", key="after")
        h.quiet(h.lease * 1.5)
        h.drain()
        hist = h.history()
        hist.expect_lost("poison")
        hist.expect_broker_settled(dead=0)
        return
    eventually(lambda: h.stats().dead == 1, h.patience, description="the dead letter")
    h.drain()
    hist = h.history()
    if h.mode is LATE:
        hist.expect_dead("poison", "worker_lost", executions=1)
    else:
        hist.expect_dead("poison", "max_deliveries", executions=MAX_DELIVERIES)
    hist.expect_broker_settled(dead=1)


@scenario("C15", "poison message that kills the whole worker (max_deliveries 3)", cost=9)
def c15(h: Harness) -> None:
    h.require_processes()
    h.publish(["poison"], {"crash": "worker", "pool": "threads"})
    deadline = time.monotonic() + h.patience * 3
    workers_started = 0
    while time.monotonic() < deadline:
        # Not waiting for "ready": the poison may kill it before the harness looks.
        w = h.worker(pool="threads", concurrency=1, wait_ready=False)
        workers_started += 1

        def died_or_settled(w: WorkerHandle = w) -> bool:
            if not w.alive() or h.stats().dead >= 1:
                return True
            return is_early(h) and h.journal.count(ev="crash") >= 1 and h.settled()

        eventually(
            died_or_settled, h.patience, description="the worker to die or the poison to settle"
        )
        if w.alive():
            break
        w.wait(5)
        if is_early(h) and h.journal.count(ev="crash") >= 1:
            h.worker(pool="threads", concurrency=1)
            h.quiet(h.lease * 1.5)
            break
        expect(
            workers_started <= MAX_DELIVERIES + 2,
            f"the poison message killed {workers_started} workers: crash loop",
        )
    h.drain()
    hist = h.history()
    if is_early(h):
        hist.expect_lost("poison")
        hist.expect_broker_settled(dead=0)
    else:
        hist.expect_dead("poison", "max_deliveries", executions=MAX_DELIVERIES)
        hist.expect_broker_settled(dead=1)


@scenario("C16", "undecodable body and unknown task")
def c16(h: Harness) -> None:
    garbage_id, unknown_id = f"garbage-{uuid.uuid4().hex}", f"unknown-{uuid.uuid4().hex}"
    unknown = (
        b'{"v":1,"id":"' + unknown_id.encode() + b'","task":"conformance.no_such_task",'
        b'"queue":"' + h.queue.encode() + b'","created_at":1.0}'
    )
    h.adapter.publish(
        h.queue, [Outgoing(garbage_id, b"\xff\x00 not an envelope"), Outgoing(unknown_id, unknown)]
    )
    h.publish(["after"])
    # An unknown task is offered again a few times (rolling deploys), then dead-lettered.
    h.worker(pool="threads", concurrency=1, extra_args=["--unknown-task-delay", str(h.t(0.2))])
    h.wait_for("end", key="after")
    eventually(lambda: h.stats().dead == 2, h.patience, description="two dead letters")
    h.drain()
    reasons = {d.message_id: d.reason for d in h.dead_letters()}
    expect(reasons.get(garbage_id) == "decode_error", f"garbage body: dead letters {reasons}")
    expect(reasons.get(unknown_id) == "unknown_task", f"unknown task: dead letters {reasons}")
    bodies = {d.message_id: d.body for d in h.dead_letters()}
    expect(bodies[garbage_id] == b"\xff\x00 not an envelope", "the undecodable body was not kept")
    h.history().expect_ok_once(["after"])


@scenario(
    "C17",
    "dead-letter replay",
    na_modes={EARLY: "no EARLY cell in the catalogue"},
)
def c17(h: Harness) -> None:
    from ackwise import decode_envelope
    from ackwise.cli import main as ackwise_cli

    [mid] = h.publish(["buggy"], {"fatal_unless_gate": "fixed"}, headers={"trace": "t-17"})
    h.worker(pool="threads", concurrency=1)
    eventually(lambda: h.stats().dead == 1, h.patience, description="the dead letter")
    [dead] = h.dead_letters()
    env = decode_envelope(dead.body)
    expect(dead.message_id == mid and dead.reason == "failed", f"dead letter {dead}", h, mid)
    expect(
        env.args[0] == "buggy" and env.headers == {"trace": "t-17"},
        f"body or headers not preserved: {env}",
        h,
        mid,
    )
    expect(
        [a.outcome for a in env.history] == ["failed"] and env.history[0].error,
        f"attempt history not preserved: {env.history}",
        h,
        mid,
    )
    h.open_gate("fixed")  # the bug is fixed; replay it
    replay = ["dlq", "replay", "--broker", h.broker.url, "-Q", h.queue, "--id", mid]
    expect(ackwise_cli(replay) == 0, "ackwise dlq replay failed")
    expect(ackwise_cli(replay) == 0, "a second ackwise dlq replay failed")  # finds nothing
    h.wait_for("end", key="buggy")
    h.drain()
    h.quiet(h.lease)
    hist = h.history()
    fate = hist.by_key("buggy")
    expect(
        len(fate.ends) == 1 and fate.executions == 2,
        "the replayed message must run exactly once",
        h,
        mid,
    )
    hist.expect_broker_settled(dead=0)
