"""Classify every message of a soak run, and explain each anomaly by a fault the soak injected.

The input is one run's journal (``bench/soak.py`` writes it): the workload's ``start`` / ``end``
records (executor pid and ppid), the worker hooks' ``handed`` / ``lost`` / ``dead`` records
(``soak_plugin``), the driver's ``publish-ok``, ``worker-start``, ``worker-exit`` and ``fault``
records; plus the broker's dead-letter store.  Every published message is then

``ok``          completed exactly once (not dead-lettered)
``duplicated``  completed more than once
``dead``        in the dead-letter store (the reason counted)
``lost``        never completed and not dead-lettered

and every anomaly must be explained by an injected fault at that time, else it is a finding:
``UNEXPLAINED`` (no fault accounts for it) or ``VIOLATION`` (the mode's contract forbids it
whatever the faults: an EARLY task run twice, a LATE / REJECT_ON_LOST task lost, a dead-letter
reason the mode never uses).  What counts as "at that time" is set by the tolerances below.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import re
import sys
from collections import Counter, defaultdict
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ackwise import Ack, DeadLetter

#: Clock and ordering tolerance between the driver's fault record and a worker's journal line.
EPS = 0.05
#: A child killed this soon after its ``end`` record may not have reported the result yet.
REPORT_SLACK = 1.0
#: A late ack leaves the worker this soon after the task's end (batched for 5-50 ms; a loaded
#: 2-core machine adds scheduling delays).
ACK_SLACK = 2.0
#: A worker is connected again when the backoff after its last failed broker call is over
#: (read from its log); this much more covers the reconnect itself and a delivery it held
#: from before being started then (its ack refused as stale).
RECONNECT_SLACK = 1.5
#: A task runs for at most 0.2 s: an execution without an end must be killed within this.
HANG_LIMIT = 10.0
#: A message is handed out within this of the messages published next to it (FIFO queues;
#: prefetch and redeliveries blur the order by a few seconds).
NEIGHBOUR_WINDOW = 3.0

EXECUTOR_KILL = "executor-kill"
WORKER_KILL = "worker-kill"
CUT = "cut"
RESTART = "restart"
#: Not a fault the soak injected: a worker that exited by itself (a finding of its own); what
#: it held is attributed to it, so that its consequences are not reported once more each.
WORKER_CRASH = "worker-crash"
#: Not a fault either: a publish that failed (a broker restart) and was sent again, same ids.
PUBLISH_RETRY = "publish-retry"
FAULT_KINDS = (EXECUTOR_KILL, WORKER_KILL, CUT, RESTART)

EXPLAINED = "explained"
UNEXPLAINED = "UNEXPLAINED"
VIOLATION = "VIOLATION"

#: Dead-letter reasons each mode may produce under kills and cuts (semantics.md).
ALLOWED_REASONS = {
    Ack.EARLY: {"max_deliveries"},
    Ack.LATE: {"worker_lost", "max_deliveries"},
    Ack.REJECT_ON_LOST: {"max_deliveries"},
}


# -- the timeline ---------------------------------------------------------------------------
@dataclass
class Execution:
    id: str
    attempt: int
    pid: int
    worker: int
    start: float
    end: float | None = None

    @property
    def last(self) -> float:
        return self.start if self.end is None else self.end


@dataclass(frozen=True)
class Handoff:
    """The worker handed a delivery to its executor (``soak_plugin``'s ``handed``)."""

    id: str
    attempt: int
    worker: int
    t: float


@dataclass(frozen=True)
class StaleReport:
    """A worker logged a stale receipt (``stale receipt on <operation> of message …``)."""

    id: str
    operation: str
    attempt: int
    worker: int
    t: float


@dataclass(frozen=True)
class Fault:
    kind: str
    t0: float
    t1: float
    pid: int = 0  # the process killed (executor child or worker)
    worker: int = 0  # the worker it belonged to
    how: str = ""  # cut: reset or blackhole

    @property
    def name(self) -> str:
        if self.kind == CUT:
            return "cut" if self.how == "reset" else "partition"
        names = {
            EXECUTOR_KILL: "executor kill",
            WORKER_KILL: "worker kill",
            WORKER_CRASH: "worker crash (not injected)",
            PUBLISH_RETRY: "publish sent again after an error",
        }
        return names.get(self.kind, "broker restart")


@dataclass
class Timeline:
    path: Path
    origin: float = 0.0
    published: list[str] = field(default_factory=list)
    #: id -> when a publish of it failed (it was sent again under the same id: maybe twice)
    republished: dict[str, float] = field(default_factory=dict)
    executions: dict[str, list[Execution]] = field(default_factory=lambda: defaultdict(list))
    handoffs: dict[str, list[Handoff]] = field(default_factory=lambda: defaultdict(list))
    stale: dict[str, list[StaleReport]] = field(default_factory=lambda: defaultdict(list))
    #: worker pid -> (time of a failed broker call, backoff before the next try), from its log
    retries: dict[int, list[tuple[float, float]]] = field(default_factory=lambda: defaultdict(list))
    faults: list[Fault] = field(default_factory=list)
    workers: dict[int, str] = field(default_factory=dict)  # worker pid -> pool
    exits: list[dict[str, Any]] = field(default_factory=list)
    bad_lines: int = 0

    def rel(self, t: float) -> str:
        return f"+{t - self.origin:.3f}s"

    def describe(self, e: Execution) -> str:
        end = self.rel(e.end) if e.end is not None else "no end"
        return f"attempt {e.attempt} pid {e.pid} (worker {e.worker}) {self.rel(e.start)}..{end}"

    def describe_fault(self, f: Fault) -> str:
        target = f" pid {f.pid}" if f.pid else ""
        target += f" of worker {f.worker}" if f.worker and f.worker != f.pid else ""
        span = self.rel(f.t0) if f.t1 - f.t0 < 0.05 else f"{self.rel(f.t0)}..{self.rel(f.t1)}"
        return f"{f.name}{target} {span}"

    def lines_for(self, message_id: str) -> list[str]:
        """The journal lines of one message (not the publish records: they name thousands)."""
        with self.path.open() as f:
            return [
                line.rstrip("\n")
                for line in f
                if message_id in line and not line.startswith('{"ev": "publish-ok"')
            ]


def read_timeline(path: Path) -> Timeline:
    """Parse one run's journal (complete lines only: a killed writer never leaves half a line)."""
    tl = Timeline(path)
    open_starts: dict[tuple[Any, ...], Execution] = {}
    ends: list[dict[str, Any]] = []
    with path.open() as f:
        for line in f:
            try:
                rec = json.loads(line)
            except ValueError:
                tl.bad_lines += 1
                continue
            _take(tl, rec, open_starts, ends)
    # Executors of the threads pool are the worker itself; prefork children report it as ppid.
    for started in open_starts.values():
        started.worker = started.pid if started.pid in tl.workers else started.worker
    for rec in ends:
        e = open_starts.get(_exec_key(rec))
        if e is not None and e.end is None:
            e.end = float(rec["t"])
    for execs in tl.executions.values():
        execs.sort(key=lambda e: e.start)
    tl.faults.sort(key=lambda f: f.t0)
    return tl


def _exec_key(rec: dict[str, Any]) -> tuple[Any, ...]:
    return (rec["id"], rec["pid"], rec["attempt"], rec.get("receipt"))


def _take(
    tl: Timeline,
    rec: dict[str, Any],
    open_starts: dict[tuple[Any, ...], Execution],
    ends: list[dict[str, Any]],
) -> None:
    ev = rec.get("ev")
    t = float(rec.get("t", 0.0))
    if not tl.origin:
        tl.origin = t
    if ev == "start":
        e = Execution(rec["id"], int(rec["attempt"]), int(rec["pid"]), int(rec["ppid"]), t)
        open_starts[_exec_key(rec)] = e
        tl.executions[e.id].append(e)
    elif ev == "end":
        ends.append(rec)
    elif ev == "handed":
        h = Handoff(rec["id"], int(rec["attempt"]), int(rec["pid"]), t)
        tl.handoffs[h.id].append(h)
    elif ev == "stale":  # harvested from the worker logs after the run
        r = StaleReport(rec["id"], rec["operation"], int(rec["attempt"]), int(rec["worker"]), t)
        tl.stale[r.id].append(r)
    elif ev == "retry":
        tl.retries[int(rec["pid"])].append((t, float(rec["delay"])))
    elif ev == "publish-ok":
        tl.published.extend(rec["ids"])
    elif ev == "publish-failed":
        tl.republished.update((mid, t) for mid in rec["ids"])
    elif ev == "worker-start":
        tl.workers[int(rec["worker"])] = str(rec["pool"])
    elif ev == "worker-exit":
        tl.exits.append(rec)
    elif ev == "fault":
        tl.faults.append(
            Fault(
                str(rec["kind"]),
                float(rec["t0"]),
                float(rec["t1"]),
                int(rec.get("victim", 0)),
                int(rec.get("worker", 0)),
                str(rec.get("how", "")),
            )
        )


# -- explanations ---------------------------------------------------------------------------
class Explainer:
    """Which injected fault accounts for what happened to one execution or delivery."""

    def __init__(self, tl: Timeline, mode: Ack) -> None:
        self.tl = tl
        self.mode = mode
        self.executor_kills: dict[int, list[Fault]] = defaultdict(list)  # by the child's pid
        self.child_kills: dict[int, list[Fault]] = defaultdict(list)  # by the child's worker
        self.worker_kills: dict[int, list[Fault]] = defaultdict(list)  # by the worker's pid
        self.links = [f for f in tl.faults if f.kind in (CUT, RESTART)]
        self.next_link = {f: nxt.t0 for f, nxt in zip(self.links, self.links[1:], strict=False)}
        # Faults that give back what a worker held (prefetched, unacked): it died or its
        # connection did.
        self.returning = [f for f in tl.faults if f.kind in (WORKER_KILL, CUT, RESTART)]
        for f in tl.faults:
            if f.kind == EXECUTOR_KILL:
                self.executor_kills[f.pid].append(f)
                self.child_kills[f.worker].append(f)
            elif f.kind == WORKER_KILL:
                self.worker_kills[f.worker].append(f)
        self.crashes = [
            Fault(WORKER_CRASH, float(r["t"]), float(r["t"]), int(r["worker"]), int(r["worker"]))
            for r in tl.exits
        ]
        for f in self.crashes:
            self.worker_kills[f.worker].append(f)
            self.returning.append(f)

    def kills_of(self, e: Execution) -> list[Fault]:
        return self.executor_kills.get(e.pid, []) + self.worker_kills.get(e.worker, [])

    def interrupting_kill(self, e: Execution) -> Fault | None:
        """The kill that ended an execution without an end: the first of its process after it
        started (within HANG_LIMIT: a task that ran on for longer would be a hang)."""
        after = [f for f in self.kills_of(e) if f.t1 + EPS >= e.start]
        first = min(after, key=lambda f: f.t0, default=None)
        if first is None or first.t0 - e.start > HANG_LIMIT:
            return None
        return first

    def handoff_kill(self, h: Handoff, started: bool) -> Fault | None:
        """The kill that took a handed delivery before its body started: of its worker, or of
        one of the worker's children (possibly dead already when the job was handed)."""
        if started:
            return None
        candidates = [
            f
            for f in self.worker_kills.get(h.worker, [])
            if h.t - EPS <= f.t1 and f.t0 <= h.t + HANG_LIMIT
        ]
        candidates += [
            f
            for f in self.child_kills.get(h.worker, [])
            if h.t - REPORT_SLACK <= f.t1 and f.t0 <= h.t + HANG_LIMIT
        ]
        return min(candidates, key=lambda f: f.t0, default=None)

    def unacked_cause(self, e: Execution, execs: Sequence[Execution]) -> Fault | None:
        """A fault that can have kept the late ack of an ended execution from taking effect,
        after which the message ran again."""
        assert e.end is not None

        def ran_again_after(f: Fault) -> bool:
            return any(x is not e and x.start + EPS >= f.t0 for x in execs)

        # Only REJECT_ON_LOST runs a task again after its executor died (LATE dead-letters it).
        rerun_on_executor_death = self.mode is Ack.REJECT_ON_LOST
        for f in self.executor_kills.get(e.pid, []) if rerun_on_executor_death else []:
            if e.start - EPS <= f.t1 and f.t0 <= e.end + REPORT_SLACK and ran_again_after(f):
                return f
        for f in self.worker_kills.get(e.worker, []):
            if e.start - EPS <= f.t1 and f.t0 <= e.end + ACK_SLACK and ran_again_after(f):
                return f
        for f in reversed(self.links):  # the latest that fits: the likeliest cause
            if self.link_touches(f, e.worker, e.start, e.end) and ran_again_after(f):
                return f
        return None

    def link_touches(self, f: Fault, worker: int, start: float, last: float) -> bool:
        """A cut or restart overlaps what ``worker`` did between ``start`` and ``last``: it
        began before the ack of ``last`` left, and ended (the worker connected again) after
        ``start`` (a delivery it held from before may be started then, its ack refused)."""
        return f.t0 <= last + ACK_SLACK and start <= self.back_after(f, worker) + RECONNECT_SLACK

    def back_after(self, f: Fault, worker: int) -> float:
        """When ``worker`` was connected again after ``f``: its last failed broker call during
        the fault (or just after) plus the backoff it then waited; the fault's end if none.
        Failed calls from the next cut or restart on belong to that one."""
        back = f.t1
        until = self.next_link.get(f, float("inf")) - EPS
        for t, delay in self.tl.retries.get(worker, []):
            if f.t0 - EPS <= t <= min(back + RECONNECT_SLACK, until):
                back = max(back, t + delay)
        return back

    def settlement_disrupted(self, worker: int, t: float) -> Fault | None:
        """A fault that can have stopped a worker's settlement (a dead letter) made at ``t``."""
        for f in self.worker_kills.get(worker, []):
            if t - EPS <= f.t1 and f.t0 <= t + ACK_SLACK:
                return f
        for f in self.links:
            if self.link_touches(f, worker, t, t):
                return f
        return None

    def returned_between(self, after: float, before: float) -> Fault | None:
        """A fault that gives back held deliveries between two instants."""
        for f in self.returning:
            if after - EPS <= f.t1 and f.t0 <= before + EPS:
                return f
        return None


# -- the verdict ----------------------------------------------------------------------------
@dataclass
class Finding:
    id: str
    what: str
    verdict: str
    why: str
    detail: str = ""  # more evidence (a worker's last log lines)


@dataclass
class Verdict:
    mode: Ack
    tasks: int = 0
    runs: int = 0
    ok: int = 0
    duplicated: int = 0
    duplicated_explained: int = 0
    lost: int = 0
    lost_explained: int = 0
    running_at_kill: int = 0
    #: EARLY losses of tasks that never started: the early ack was recorded, its answer lost
    #: in a cut or restart, and the worker did not run them (they were not running at a kill),
    #: where the broker cannot tell (AMQP) or the outage outlasted what it remembers.
    lost_early_ack: int = 0
    #: ... the same, within what the broker remembers: it should have told (a violation).
    lost_early_ack_told: int = 0
    dead: Counter[str] = field(default_factory=Counter)
    faults: Counter[str] = field(default_factory=Counter)
    #: "what: by which fault" -> count, for the explanation breakdown.
    causes: Counter[str] = field(default_factory=Counter)
    findings: list[Finding] = field(default_factory=list)
    #: Deliveries that came back without running, with no fault giving back held messages
    #: at that time (information: attempt > 1 without a fault).
    quiet_redeliveries: int = 0
    notes: list[str] = field(default_factory=list)

    @property
    def failed(self) -> bool:
        return bool(self.findings)

    def flag(self, mid: str, what: str, verdict: str, why: str, detail: str = "") -> None:
        self.findings.append(Finding(mid, what, verdict, why, detail))

    def explained(self, what: str, f: Fault) -> None:
        self.causes[f"{what}: {f.name}"] += 1


def classify(
    tl: Timeline,
    dead_letters: Iterable[DeadLetter],
    mode: Ack,
    *,
    early_ack_memory: float | None = float("inf"),
) -> Verdict:
    """Classify every published message of one run; explain every anomaly (see the module).

    :param early_ack_memory: how long after a cut or restart began the broker surely still
        tells, when asked again, an early ack it took from one it did not; ``None`` where it
        cannot (AMQP: the receipts die with the connection).  What it remembers ends with the
        delivery's lease (SQS: deleting again works within it) or a fixed time after (Redis:
        120 s); that lease was renewed at most a third of a lease before the fault, so it ran
        at least two thirds of one past it.  An early ack asked again later than that is lost
        by the protocol and does not count against the EARLY bound; one asked sooner does.
    """
    dead: dict[str, list[DeadLetter]] = defaultdict(list)
    for d in dead_letters:
        dead[d.message_id].append(d)
    v = Verdict(mode, tasks=len(tl.published))
    v.faults.update(f.kind for f in tl.faults)
    checker = _MessageChecker(tl, Explainer(tl, mode), mode, v, early_ack_memory)
    published = set(tl.published)
    for mid in tl.published:
        checker.check(mid, dead.get(mid, []))
    for mid in sorted(set(tl.executions) - published):
        v.flag(mid, "unexpected", UNEXPLAINED, "executed but never published")
    for mid in sorted(set(dead) - published):
        v.flag(mid, "unexpected", UNEXPLAINED, "dead-lettered but never published")
    for rec in tl.exits:
        last = [line for line in str(rec.get("tail", "")).splitlines() if line.strip()]
        v.flag(
            "-",
            "worker exit",
            UNEXPLAINED,
            f"worker {rec.get('worker')} exited by itself (status {rec.get('status')}) at "
            f"{tl.rel(float(rec['t']))}: {last[-1] if last else 'no output'} (its log: "
            f"{rec.get('log', '?')})",
            detail="\n".join(last[-12:]),
        )
    if tl.bad_lines:
        v.notes.append(f"{tl.bad_lines} journal line(s) could not be read")
    allowed = v.running_at_kill + v.lost_early_ack
    if mode is Ack.EARLY and v.lost > allowed:
        why = [f"{n} {what.removeprefix('lost ')}" for what, n in _loss_causes(v) if n]
        v.flag(
            "-",
            "EARLY bound",
            VIOLATION,
            f"{v.lost} lost, more than the {v.running_at_kill} task(s) running at a kill"
            + f" and {v.lost_early_ack} early ack(s) cut off longer than the broker remembers"
            + f"; the losses: {', '.join(why)}",
        )
    return v


def _loss_causes(v: Verdict) -> list[tuple[str, int]]:
    """EARLY losses by what explained them; the rest unexplained."""
    by_what: Counter[str] = Counter()
    for cause, n in v.causes.items():
        what, _, _ = cause.partition(": ")
        if what.startswith("lost"):
            by_what[what] += n
    return [*by_what.items(), ("lost (unexplained)", v.lost - v.lost_explained)]


class _MessageChecker:
    def __init__(
        self, tl: Timeline, ex: Explainer, mode: Ack, v: Verdict, memory: float | None
    ) -> None:
        self.tl, self.ex, self.mode, self.v, self.memory = tl, ex, mode, v, memory
        self.index = {mid: i for i, mid in enumerate(tl.published)}

    def check(self, mid: str, dead: list[DeadLetter]) -> None:
        v = self.v
        execs = self.tl.executions.get(mid, [])
        hands = self.tl.handoffs.get(mid, [])
        ends = [e for e in execs if e.end is not None]
        v.runs += len(execs)
        kills = self._interrupted(mid, execs)
        kills += self._handoffs_killed(mid, execs, hands)
        if any(f.kind != WORKER_CRASH for f in kills):
            v.running_at_kill += 1
        if self.mode is Ack.EARLY and len(execs) > 1:
            runs = "; ".join(self.tl.describe(e) for e in execs)
            v.flag(mid, "EARLY ran twice", VIOLATION, f"at most once, ran {len(execs)}x: {runs}")
        if len(ends) > 1:
            self._duplicate(mid, execs, ends, counted=not dead)
        if dead:
            self._dead(mid, dead, execs, hands)
        elif not ends:
            self._lost(mid, execs, kills)
        elif len(ends) == 1:
            v.ok += 1
        if self.mode is Ack.LATE:
            self._late_rerun(mid, execs, hands)
        self._quiet_redeliveries(execs, dead)

    def _interrupted(self, mid: str, execs: list[Execution]) -> list[Fault]:
        """Every execution without an end was killed: the kills, in order."""
        kills = []
        for e in execs:
            if e.end is not None:
                continue
            f = self.ex.interrupting_kill(e)
            if f is None:
                self.v.flag(
                    mid,
                    "interrupted",
                    UNEXPLAINED,
                    f"execution {self.tl.describe(e)} has no end and its process was not killed",
                )
            else:
                kills.append(f)
        return kills

    def _handoffs_killed(
        self, mid: str, execs: list[Execution], hands: list[Handoff]
    ) -> list[Fault]:
        """Every delivery handed to an executor started, or a kill took it first."""
        kills = []
        for h in hands:
            started = any(e.attempt == h.attempt and e.worker == h.worker for e in execs)
            if started:
                continue
            f = self.ex.handoff_kill(h, started)
            if f is None:
                self.v.flag(
                    mid,
                    "never started",
                    UNEXPLAINED,
                    f"handed to an executor by worker {h.worker} at {self.tl.rel(h.t)} "
                    f"(attempt {h.attempt}), never started, and no kill followed",
                )
            else:
                kills.append(f)
        return kills

    def _duplicate(
        self, mid: str, execs: list[Execution], ends: list[Execution], counted: bool
    ) -> None:
        """Completed k times: at least k - 1 of the completions lost their ack to a fault."""
        causes = [f for e in ends if (f := self.ex.unacked_cause(e, execs)) is not None]
        if mid in self.tl.republished:  # maybe stored twice: each copy ran once
            failed_at = self.tl.republished[mid]
            causes.append(Fault(PUBLISH_RETRY, failed_at, failed_at))
        ok = len(causes) >= len(ends) - 1
        if counted:
            self.v.duplicated += 1
            self.v.duplicated_explained += ok
        if ok:
            self.v.explained("duplicate", causes[0])
            return
        runs = "; ".join(self.tl.describe(e) for e in execs)
        self.v.flag(
            mid,
            "duplicate",
            UNEXPLAINED,
            f"completed {len(ends)}x, only {len(causes)} completion(s) overlap a fault: {runs}",
        )

    def _lost(self, mid: str, execs: list[Execution], kills: list[Fault]) -> None:
        v = self.v
        v.lost += 1
        if self.mode is not Ack.EARLY:
            why = "; ".join(self.tl.describe(e) for e in execs) or "never started"
            near = f" (killed: {self.tl.describe_fault(kills[0])})" if kills else ""
            v.flag(mid, "lost", VIOLATION, f"{self.mode.name} message lost: {why}{near}")
            return
        if kills:
            v.lost_explained += 1
            crash = kills[0].kind == WORKER_CRASH
            v.explained(
                "lost (running when its worker crashed)" if crash else "lost (running at a kill)",
                kills[0],
            )
            return
        answer_lost = self._early_ack_answer_lost(mid, execs)
        if answer_lost is not None:
            fault, outage = answer_lost
            v.lost_explained += 1
            if self.memory is None or outage > self.memory:
                v.lost_early_ack += 1
                v.explained(
                    "lost (early ack recorded, its answer lost, asked again after the broker "
                    "forgot it; never started)",
                    fault,
                )
            else:
                v.lost_early_ack_told += 1
                v.explained("lost (early ack recorded, its answer lost; never started)", fault)
            return
        killed = self._acked_then_killed(mid, execs)
        if killed is not None:
            v.lost_explained += 1
            v.running_at_kill += killed.kind != WORKER_CRASH
            v.explained("lost (acked early, its worker killed before handing it; inferred)", killed)
            return
        why = "; ".join(self.tl.describe(e) for e in execs) or "never handed to an executor"
        v.flag(mid, "lost", UNEXPLAINED, f"EARLY loss with no kill while it ran: {why}")

    def _early_ack_answer_lost(
        self, mid: str, execs: list[Execution]
    ) -> tuple[Fault, float] | None:
        """Never started because its early ack was recorded by the broker but the answer was lost
        in a cut or restart: the worker keeps the batch, and after the reconnect the retried ack
        (or the lease renewal, when it comes first) finds the message gone, reports a stale
        receipt and does not run it.  Evidence: that report, made while the worker recovered.
        Returns the fault and how long after it began the worker asked again."""
        if execs:
            return None
        for r in self.tl.stale.get(mid, []):
            if r.operation not in ("early ack", "extend"):
                continue
            for f in self.ex.links:
                back = self.ex.back_after(f, r.worker)
                if f.t0 - EPS <= r.t <= back + RECONNECT_SLACK:
                    return f, r.t - f.t0
        return None

    def _acked_then_killed(self, mid: str, execs: list[Execution]) -> Fault | None:
        """Never handed, no trace at all: an early ack removed it (EARLY acks nothing else), and
        the worker that made it died before handing it over (killed during the ack's round
        trip).  Inferred: a worker was killed (or crashed) when the messages published next to
        it were handed out (queues hand out in about publish order)."""
        if execs or self.tl.handoffs.get(mid) or self.tl.stale.get(mid):
            return None
        around = self._handed_around(mid)
        if around is None:
            return None
        kills = [f for fs in self.ex.worker_kills.values() for f in fs]
        near = [f for f in kills if abs(f.t0 - around) <= NEIGHBOUR_WINDOW]
        return min(near, key=lambda f: abs(f.t0 - around), default=None)

    def _handed_around(self, mid: str) -> float | None:
        """When the messages published next to ``mid`` were first handed out (the median)."""
        i = self.index[mid]
        times = sorted(
            min(h.t for h in hands)
            for other in self.tl.published[max(0, i - 10) : i + 11]
            if other != mid and (hands := self.tl.handoffs.get(other))
        )
        return times[len(times) // 2] if times else None

    def _dead(
        self, mid: str, dead: list[DeadLetter], execs: list[Execution], hands: list[Handoff]
    ) -> None:
        v = self.v
        v.dead[dead[0].reason] += 1
        if len(dead) > 1:
            v.flag(mid, "dead twice", UNEXPLAINED, f"{len(dead)} dead letters for one message")
        d = dead[0]
        if d.reason not in ALLOWED_REASONS[self.mode]:
            v.flag(mid, f"dead {d.reason}", VIOLATION, f"{self.mode.name} never dead-letters so")
            return
        cause = (
            self._executor_lost_cause(execs, hands)
            if d.reason == "worker_lost"
            else self._redeliveries_cause(execs, d)
        )
        if cause is None:
            runs = "; ".join(self.tl.describe(e) for e in execs) or "never started"
            v.flag(
                mid,
                f"dead {d.reason}",
                UNEXPLAINED,
                f"dead-lettered at attempt {d.attempt} ({self.tl.rel(d.dead_at)}); no fault "
                f"accounts for it: {runs}",
            )
        else:
            v.explained(f"dead-lettered {d.reason}", cause)

    def _executor_lost_cause(self, execs: list[Execution], hands: list[Handoff]) -> Fault | None:
        """worker_lost: the executor of one of its deliveries was killed while it held it."""
        for e in execs:
            for f in self.ex.executor_kills.get(e.pid, []):
                if e.start - EPS <= f.t1 and f.t0 <= e.last + REPORT_SLACK:
                    return f
        for h in hands:
            started = any(e.attempt == h.attempt and e.worker == h.worker for e in execs)
            killed = self.ex.handoff_kill(h, started)
            if killed is not None and killed.kind == EXECUTOR_KILL:
                return killed
        return None

    def _redeliveries_cause(self, execs: list[Execution], d: DeadLetter) -> Fault | None:
        """max_deliveries: every delivery before the dead letter ended by a fault."""
        first: Fault | None = None
        for e in execs:
            f = (
                self.ex.interrupting_kill(e)
                if e.end is None
                else self.ex.unacked_cause(e, [*execs, _marker(d.dead_at)])
            )
            if f is None:
                return None
            first = first or f
        for after, before in self._held_gaps(execs, d.attempt, d.dead_at):
            returned = self.ex.returned_between(after, before)
            if returned is None:
                return None
            first = first or returned
        return first

    def _held_gaps(
        self, execs: list[Execution], upto: int, until: float
    ) -> list[tuple[float, float]]:
        """For each delivery below ``upto`` that never ran, the instants that bracket it."""
        ran = {e.attempt: e.start for e in execs}
        gaps = []
        for a in range(1, upto):
            if a in ran:
                continue
            before = min((t for n, t in ran.items() if n > a), default=until)
            # A delivery can run late (held in a buffer across a reconnect): only the earlier
            # deliveries that ran before this bracket's end bound it.
            after = max(
                (t for n, t in ran.items() if n < a and t <= before), default=self.tl.origin
            )
            gaps.append((after, before))
        return gaps

    def _quiet_redeliveries(self, execs: list[Execution], dead: list[DeadLetter]) -> None:
        if not execs or dead:
            return
        top = max(e.attempt for e in execs)
        for after, before in self._held_gaps(execs, top, execs[-1].start):
            if self.ex.returned_between(after, before) is None:
                self.v.quiet_redeliveries += 1

    def _late_rerun(self, mid: str, execs: list[Execution], hands: list[Handoff]) -> None:
        """LATE: an executor killed under a live supervisor means a worker_lost dead letter,
        not a re-run, unless a fault stopped that dead letter (a cut, the worker's death)."""
        for e in execs:
            if e.end is not None:
                continue
            f = self.ex.interrupting_kill(e)
            if f is None or f.kind != EXECUTOR_KILL:
                continue
            if not any(x.start > e.start for x in execs):
                continue
            if self.ex.settlement_disrupted(e.worker, f.t0) is None:
                self.v.flag(
                    mid,
                    "LATE re-run",
                    VIOLATION,
                    f"re-run after its executor was killed ({self.tl.describe_fault(f)}) "
                    f"under a live worker: expected a worker_lost dead letter; runs: "
                    + "; ".join(self.tl.describe(x) for x in execs),
                )


def _marker(t: float) -> Execution:
    """A stand-in for "it was delivered again at ``t``" (the dead letter itself)."""
    return Execution("", 0, 0, 0, t, t)


# -- what the worker logs say ----------------------------------------------------------------
# The worker's modules log as ``ackwise.worker`` (``ackwise._worker`` up to 0.1.0: both match).
_STAMP = r"^(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d),(\d{3}) WARNING ackwise(?:\._worker|\.worker): "
_STALE = re.compile(
    _STAMP + r"stale receipt on (.+?) of message (\S+) \(queue \S+, attempt (\d+)\)"
)
_RETRY = re.compile(_STAMP + r"broker .*(?:reconnecting|retrying) in ([\d.]+)s\)?$")


def worker_log_records(log: Path, worker: int) -> Iterator[dict[str, Any]]:
    """Journal records from one worker's log (local time): each stale receipt it reported
    (``stale``), and each failed broker call with the backoff before the next (``retry``)."""
    with log.open(errors="replace") as f:
        for line in f:
            if m := _STALE.match(line):
                yield {"ev": "stale", "pid": worker, "t": _when(m), "worker": worker,
                       "operation": m[3], "id": m[4], "attempt": int(m[5])}  # fmt: skip
            elif m := _RETRY.match(line.rstrip()):
                yield {"ev": "retry", "pid": worker, "t": _when(m), "delay": float(m[3])}


def _when(m: re.Match[str]) -> float:
    return dt.datetime.strptime(m[1], "%Y-%m-%d %H:%M:%S").timestamp() + int(m[2]) / 1000


# -- dead letters on disk, and a re-check of a kept run -------------------------------------
def save_dead(path: Path, dead: Iterable[DeadLetter]) -> None:
    """Keep the dead letters beside the journal (bodies left out), for a later re-check."""
    with path.open("w") as f:
        for d in dead:
            rec = {"queue": d.queue, "id": d.message_id, "reason": d.reason}
            f.write(json.dumps({**rec, "dead_at": d.dead_at, "attempt": d.attempt}) + "\n")


def load_dead(path: Path) -> list[DeadLetter]:
    out = []
    for line in path.read_text().splitlines():
        r = json.loads(line)
        out.append(DeadLetter(r["queue"], r["id"], b"", r["reason"], r["dead_at"], r["attempt"]))
    return out


def main() -> int:
    """Classify a kept run again: ``python bench/soakbench/soak_check.py RUN_DIR MODE``."""
    p = argparse.ArgumentParser(description=main.__doc__)
    p.add_argument("run_dir", type=Path, help="a run's directory (journal.jsonl, dead.jsonl)")
    p.add_argument("mode", choices=[m.value for m in Ack])
    p.add_argument(
        "--early-ack-memory",
        type=float,
        default=float("inf"),
        help="seconds after a fault began that the broker surely still tells an early ack it "
        "took when asked again (Redis: 2/3 lease + 120, SQS: 2/3 lease - 0.2); negative: it "
        "cannot (RabbitMQ)",
    )
    args = p.parse_args()
    tl = read_timeline(args.run_dir / "journal.jsonl")
    v = classify(
        tl,
        load_dead(args.run_dir / "dead.jsonl"),
        Ack(args.mode),
        early_ack_memory=None if args.early_ack_memory < 0 else args.early_ack_memory,
    )
    print(
        f"{v.tasks} tasks, {v.runs} runs, {v.ok} ok, {v.duplicated} duplicated "
        f"({v.duplicated_explained} explained), {v.lost} lost ({v.lost_explained} explained), "
        f"{v.running_at_kill} running at a kill, dead {dict(v.dead)}, faults {dict(v.faults)}"
    )
    for cause, n in sorted(v.causes.items()):
        print(f"  {cause}: {n}")
    for finding in v.findings:
        print(f"{finding.verdict} {finding.what} {finding.id}: {finding.why}")
    return 1 if v.failed else 0


if __name__ == "__main__":
    sys.exit(main())
