"""A broker node dies in the middle of a late-ack drain; a replica takes over: nothing may be
lost, and every message that runs twice must have been taken before the takeover.

For the tests of replicated deployments (a Redis Cluster or Sentinel set, a RabbitMQ cluster):
the caller starts the deployment, builds a :class:`~ackwise_conformance.harness.Harness` on
it, and passes how to kill the node that serves the queue and how to tell that another one
took over.  A message the worker held when its node died (taken on the dead connection, run or
not, its ack gone nowhere) runs again: at least once allows that.  One first run after the
takeover has no such excuse.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

from ackwise.errors import TransientAdapterError
from ackwise_conformance.checker import History
from ackwise_conformance.harness import Harness
from ackwise_conformance.helpers import eventually

__all__ = ["FailoverOutcome", "kill_mid_drain"]


@dataclass(frozen=True)
class FailoverOutcome:
    killed_at: float  # wall clock (the journal's)
    failed_over_at: float  # when ``failed_over()`` first held
    summary: dict[str, int]  # the checker's count of messages by fate

    @property
    def takeover(self) -> float:
        return self.failed_over_at - self.killed_at


def kill_mid_drain(
    harness: Harness,
    kill: Callable[[], None],
    failed_over: Callable[[], bool],
    *,
    tasks: int = 600,
    kill_after: int = 150,
    takeover_timeout: float = 60.0,
) -> FailoverOutcome:
    """Publish ``tasks`` short tasks, start a worker (threads x4), ``kill()`` once
    ``kill_after`` of them ended, wait for ``failed_over()``, drain, and check the history."""
    keys = [f"k{i}" for i in range(tasks)]
    for i in range(0, tasks, 100):
        harness.publish(keys[i : i + 100], {"sleep": 0.004})
    worker = harness.worker(pool="threads", concurrency=4)
    harness.wait_for("end", count=kill_after)
    killed_at = time.time()
    kill()
    eventually(failed_over, takeover_timeout, interval=0.1, description="another node took over")
    failed_over_at = time.time()
    # The suite's own adapter was idle through the takeover: its first call may still meet
    # the dead node's connection, and reconnects after it.
    eventually(_answers(harness), 60, interval=0.1, description="the broker answers the suite")
    harness.drain(timeout=120)
    if not worker.alive():
        raise AssertionError(
            f"the worker exited instead of reconnecting:\n{worker.output()[-2000:]}"
        )
    history = History.build(harness)
    history.expect_no_unexpected()
    history.expect_completed()  # nothing lost
    late = [
        f
        for f in history.fates.values()
        if len(f.starts) > 1 and min(s["t"] for s in f.starts) > failed_over_at
    ]
    if late:
        history.fail("a message first run after the takeover ran more than once", *late)
    history.expect_broker_settled(dead=0)
    return FailoverOutcome(killed_at, failed_over_at, history.summary())


def _answers(harness: Harness) -> Callable[[], bool]:
    def answers() -> bool:
        try:
            harness.stats()
        except TransientAdapterError:
            return False
        return True

    return answers
