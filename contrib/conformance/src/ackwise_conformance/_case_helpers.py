"""Helpers the scenario modules share."""

from __future__ import annotations

import signal
import time
from typing import Any

from ackwise_conformance._registry import EARLY
from ackwise_conformance.harness import (
    Harness,
    ScenarioFailed,
)
from ackwise_conformance.helpers import eventually


# -- helpers -----------------------------------------------------------------------------------
def is_early(h: Harness) -> bool:
    return h.mode is EARLY


def numbered(prefix: str, n: int) -> list[str]:
    return [f"{prefix}{i}" for i in range(n)]


def executor_pid(h: Harness, key: str, attempt: int = 1) -> int:
    [rec] = h.wait_for("start", key=key, attempt=attempt)[:1]
    return int(rec["pid"])


def pause_outside_writes(h: Harness, process: Any, probe_timeout: float, name: str) -> None:
    """SIGSTOP ``process`` at a moment it holds no write transaction of its store.

    A process frozen inside a SQLite write transaction freezes every writer of the file until
    it runs again: no other worker can take the paused one's messages, nor even start.  That
    is a property of an embedded store, not of the contract the scenario is about, so where a
    probe write cannot get through within ``probe_timeout``, the process is resumed for a
    moment and stopped again.

    An adapter of a broker over the network must hold no lock of the broker's past one round
    trip (docs/conformance.md#a-frozen-client-holds-no-lock), so a frozen client of one keeps
    nothing from the others and is stopped once, without a probe: there a probe slower than
    its timeout (SQS on a loaded machine) would only resume the process in slices, until its
    lease lapsed and its own receive took the redelivery the scenario waits for another worker
    to run.  An adapter that breaks the rule is named by the redelivery's wait
    (:func:`~ackwise_conformance._held_lock.await_redelivery`), not hidden by a probe.
    """
    if h.broker.host is not None:
        process.signal(signal.SIGSTOP)
        eventually(process.stopped, 5.0, description=f"{name} to stop")
        return
    for _ in range(50):
        process.signal(signal.SIGSTOP)
        eventually(process.stopped, 5.0, description=f"{name} to stop")
        if h.write_gets_through(probe_timeout):
            return
        process.signal(signal.SIGCONT)
        time.sleep(0.02)
    raise ScenarioFailed(f"{name} could not be paused outside a write transaction")
