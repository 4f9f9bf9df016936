"""The crash-scenario catalogue, one function per scenario (ids C01-C28, B01-B04).

Each scenario drives a :class:`~ackwise_conformance.harness.Harness` for one delivery mode and
raises :class:`ScenarioFailed` when the adapter breaks the delivery contract (docs/semantics.md),
:class:`NotApplicable` when the adapter cannot express it (naming the missing capability) and
:class:`Pending` when it needs a part of ackwise that is not built yet.
"""

from __future__ import annotations

import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ackwise import Ack
from ackwise.errors import ConfigurationError

# The catalogue: importing its modules registers their scenarios in SCENARIOS (a registry
# of its own below them, whose names are importable from here too).
from ackwise_conformance import (
    _cases_beat,
    _cases_broker,
    _cases_failure,
    _cases_results,
    _cases_worker,
)
from ackwise_conformance._registry import ALL as ALL
from ackwise_conformance._registry import EARLY as EARLY
from ackwise_conformance._registry import LATE as LATE
from ackwise_conformance._registry import ROL as ROL
from ackwise_conformance._registry import SCENARIOS, Scenario
from ackwise_conformance._registry import scenario as scenario
from ackwise_conformance.harness import (
    DEFAULT_PREFIX,
    LEASE,
    Broker,
    Harness,
    NotApplicable,
    Pending,
    ScenarioFailed,
    with_lease_options,
)

__all__ = ["SCENARIOS", "CaseResult", "Scenario", "cases", "run_case"]

_CATALOGUE = (_cases_worker, _cases_failure, _cases_broker, _cases_results, _cases_beat)
# In catalogue order (C01-C28, then B01-B04), whatever order the modules were imported in.
_ordered = sorted(SCENARIOS.items(), key=lambda item: (not item[0].startswith("C"), item[0]))
SCENARIOS.clear()
SCENARIOS.update(_ordered)


def cases(
    scenario_ids: list[str] | None = None, modes: list[Ack] | None = None
) -> list[tuple[str, Ack | None]]:
    """Every (scenario id, mode) pair of the catalogue, optionally filtered."""
    out: list[tuple[str, Ack | None]] = []
    for sid, sc in SCENARIOS.items():
        if scenario_ids and sid not in scenario_ids:
            continue
        for mode in sc.modes:
            if modes and mode is not None and mode not in modes:
                continue
            out.append((sid, mode))
    return out


@dataclass
class CaseResult:
    scenario: str
    mode: Ack | None
    status: str  # pass, fail, n/a, pending
    reason: str = ""
    duration: float = 0.0

    def as_dict(self) -> dict[str, Any]:
        return {
            "scenario": self.scenario,
            "title": SCENARIOS[self.scenario].title,
            "mode": self.mode.name if self.mode else None,
            "status": self.status,
            "reason": self.reason,
            "duration": round(self.duration, 3),
        }


def run_case(
    broker: Broker,
    scenario_id: str,
    mode: Ack | None,
    workdir: Path,
    *,
    time_scale: float = 1.0,
    prefix: str = DEFAULT_PREFIX,
    opened: Callable[[Harness], None] | None = None,
) -> CaseResult:
    """Run one case; never raises for a verdict (pass / fail / n/a / pending).

    :param prefix: what the names of the case's queues and keys start with.
    :param opened: called with the case's harness as soon as it exists (a runner that may
        have to close it from another thread: an interrupt, a case past its time).
    """
    sc = SCENARIOS[scenario_id]
    start = time.monotonic()
    if mode is not None and mode in sc.na_modes:
        return CaseResult(scenario_id, mode, "n/a", sc.na_modes[mode])
    harness: Harness | None = None
    try:
        harness = Harness(
            with_lease_options(broker, LEASE * time_scale),
            mode,
            workdir / f"{scenario_id}-{mode.name if mode else 'any'}",
            time_scale=time_scale,
            prefix=prefix,
        )
        if opened is not None:
            opened(harness)
        sc.fn(harness)
        status, reason = "pass", ""
    except NotApplicable as exc:
        status, reason = "n/a", str(exc)
    except ConfigurationError as exc:  # e.g. a URL whose heartbeat outlasts the leases
        status, reason = "fail", str(exc)
    except Pending as exc:
        status, reason = "pending", str(exc)
    except (ScenarioFailed, AssertionError) as exc:
        status, reason = "fail", str(exc)
        if harness is not None:
            reason += _worker_logs(harness)
    except Exception as exc:
        status, reason = "fail", "".join(traceback.format_exception(exc))
        if harness is not None:
            reason += _worker_logs(harness)
    finally:
        if harness is not None:
            harness.close()
    return CaseResult(scenario_id, mode, status, reason, time.monotonic() - start)


def _worker_logs(h: Harness) -> str:
    out = ""
    for w in h.workers:
        text = _without_task_lines(w.output())
        if text:
            out += f"\n--- worker {w.index} log (tail) ---\n" + text[-2000:]
    for b in h.beats:
        text = b.output()
        if text:
            out += f"\n--- beat {b.index} (pid {b.pid}) log (tail) ---\n" + text[-2000:]
    return out


def _without_task_lines(text: str) -> str:
    """A worker's log without its routine task lines (started, succeeded…: the journal has
    them all), so that the tail shows what went wrong: broker errors, stale receipts."""
    kept, dropped = [], 0
    for line in text.splitlines(keepends=True):
        if " INFO ackwise.task: " in line or " DEBUG ackwise.task: " in line:
            dropped += 1
        else:
            kept.append(line)
    return "".join(kept) + (f"({dropped} INFO task lines left out)\n" if dropped else "")
