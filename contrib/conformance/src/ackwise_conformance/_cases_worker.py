"""Scenarios C01-C11: workers killed, stopped, paused past their lease; leases renewed; delays."""

from __future__ import annotations

import signal
import time
from typing import Any

from ackwise_conformance._case_helpers import executor_pid, is_early, numbered, pause_outside_writes
from ackwise_conformance._held_lock import await_redelivery
from ackwise_conformance._registry import EARLY, LATE, ROL, scenario
from ackwise_conformance.harness import (
    Harness,
    expect,
)
from ackwise_conformance.helpers import eventually


# -- C01-C24 ------------------------------------------------------------------------------------
@scenario("C01", "happy path, 1,000 messages, 2 workers")
def c01(h: Harness) -> None:
    keys = numbered("m", 1000)
    h.publish(keys)
    h.worker(pool="threads", concurrency=4)
    h.worker(pool="threads", concurrency=4)
    h.drain()
    hist = h.history()
    hist.expect_ok_once()
    hist.expect_no_unexpected()
    hist.expect_broker_settled(dead=0)


@scenario("C02", "kill the executor child mid-task (prefork)", cost=8)
def c02(h: Harness) -> None:
    h.require_processes("prefork executor processes")
    w = h.worker(pool="prefork", concurrency=1)
    h.publish(["victim"], {"gate": "victim"})
    child = executor_pid(h, "victim")
    expect(child != w.pid, "the task must run in an executor child, not the worker")
    h.kill_pid(child)
    if h.mode is ROL:
        h.wait_for("start", key="victim", attempt=2)
        h.open_gate("victim")
    elif h.mode is LATE:
        eventually(lambda: h.stats().dead == 1, h.patience, description="the dead letter")
    else:
        h.quiet(h.t(1.0))
    h.publish(numbered("bystander", 3))
    h.drain()
    hist = h.history()
    hist.expect_ok_once(numbered("bystander", 3))
    if h.mode is EARLY:
        hist.expect_lost("victim")
        hist.expect_broker_settled(dead=0)
    elif h.mode is LATE:
        hist.expect_dead("victim", "worker_lost", executions=1)
        hist.expect_broker_settled(dead=1)
    else:
        fate = hist.by_key("victim")
        expect(
            fate.executions == 2 and len(fate.ends) == 1,
            "REJECT_ON_LOST: expected one re-run that completes",
            h,
            fate.id,
        )
        hist.expect_broker_settled(dead=0)


def _holds(h: Harness, n: int) -> bool:
    """The one worker holds the ``n`` deliveries the broker counts in flight: all that was
    published is taken (where the broker counts only its own connection's, nothing is ready)."""
    st = h.stats()
    return st.ready == 0 and (st.in_flight == n or not h.counts_in_flight)


def _kill_worker_mid_task(h: Harness, *, prefetch: int | None, others: int) -> None:
    w1 = h.worker(pool="threads", concurrency=1, prefetch=prefetch)
    h.publish(["victim"], {"gate": "victim"})
    rest = numbered("other", others)
    if rest:
        h.publish(rest)
    h.wait_for("start", key="victim", attempt=1)
    if prefetch:
        held = prefetch - (1 if is_early(h) else 0)
        eventually(
            lambda: _holds(h, held),
            h.patience,
            description=f"the worker to hold {held} messages",
        )
    w1.kill()
    h.open_gate("victim-2")  # only a redelivery may finish
    h.worker(pool="threads", concurrency=1)
    if is_early(h):
        h.drain()
        h.quiet(h.lease * 1.5)
    else:
        h.wait_for("end", key="victim", attempt=2)
        h.drain()
    hist = h.history()
    if is_early(h):
        hist.expect_lost("victim")
    else:
        hist.expect_ok_once(["victim"])
    hist.expect_ok_once(rest)
    hist.expect_broker_settled(dead=0)


@scenario("C03", "kill the whole worker mid-task")
def c03(h: Harness) -> None:
    h.require_processes()
    _kill_worker_mid_task(h, prefetch=None, others=0)


