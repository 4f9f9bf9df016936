"""Scenario C25: task results under redelivery (docs/results.md)."""

from __future__ import annotations

import json
import signal

from ackwise import BrokerURL, get_plugins, open_result_store
from ackwise_conformance.harness import Harness, expect
from ackwise_conformance.helpers import eventually
from ackwise_conformance.result_faults import crashing
from ackwise_conformance.scenarios import EARLY, scenario


def result_store_url(h: Harness) -> str:
    """The broker's own result store where its adapter has one, else a SQLite file of the
    case (the workers share the host)."""
    if get_plugins().adapters.result_store(BrokerURL.parse(h.broker.url).scheme) is not None:
        return h.broker.url
    return f"sqlite:///{h.workdir / 'results.db'}"


@scenario(
    "C25",
    "a result is written once under redelivery (killed after the store write, before the ack)",
    cost=6,
)
def c25(h: Harness) -> None:
    h.require_processes("worker processes")
    store_url = result_store_url(h)
    first = h.worker(
        pool="threads",
        env={
            "ACKWISE_CONFORMANCE_RESULT_STORE": crashing(store_url),
            "ACKWISE_PLUGINS": "ackwise_conformance.result_faults",
        },
    )
    [mid] = h.publish(["victim"])
    # Its store SIGKILLs the worker right after the success is written: the ack never goes.
    eventually(lambda: not first.alive(), h.patience, description="the first worker's death")
    expect(
        first.wait(h.t(1.0)) == -signal.SIGKILL,
        "the first worker must die by SIGKILL, in its result store's put",
        h,
    )
    store = open_result_store(store_url)
    try:
        stored = store.get(mid)
        expect(
            stored is not None and stored.state == "succeeded",
            f"the first execution's success must be stored before the ack; found {stored}",
            h,
            mid,
        )
        assert stored is not None
        h.worker(pool="threads", env={"ACKWISE_CONFORMANCE_RESULT_STORE": store_url})
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
