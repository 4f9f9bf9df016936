"""Helpers the scenario modules share."""

from __future__ import annotations

import signal
import time
from collections.abc import Callable
from typing import Any

from ackwise_conformance.harness import (
    Harness,
    ScenarioFailed,
)
from ackwise_conformance.helpers import eventually
from ackwise_conformance.scenarios import EARLY


# -- helpers -----------------------------------------------------------------------------------
def is_early(h: Harness) -> bool:
    return h.mode is EARLY


def numbered(prefix: str, n: int) -> list[str]:
    return [f"{prefix}{i}" for i in range(n)]


def executor_pid(h: Harness, key: str, attempt: int = 1) -> int:
    [rec] = h.wait_for("start", key=key, attempt=attempt)[:1]
    return int(rec["pid"])


def pause_outside_writes(process: Any, write_gets_through: Callable[[], bool], name: str) -> None:
    """SIGSTOP ``process`` at a moment it holds no write transaction of its store.

    A process frozen inside a SQLite write transaction freezes every writer of the file until
    it runs again: no other worker can take the paused one's messages, nor even start.  That
    is a property of an embedded store, not of the contract the scenario is about, so where a
    probe write cannot get through, the process is resumed for a moment and stopped again.
    """
    for _ in range(50):
        process.signal(signal.SIGSTOP)
        eventually(process.stopped, 5.0, description=f"{name} to stop")
        if write_gets_through():
            return
        process.signal(signal.SIGCONT)
        time.sleep(0.02)
    raise ScenarioFailed(f"{name} could not be paused outside a write transaction")