@scenario("C04", "kill a worker holding prefetched messages (prefetch 10)")
def c04(h: Harness) -> None:
    h.require_processes()
    _kill_worker_mid_task(h, prefetch=10, others=9)


@scenario("C05", "graceful shutdown with prefetched messages", cost=10)
def c05(h: Harness) -> None:
    long_lease = h.t(30.0)
    w1 = h.worker(pool="threads", concurrency=1, prefetch=10, lease=long_lease)
    h.publish(["victim"], {"gate": "victim"})
    rest = numbered("other", 9)
    h.publish(rest)
    h.wait_for("start", key="victim")
    running = 0 if is_early(h) else 1
    eventually(
        lambda: _holds(h, 9 + running),
        h.patience,
        description="the worker to hold 10 messages",
    )
    w1.terminate()
    # Returned at once: well before the lease could have expired.
    eventually(
        lambda: h.stats().ready == 9,
        min(h.t(3.0), long_lease / 3),
        description="the 9 prefetched messages to be returned at once",
    )
    h.open_gate("victim")
    status = w1.wait(h.patience)
    expect(status in (0, None), f"graceful stop should exit 0, got {status}")
    h.worker(pool="threads", concurrency=2)
    h.drain()
    hist = h.history()
    hist.expect_ok_once(["victim", *rest])
    hist.expect_broker_settled(dead=0)


@scenario("C06", "grace period exceeded", cost=15)
def c06(h: Harness) -> None:
    h.require_processes()
    w1 = h.worker(pool="prefork", concurrency=1, grace=h.t(0.5))
    h.publish(["victim"], {"gate": "victim"})
    h.wait_for("start", key="victim")
    w1.terminate()
    status = w1.wait(h.patience)
    expect(status == 1, f"a cold stop exits 1, got {status}")
    h.open_gate("victim-2")
    h.worker(pool="threads", concurrency=1)
    if is_early(h):
        h.quiet(h.lease * 1.5)
    else:
        h.wait_for("end", key="victim", attempt=2)
    h.drain()
    hist = h.history()
    if is_early(h):
        hist.expect_lost("victim")
    else:
        hist.expect_ok_once(["victim"])
    hist.expect_broker_settled(dead=0)


def _pause_past_lease(h: Harness) -> tuple[Any, Any, int]:
    """C07's first half: A runs the victim, is paused past its lease, B takes it over.

    Returns the workers and the attempt A runs: 1, unless A's loop was held up past the
    lease before the task could start (a loaded host), in which case A declines that
    delivery as stale and runs the next one.
    """
    a = h.worker(pool="prefork", concurrency=1)
    h.publish(["victim"], {"gate": "victim"})
    n = int(h.wait_for("start", key="victim")[0]["attempt"])
    pause_outside_writes(h, a, 0.5, f"worker {a.index}")
    try:
        b = h.worker(pool="prefork", concurrency=1)  # B renews its own lease while it lives
        if is_early(h):
            h.quiet(h.lease * 2.5)
            expect(
                not h.journal.records(ev="start", key="victim", attempt=n + 1),
                "EARLY: a paused worker's task must not run again",
            )
        else:
            # A lock A's connection holds would keep the victim from B for as long as A is
            # frozen: await_redelivery tells that apart from a lost delivery.
            await_redelivery(h, a, "victim", n + 1)
            h.open_gate(f"victim-{n}")  # A's execution may finish now, B's may not
            h.wait_for("end", key="victim", attempt=n)
    finally:
        a.signal(signal.SIGCONT)
    return a, b, n


def _expect_stale_ack_refused(h: Harness, a: Any) -> None:
    """After SIGCONT, A settles its execution with a stale receipt: B's delivery must stay.

    Where the broker counts the deliveries of every consumer, B's must still be in flight
    after A's ack.  Where it counts only the suite's own (RabbitMQ without its management
    API), B's own settlement proves it later: C07 checks that B's ack is not refused as
    stale, C08 that the message comes a third time after B dies.
    """
    eventually(
        lambda: "stale receipt" in a.output() or (h.counts_in_flight and h.stats().in_flight != 1),
        h.patience,
        description="the resumed worker to settle its execution (stale receipt)",
    )
    if h.counts_in_flight:
        st = h.stats()
        expect(
            st.in_flight == 1,
            f"the paused worker's late ack removed the newer delivery (broker now says {st}): "
            "a stale receipt must change nothing",
        )
    expect("stale receipt" in a.output(), "the paused worker's stale ack was not reported")


