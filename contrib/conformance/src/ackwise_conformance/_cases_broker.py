"""Scenarios C18-C24: the broker cut off and restarted, fairness, exclusive delivery,
idempotent publish, publish errors."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from ackwise.errors import MessageTooLarge, NotSerializable, PublishError
from ackwise_conformance._case_helpers import executor_pid, is_early, numbered
from ackwise_conformance._registry import ROL, scenario
from ackwise_conformance.brokers import NotRestartable
from ackwise_conformance.harness import (
    Harness,
    NotApplicable,
    ScenarioFailed,
    expect,
)
from ackwise_conformance.helpers import eventually


def _proxied_workers(h: Harness, fault: Callable[[Any], None]) -> None:
    from ackwise_conformance.proxy import FaultProxy

    if h.broker.host is None or h.broker.port is None:
        why = (
            "its client connects to more than the URL's address"
            if not getattr(h.broker, "proxied", True)
            else "embedded broker"
        )
        raise NotApplicable(f"broker {h.broker.name} has no network connection to cut ({why})")
    with FaultProxy(h.broker.host, h.broker.port).start() as proxy:
        url = h.broker.url_via("127.0.0.1", proxy.port)
        keys = numbered("m", 200)
        h.publish(keys, {"sleep": 0.01})
        prefetch = 4
        h.worker(pool="threads", concurrency=2, prefetch=prefetch, url=url)
        h.worker(pool="threads", concurrency=2, prefetch=prefetch, url=url)
        h.wait_for("end", count=20)
        fault(proxy)
        h.drain(h.patience * 3)
    hist = h.history()
    in_flight_bound = 2 * prefetch
    if is_early(h):
        lost = hist.count("lost")
        expect(lost <= in_flight_bound, f"EARLY: {lost} lost, at most {in_flight_bound} may be")
        hist.expect_no_duplicates()
    else:
        hist.expect_completed(keys, max_dup=in_flight_bound)
    hist.expect_broker_settled()


@scenario("C18", "broker connection cut mid-run (TCP proxy resets connections)")
def c18(h: Harness) -> None:
    _proxied_workers(h, lambda proxy: proxy.reset(duration=h.t(3.0)))


@scenario("C19", "broker restart mid-run (suite-owned broker, durable config)", exclusive=True)
def c19(h: Harness) -> None:
    keys = numbered("m", 200)
    h.publish(keys, {"sleep": 0.01})
    h.worker(pool="threads", concurrency=2, prefetch=4)
    h.wait_for("end", count=20)
    try:
        h.broker.restart()
    except NotRestartable as exc:
        raise NotApplicable(f"broker {h.broker.name}: {exc.reason}") from None
    h.drain(h.patience * 3)
    hist = h.history()
    if is_early(h):
        hist.expect_no_duplicates()
    else:
        hist.expect_completed(keys, max_dup=8)
    hist.expect_broker_settled()


@scenario("C20", "prefetch 1 fairness: one long task and 20 short ones, 2 workers", cost=17)
def c20(h: Harness) -> None:
    h.worker(pool="threads", concurrency=1, prefetch=1)
    h.publish(["long"], {"gate": "long"})
    h.wait_for("start", key="long")
    h.worker(pool="threads", concurrency=1, prefetch=1)
    short = numbered("short", 20)
    h.publish(short)
    # All short tasks finish on the free worker while the long one still runs.
    eventually(
        lambda: all(h.journal.count(ev="end", key=k) for k in short),
        h.patience,
        description="the 20 short tasks to finish while the long one runs",
    )
    expect(not h.journal.records(ev="end", key="long"), "the long task ended early")
    h.open_gate("long")
    h.wait_for("end", key="long")
    h.drain()
    hist = h.history()
    hist.expect_ok_once()
    hist.expect_broker_settled(dead=0)


@scenario("C21", "exclusive delivery: 4 workers, 5,000 messages, lease >> task", cost=25)
def c21(h: Harness) -> None:
    keys = numbered("m", 5000)
    for i in range(0, len(keys), 1000):
        h.publish(keys[i : i + 1000])
    for _ in range(4):
        h.worker(pool="threads", concurrency=2, lease=h.t(30.0), wait_ready=False)
    for w in h.workers:
        w.wait_ready(h.patience * 2)
    h.drain(h.patience * 4)
    hist = h.history()
    hist.expect_no_duplicates()
    hist.expect_ok_once()
    # No fault and lease >> task: a message that came back was returned by the adapter
    # itself (RabbitMQ's quorum queues count that as a delivery, toward the dead letters).
    hist.expect_first_deliveries()
    hist.expect_broker_settled(dead=0)


@scenario("C22", "duplicate publish with the same idempotency key", cost=13)
def c22(h: Harness) -> None:
    key = {"idempotency_key": h.idempotency_key("order")}
    h.publish(["dup-a"], headers=key)
    h.publish(["dup-b"], headers=key)
    h.worker(pool="threads", concurrency=2)
    h.drain()
    h.quiet(h.lease * 0.5)
    ends = h.journal.records(ev="end", key="dup-a") + h.journal.records(ev="end", key="dup-b")
    expect(len(ends) == 1, f"two publishes with one idempotency key had {len(ends)} effects")
    h.history().expect_broker_settled(dead=0)
    if h.mode is not ROL or not h.multi_process:
        return
    # The first execution is killed mid-run; the requeued delivery takes the key over.  The
    # first half's threads workers stop first: the victim must run in a prefork child (a
    # threads worker would take it half the time, and killing "the executor" would kill it).
    for w in list(h.workers):
        w.terminate()
        w.wait(h.patience)
    key2 = {"idempotency_key": h.idempotency_key("order")}
    h.worker(pool="prefork", concurrency=1)
    h.publish(["victim"], {"gate": "victim"}, headers=key2)
    child = executor_pid(h, "victim")
    h.open_gate("victim-2")
    h.kill_pid(child)
    h.wait_for("end", key="victim", attempt=2)
    h.publish(["victim-dup"], headers=key2)
    h.drain()
    h.quiet(h.lease * 0.5)
    ends = h.journal.records(ev="end", key="victim") + h.journal.records(ev="end", key="victim-dup")
    expect(len(ends) == 1, f"one idempotency key, a killed first run: {len(ends)} effects")
    h.history().expect_broker_settled(dead=0)


@scenario("C23", "publish to a missing / misconfigured queue")
def c23(h: Harness) -> None:
    try:
        h.task.apply_async(("k", {}), queue="no such queue!")
    except PublishError as exc:
        expect("invalid queue name" in str(exc), f"unclear error: {exc}")
    else:
        raise ScenarioFailed("publishing to an invalid queue name did not raise")
    st = h.stats()
    expect(st.ready == 0, f"something was published: {st}")
    # A queue nobody consumes yet keeps the message until a worker comes.
    h.publish(["waiting"])
    h.quiet(h.lease)
    expect(h.stats().ready == 1, "a message without a consumer was dropped")
    h.worker(pool="threads", concurrency=1)
    h.drain()
    h.history().expect_ok_once(["waiting"])


@scenario("C24", "oversize payload, non-serializable argument")
def c24(h: Harness) -> None:
    try:
        h.task.apply_async(("k", {"when": object()}))
    except NotSerializable as exc:
        expect("kwargs" in str(exc) or "args" in str(exc), f"the error names no path: {exc}")
    else:
        raise ScenarioFailed("a non-serializable argument was accepted")
    limit = h.capabilities.max_message_size
    if limit is not None:
        try:
            h.task.apply_async(("k", {"blob": "x" * (limit + 1)}))
        except MessageTooLarge as exc:
            expect(str(limit) in str(exc), f"the error does not say the limit: {exc}")
        else:
            raise ScenarioFailed(f"a payload over the {limit}-byte limit was accepted")
    st = h.stats()
    expect((st.ready, st.delayed, st.in_flight) == (0, 0, 0), f"something was published: {st}")