@scenario("C07", "pause past the lease (SIGSTOP, then SIGCONT)", cost=20)
def c07(h: Harness) -> None:
    h.require_processes()
    a, b, n = _pause_past_lease(h)
    if is_early(h):
        h.open_gate("victim")
        h.wait_for("end", key="victim")
        h.drain()
        hist = h.history()
        hist.expect_ok_once(["victim"])
        hist.expect_broker_settled(dead=0)
        return
    _expect_stale_ack_refused(h, a)
    h.open_gate(f"victim-{n + 1}")
    h.wait_for("end", key="victim", attempt=n + 1)
    h.drain()
    h.quiet(h.t(0.25))  # B's late ack goes a moment after its task ended
    expect(
        "stale receipt" not in b.output(),
        "the newer delivery's own ack was refused as stale: the paused worker's late ack "
        "removed it (a stale receipt must change nothing)",
    )
    hist = h.history()
    hist.expect_completed(["victim"], max_dup=1)
    hist.expect_broker_settled(dead=0)


@scenario(
    "C08",
    "stale ack must not remove a newer delivery",
    na_modes={EARLY: "no EARLY cell: an early ack leaves no late receipt to go stale"},
    cost=22,
)
def c08(h: Harness) -> None:
    h.require_processes()
    a, b, n = _pause_past_lease(h)
    _expect_stale_ack_refused(h, a)
    b.kill()  # the second worker dies mid-task: the message must come a third time
    h.open_gate(f"victim-{n + 2}")
    h.worker(pool="threads", concurrency=1)
    h.wait_for("end", key="victim", attempt=n + 2)
    h.drain()
    hist = h.history()
    hist.expect_completed(["victim"], max_dup=1)
    hist.expect_broker_settled(dead=0)


@scenario("C09", "long task, short lease, auto-renewal (task 4x the lease)", cost=10)
def c09(h: Harness) -> None:
    h.publish(["long"], {"sleep": h.lease * 4})
    h.worker(pool="threads", concurrency=1)
    h.worker(pool="threads", concurrency=1)
    h.wait_for("end", key="long", timeout=h.lease * 4 + h.patience)
    h.quiet(h.lease)
    h.drain()
    hist = h.history()
    hist.expect_no_duplicates()
    hist.expect_ok_once()
    hist.expect_broker_settled(dead=0)


@scenario("C10", "delay longer than the lease (countdown 5x the lease)")
def c10(h: Harness) -> None:
    countdown = h.lease * 5
    h.worker(pool="threads", concurrency=1)  # ready first: as C11 says
    sent = time.time()
    h.publish(["later"], countdown=countdown)
    [rec] = h.wait_for("start", key="later", timeout=countdown + h.patience)[:1]
    expect(
        rec["t"] >= sent + countdown - 0.05,
        f"ran {sent + countdown - rec['t']:.3f}s before its countdown",
    )
    h.drain()
    hist = h.history()
    hist.expect_ok_once()
    hist.expect_broker_settled(dead=0)


@scenario("C11", "delay survives a worker restart")
def c11(h: Harness) -> None:
    countdown = h.lease * 3
    # The worker is ready before the message is sent: one started after it would find the
    # countdown over on a slow host, and an adapter that ignores delays would go unseen.
    w1 = h.worker(pool="threads", concurrency=1)
    sent = time.time()
    h.publish(["later"], countdown=countdown)
    h.quiet(h.lease)
    w1.terminate()
    w1.wait(h.patience)
    h.worker(pool="threads", concurrency=1)
    [rec] = h.wait_for("start", key="later", timeout=countdown + h.patience)[:1]
    expect(rec["t"] >= sent + countdown - 0.05, "ran before its countdown")
    h.drain()
    hist = h.history()
    hist.expect_ok_once()
    hist.expect_broker_settled(dead=0)
