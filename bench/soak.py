"""Chaos soak: many tasks, several worker processes, random faults; then every message explained.

    uv run python bench/soak.py [--brokers sqlite,redis,rabbitmq,sqs]
                                [--modes early,late,reject_on_lost] [--tasks 100000]
                                [--sqs-tasks N] [--rate 250] [--fault-every 2] [--seed 1]
                                [--faults KINDS] [--write | --out PATH] [--keep]

Per (broker, mode): start ``--workers`` ``ackwise worker`` processes (prefork and threads pools)
behind a TCP fault proxy, publish the tasks of the conformance workload
(``ackwise_conformance.workload``: every execution journals ``start`` / ``end``) at ``--rate``,
and meanwhile inject faults at random (seeded) intervals: SIGKILL of an executor child, SIGKILL
of a whole worker (its process group; a replacement starts), connection cuts and partitions
through the proxy (networked brokers) and graceful restarts of the durable private broker
(Redis, RabbitMQ).  Once all are published the faults stop, the fleet drains the rest and is
stopped, and every published message is classified from the journal and the broker's
dead-letter store (``soakbench/soak_check.py``): each duplicate, loss and dead letter must be
explained by a fault injected at that time, or the run fails.  See ``bench/README.md``.
"""

from __future__ import annotations

import argparse
import datetime as dt
import hashlib
import json
import os
import platform
import random
import re
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import suppress
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

for _name, _value in (  # moto takes any credentials; the workers inherit these
    ("AWS_ACCESS_KEY_ID", "testing"),
    ("AWS_SECRET_ACCESS_KEY", "testing"),
    ("AWS_DEFAULT_REGION", "us-east-1"),
):
    os.environ.setdefault(_name, _value)

from soakbench import soak_check  # noqa: E402
from soakbench.soak_check import (  # noqa: E402
    CUT,
    EXECUTOR_KILL,
    RESTART,
    WORKER_KILL,
    Verdict,
)

from ackwise import Ack, Adapter, DeadLetter, QueueStats, open_adapter  # noqa: E402
from ackwise.errors import AdapterError  # noqa: E402
from ackwise.spi import QueueSpec  # noqa: E402
from ackwise_conformance.brokers import BrokerHandle, provide  # noqa: E402
from ackwise_conformance.journal import record  # noqa: E402
from ackwise_conformance.proxy import FaultProxy  # noqa: E402
from ackwise_conformance.workload import MAX_DELIVERIES, build_app, task_name  # noqa: E402

BENCH_DIR = Path(__file__).resolve().parent
REPO = BENCH_DIR.parent
BROKERS = ("sqlite", "redis", "rabbitmq", "sqs")
MODES = {"early": Ack.EARLY, "late": Ack.LATE, "reject_on_lost": Ack.REJECT_ON_LOST}
PUBLISH_BATCH = 500
#: The publisher sends a burst of BURST x rate tasks every BURST seconds.
BURST = 2.0
#: The pool of each worker slot (a replacement keeps its slot's pool).
POOLS = ("prefork", "prefork", "threads", "prefork")
#: Leases (s): short, so a dead worker's messages come back quickly; SQS has whole seconds
#: and its crash tests run at time scale 2 (leases of 2 s).  RabbitMQ's lease is the
#: connection (2 s heartbeats, as its tests); the option is passed all the same.
LEASES = {"sqlite": 3.0, "redis": 3.0, "rabbitmq": 3.0, "sqs": 2.0}
#: How long after a cut or restart began the broker surely still tells, when asked again, an
#: early ack it took (its answer lost) from one it did not.  Its memory ends with the
#: delivery's lease (SQS: deleting again works within it, less the adapter's 0.2 s fence) or
#: 120 s past it (Redis, docs/adapters/redis.md); the worker renews every third of a lease,
#: so the lease ran at least two thirds of one past the fault's start.  AMQP receipts die
#: with their connection (docs/adapters/rabbitmq.md): no memory at all.
EARLY_ACK_MEMORY: dict[str, float | None] = {
    "sqlite": float("inf"),
    "redis": LEASES["redis"] * 2 / 3 + 120.0,
    "rabbitmq": None,
    "sqs": LEASES["sqs"] * 2 / 3 - 0.2,
}
#: Relative weights of the fault kinds; a kind the broker cannot have is left out.
WEIGHTS = {EXECUTOR_KILL: 4.0, WORKER_KILL: 2.0, CUT: 2.0, RESTART: 1.0}
#: After the broker looks drained, the journal must stay still this long.
QUIET = 2.0
GRACE = 30.0


# -- settings -------------------------------------------------------------------------------
@dataclass(frozen=True)
class Settings:
    tasks: int
    sqs_tasks: int
    workers: int
    concurrency: int
    seed: int
    rate: float
    sqs_rate: float
    fault_every: float
    restart_gap: float
    slow_fraction: float
    drain_timeout: float
    kinds: tuple[str, ...] = (EXECUTOR_KILL, WORKER_KILL, CUT, RESTART)

    def tasks_for(self, broker: str) -> int:
        return self.sqs_tasks if broker == "sqs" else self.tasks

    def rate_for(self, broker: str) -> float:
        return self.sqs_rate if broker == "sqs" else self.rate


@dataclass
class RunResult:
    broker: str
    mode: Ack
    tasks: int
    verdict: Verdict
    soak_s: float
    drained: bool
    pending: str
    workdir: Path
    details: list[str] = field(default_factory=list)


# -- brokers --------------------------------------------------------------------------------
def with_options(url: str, **options: object) -> str:
    extra = "&".join(f"{k}={v}" for k, v in options.items())
    return f"{url}{'&' if '?' in url else '?'}{extra}" if extra else url


class Broker:
    """A private broker (``provide``) and the URLs the driver and the workers use."""

    def __init__(self, name: str, tmp: Path) -> None:
        self.name = name
        self.handle: BrokerHandle = provide(name, tmp_dir=tmp, durable=True)
        self.networked = self.handle.host is not None

    @property
    def restartable(self) -> bool:
        return self.handle.restartable

    def driver_url(self) -> str:
        if self.name == "rabbitmq":  # totals no older than the call (the node's tick: 200 ms)
            return with_options(self.handle.url, heartbeat=2, management_lag=0.3)
        return self.handle.url

    def worker_url(self, proxy: FaultProxy | None) -> str:
        url = self.handle.url if proxy is None else self.handle.url_via("127.0.0.1", proxy.port)
        return with_options(url, heartbeat=2) if self.name == "rabbitmq" else url

    def restart(self) -> None:
        self.handle.restart()

    def stop(self) -> None:
        self.handle.stop()


def start_proxy(broker: Broker) -> FaultProxy | None:
    """A fault proxy between the workers and a networked broker (the driver goes direct)."""
    host, port = broker.handle.host, broker.handle.port
    if host is None or port is None:
        return None
    return FaultProxy(host, port).start()


def open_driver_adapter(url: str, queue: str) -> Adapter:
    adapter = open_adapter(url)
    adapter.open()
    adapter.declare(QueueSpec(queue, max_deliveries=MAX_DELIVERIES))
    return adapter


# -- worker processes -----------------------------------------------------------------------
@dataclass
class WorkerProc:
    slot: int
    pool: str
    proc: subprocess.Popen[bytes]
    log: Path
    killed: bool = False

    @property
    def pid(self) -> int:
        return self.proc.pid

    def alive(self) -> bool:
        return self.proc.poll() is None

    def tail(self, chars: int = 600) -> str:
        text = self.log.read_text(errors="replace") if self.log.exists() else ""
        return text[-chars:]


class Fleet:
    """The worker processes of one run, each in a session of its own (killed as a group)."""

    def __init__(self, workdir: Path, journal: Path, env: dict[str, str], args: list[str]):
        self.workdir = workdir
        self.journal = journal
        self.env = env
        self.args = args
        self.workers: list[WorkerProc] = []
        self._started = 0

    def start(self, slot: int) -> WorkerProc:
        pool = POOLS[slot % len(POOLS)]
        log = self.workdir / f"worker-{self._started}-slot{slot}-{pool}.log"
        self._started += 1
        cmd = [sys.executable, "-m", "ackwise", "worker", "ackwise_conformance.workload:app"]
        with open(log, "wb") as out:
            proc = subprocess.Popen(
                [*cmd, *self.args, "--pool", pool],
                cwd=self.workdir,
                env=self.env,
                stdout=out,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                start_new_session=True,
            )
        w = WorkerProc(slot, pool, proc, log)
        record(self.journal, "worker-start", worker=w.pid, pool=pool, slot=slot)
        self.workers.append(w)
        return w

    def live(self) -> list[WorkerProc]:
        return [w for w in self.workers if w.alive() and not w.killed]

    def wait_ready(self, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        for w in self.live():
            while "ready:" not in w.tail(100_000):
                if not w.alive() or time.monotonic() > deadline:
                    raise RuntimeError(f"worker {w.pid} did not start:\n{w.tail(3000)}")
                time.sleep(0.1)

    def kill(self, w: WorkerProc) -> None:
        """SIGKILL the worker's whole process group (its executor children with it)."""
        w.killed = True
        with suppress(ProcessLookupError, PermissionError):
            os.killpg(w.pid, signal.SIGKILL)
        w.proc.wait()

    def replace_exited(self) -> None:
        """A worker that exited by itself was not a fault the soak injected: journal it."""
        for w in self.workers:
            if not w.killed and not w.alive():
                w.killed = True
                record(
                    self.journal,
                    "worker-exit",
                    worker=w.pid,
                    status=w.proc.returncode,
                    tail=w.tail(),
                    log=w.log.name,
                )
                self.start(w.slot)

    def stop(self) -> list[str]:
        """Graceful stop (SIGTERM, running tasks finish); SIGKILL what outlives the grace."""
        notes = []
        live = self.live()
        for w in live:
            w.proc.send_signal(signal.SIGTERM)
        for w in live:
            try:
                w.proc.wait(timeout=GRACE + 15)
            except subprocess.TimeoutExpired:
                notes.append(f"worker {w.pid} ignored SIGTERM for {GRACE + 15:.0f}s")
            w.killed = True
            if w.proc.returncode not in (0, None):
                notes.append(f"worker {w.pid} stopped with status {w.proc.returncode}")
        self.kill_all()
        return notes

    def kill_all(self) -> None:
        for w in self.workers:
            with suppress(ProcessLookupError, PermissionError):
                os.killpg(w.pid, signal.SIGKILL)
            if w.proc.poll() is None:
                w.proc.wait()


def children_of(pid: int) -> list[int]:
    """Child pids of ``pid``, from every thread's ``children`` file (prefork respawns come
    from the collector thread)."""
    pids: list[int] = []
    for path in Path(f"/proc/{pid}/task").glob("*/children"):
        try:
            pids += [int(p) for p in path.read_text().split()]
        except OSError:
            continue
    return pids


# -- faults ---------------------------------------------------------------------------------
class Faults:
    """Injects one fault at a time, each journalled with its time and its target."""

    def __init__(
        self,
        rng: random.Random,
        fleet: Fleet,
        broker: Broker,
        proxy: FaultProxy | None,
        journal: Path,
        restart_gap: float,
        allowed: tuple[str, ...],
        tail: JournalTail,
    ) -> None:
        self.rng = rng
        self.tail = tail
        self.fleet = fleet
        self.broker = broker
        self.proxy = proxy
        self.journal = journal
        self.restart_gap = restart_gap
        self.cut_until = 0.0
        self.last_restart = 0.0
        possible = {EXECUTOR_KILL, WORKER_KILL}
        if proxy is not None:
            possible.add(CUT)
        if broker.restartable:
            possible.add(RESTART)
        self.kinds = [k for k in allowed if k in possible]
        # The first faults: one of each kind, so that even a short run has every kind.
        self.pending = rng.sample(self.kinds, len(self.kinds))

    def inject_one(self) -> str | None:
        """Inject a fault of a kind chosen by weight (one of each first); return its kind."""
        if not self.kinds:
            return None
        kind = self.pending[0] if self.pending else self._choose()
        done = {
            EXECUTOR_KILL: self.kill_executor,
            WORKER_KILL: self.kill_worker,
            CUT: self.cut,
            RESTART: self.restart,
        }[kind]()
        if self.pending and kind == self.pending[0]:
            first = self.pending.pop(0)
            if not done:  # not possible now (no child old enough…): after the others
                self.pending.append(first)
        return kind if done else None

    def _choose(self) -> str:
        weights = [WEIGHTS[k] for k in self.kinds]
        return self.rng.choices(self.kinds, weights)[0]

    def _fault(self, kind: str, t0: float, t1: float, **fields: Any) -> None:
        record(self.journal, "fault", kind=kind, t0=t0, t1=t1, **fields)

    def kill_executor(self) -> bool:
        """SIGKILL a prefork child that has run a task: busy or idle, but ready.  One still
        starting tests nothing about delivery; killing those trips the worker's start-up guard
        ("prefork children keep dying at start") instead."""
        ready = self.tail.executors
        candidates = [
            (w, c)
            for w in self.fleet.live()
            if w.pool == "prefork"
            for c in children_of(w.pid)
            if c in ready
        ]
        if not candidates:
            return False
        w, child = self.rng.choice(candidates)
        t0 = time.time()
        with suppress(ProcessLookupError, PermissionError):
            os.kill(child, signal.SIGKILL)
        self._fault(EXECUTOR_KILL, t0, time.time(), victim=child, worker=w.pid)
        return True

    def kill_worker(self) -> bool:
        live = self.fleet.live()
        if not live:
            return False
        w = self.rng.choice(live)
        children = children_of(w.pid)
        t0 = time.time()
        self.fleet.kill(w)
        self._fault(WORKER_KILL, t0, time.time(), victim=w.pid, worker=w.pid, children=children)
        self.fleet.start(w.slot)
        return True

    def cut(self) -> bool:
        if self.proxy is None or time.time() < self.cut_until:
            return False
        how = self.rng.choice(("reset", "reset", "blackhole"))
        duration = round(self.rng.uniform(0.5, 3.0), 2)
        t0 = time.time()
        if how == "reset":
            self.proxy.reset(duration)  # RST every connection, refuse new ones meanwhile
        else:
            self.proxy.blackhole(duration)  # nothing gets through; reset when it ends
        self.cut_until = t0 + duration
        self._fault(CUT, t0, self.cut_until, how=how)
        return True

    def restart(self) -> bool:
        now = time.time()
        if not self.broker.restartable or now - self.last_restart < self.restart_gap:
            return False
        record(self.journal, "fault-begin", kind=RESTART)
        self.broker.restart()
        self.last_restart = time.time()
        self._fault(RESTART, now, self.last_restart)
        return True

    def heal(self) -> None:
        if self.proxy is not None:
            self.proxy.heal()


class JournalTail:
    """Follows the journal as it grows (reads only the new bytes): how many tasks completed,
    and which executor processes have started a task (so are ready)."""

    _START = re.compile(rb'"ev": "start", "pid": (\d+)')

    def __init__(self, path: Path) -> None:
        self.path = path
        self.offset = 0
        self.ends = 0
        self.executors: set[int] = set()

    def poll(self) -> int:
        if not self.path.exists():
            return 0
        with self.path.open("rb") as f:
            f.seek(self.offset)
            chunk = f.read()
        whole = chunk[: chunk.rfind(b"\n") + 1]
        self.offset += len(whole)
        self.ends += whole.count(b'"ev": "end"')
        self.executors.update(int(pid) for pid in self._START.findall(whole))
        return self.ends


# -- one run --------------------------------------------------------------------------------
class Publisher:
    """Publishes the run's tasks at a steady rate while the faults go on, straight to the broker.

    Paced, so that a run lasts ``tasks / rate`` seconds whatever the broker's speed, and the
    faults (every ``--fault-every`` s) fall among tasks in flight and held in prefetch buffers.  Ids are chosen here, so a
    batch whose publish failed (the broker restarting) is sent again under the same ids; it is
    journalled (``publish-failed``) and may then exist twice.  A ``slow`` fraction of the tasks
    sleeps 0.02-0.2 s so that kills and cuts find tasks running; the others return at once.
    """

    def __init__(
        self, broker: Broker, queue: str, mode: Ack, tasks: int, rate: float, slow: float,
        rng: random.Random, journal: Path,
    ) -> None:  # fmt: skip
        self.broker = broker
        self.queue = queue
        self.mode = mode
        self.tasks = tasks
        self.rate = rate
        self.slow = slow
        self.rng = rng
        self.journal = journal
        self.sent = 0
        self.started = 0.0
        self.pending: list[Any] = []
        self.app = build_app(broker.driver_url())

    @property
    def done(self) -> bool:
        return self.sent >= self.tasks and not self.pending

    def tick(self) -> None:
        """Publish what is due by now (at most one batch): a burst every BURST seconds, so
        that the queue has a backlog for the workers' prefetch buffers to fill from."""
        now = time.monotonic()
        self.started = self.started or now
        bursts = int((now - self.started) / BURST) + 1
        due = min(self.tasks, int(bursts * BURST * self.rate))
        if not self.pending and due > self.sent:
            self.pending = self._calls(self.sent, min(due, self.sent + PUBLISH_BATCH))
            self.sent += len(self.pending)
        if self.pending:
            self._send()

    def _calls(self, first: int, last: int) -> list[Any]:
        task = self.app.tasks[task_name(self.mode)]
        calls = []
        for i in range(first, last):
            plan = (
                {"sleep": round(self.rng.uniform(0.02, 0.2), 3)}
                if self.rng.random() < self.slow
                else {}
            )
            sig = task.s(f"k{i}", plan)
            options = {"queue": self.queue, "id": uuid.uuid4().hex}
            calls.append(type(sig)(sig.task, sig.args, sig.kwargs, options))
        return calls

    def _send(self) -> None:
        ids = [c.options["id"] for c in self.pending]
        try:
            self.app.send_many(self.pending)
        except AdapterError as exc:  # the outcome is unknown: send them again, same ids
            record(self.journal, "publish-failed", ids=ids, error=str(exc))
            self.reopen()
            return
        record(self.journal, "publish-ok", ids=ids)
        self.pending = []

    def reopen(self) -> None:
        """A fresh connection (after a broker restart)."""
        self.app.close()
        self.app = build_app(self.broker.driver_url())

    def close(self) -> None:
        self.app.close()


def worker_env(url: str, journal: Path, gates: Path) -> dict[str, str]:
    env = dict(os.environ)
    env.update(
        ACKWISE_BROKER_URL=url,
        ACKWISE_CONFORMANCE_JOURNAL=str(journal),
        ACKWISE_CONFORMANCE_GATES=str(gates),
        ACKWISE_LOGLEVEL="INFO",
        ACKWISE_PLUGINS="soak_plugin",
        PYTHONPATH=os.pathsep.join(
            p for p in (str(BENCH_DIR / "soakbench"), env.get("PYTHONPATH", "")) if p
        ),
    )
    return env


def settled(st: QueueStats) -> bool:
    return st.ready == 0 and st.in_flight == 0 and st.delayed == 0


def read_stats(url: str, queue: str, adapter: list[Adapter]) -> QueueStats | None:
    """The queue's stats through a driver adapter, reopened after a broker error."""
    try:
        if not adapter:
            adapter.append(open_driver_adapter(url, queue))
        return adapter[0].stats(queue)
    except AdapterError:
        if adapter:
            with suppress(AdapterError):
                adapter.pop().close()
        return None


def run_faults(
    faults: Faults, fleet: Fleet, publisher: Publisher, ends: JournalTail, s: Settings,
    say: Callable[..., None],
) -> None:  # fmt: skip
    """Publish at the set rate and inject faults at random intervals until every task was
    published (or nothing completes for half the drain timeout: the drain then reports)."""
    rng = faults.rng
    next_at = time.monotonic() + rng.uniform(0.5, 1.5) * s.fault_every
    progress = (0, time.monotonic())
    while not publisher.done:
        publisher.tick()
        if ends.poll() > progress[0]:
            progress = (ends.ends, time.monotonic())
        elif time.monotonic() - progress[1] > s.drain_timeout / 2:
            say(f"  no completion for {s.drain_timeout / 2:.0f}s: faults stopped")
            break
        fleet.replace_exited()
        if time.monotonic() < next_at:
            time.sleep(0.02)
            continue
        kind = faults.inject_one()
        if kind == RESTART:
            publisher.reopen()  # its connection died with the broker
        if kind:
            say(f"  fault {kind} ({publisher.sent:,} published, {ends.ends:,} completed)")
        next_at = time.monotonic() + rng.uniform(0.5, 1.5) * s.fault_every
    faults.heal()
    while not publisher.done:  # what a stall left unpublished
        publisher.tick()
        time.sleep(0.02)


def drain(
    url: str, queue: str, fleet: Fleet, journal: Path, timeout: float
) -> tuple[bool, QueueStats | None]:
    """Wait until the broker holds nothing for the queue and the journal stays still."""
    adapter: list[Adapter] = []
    deadline = time.monotonic() + timeout
    quiet_since: float | None = None
    size = -1
    st: QueueStats | None = None
    try:
        while time.monotonic() < deadline:
            fleet.replace_exited()
            st = read_stats(url, queue, adapter)
            now_size = journal.stat().st_size
            if st is not None and settled(st) and now_size == size:
                quiet_since = quiet_since or time.monotonic()
                if time.monotonic() - quiet_since >= QUIET:
                    return True, st
            else:
                quiet_since = None
            size = now_size
            time.sleep(0.5)
        return False, st
    finally:
        for a in adapter:
            with suppress(AdapterError):
                a.close()


def harvest_worker_logs(fleet: Fleet, journal: Path) -> None:
    """Copy what the worker logs say into the journal: stale receipts (they name the message)
    and failed broker calls with their backoff (when each worker was connected again)."""
    with journal.open("a") as f:
        for w in fleet.workers:
            for rec in soak_check.worker_log_records(w.log, w.pid):
                f.write(json.dumps(rec) + "\n")


def read_dead(url: str, queue: str, limit: int) -> tuple[list[DeadLetter], QueueStats]:
    adapter = open_driver_adapter(url, queue)
    try:
        return list(adapter.dead_letters(queue, limit=limit)), adapter.stats(queue)
    finally:
        adapter.close()


@dataclass
class Phases:
    """What the fleet did in one run: how long each phase took, what went wrong."""

    faults_s: float = 0.0
    drain_s: float = 0.0
    drained: bool = False
    stats: QueueStats | None = None
    notes: list[str] = field(default_factory=list)


def soak_one(
    broker: Broker, mode: Ack, s: Settings, root: Path, say: Callable[..., None]
) -> RunResult:
    """One (broker, mode) run: publish, soak under faults, drain, classify."""
    label = f"{broker.name}/{mode.value}"
    workdir = root / f"{broker.name}-{mode.value}"
    (workdir / "gates").mkdir(parents=True)
    journal = workdir / "journal.jsonl"
    rng = random.Random(f"{s.seed}-{broker.name}-{mode.value}")
    tasks = s.tasks_for(broker.name)
    queue = f"soak-{mode.value.replace('_', '-')}-{uuid.uuid4().hex[:8]}"
    url = broker.driver_url()
    open_driver_adapter(url, queue).close()
    t1 = time.monotonic()
    phases = run_fleet(broker, mode, queue, workdir, journal, rng, tasks, s, label, say)
    soak_s = time.monotonic() - t1
    dead, final = read_dead(url, queue, tasks + 1000)
    soak_check.save_dead(workdir / "dead.jsonl", dead)
    timeline = soak_check.read_timeline(journal)
    verdict = soak_check.classify(
        timeline, dead, mode, early_ack_memory=EARLY_ACK_MEMORY[broker.name]
    )
    verdict.notes += phases.notes
    verdict.notes.append(f"faults {phases.faults_s:.0f} s, drain {phases.drain_s:.0f} s")
    pending = []
    if not phases.drained:
        pending.append(
            f"drain timed out after {s.drain_timeout:.0f}s with {phases.stats} and "
            f"{verdict.lost} message(s) neither completed nor dead-lettered"
        )
    if not settled(final):
        pending.append(f"left at the broker after the workers stopped: {final}")
    result = RunResult(
        broker.name, mode, tasks, verdict, soak_s, phases.drained, "; ".join(pending),
        workdir,
    )  # fmt: skip
    result.details = explain_findings(verdict, timeline)
    say(f"{label}: {summary(result)} in {soak_s:.0f}s")
    return result


def run_fleet(
    broker: Broker,
    mode: Ack,
    queue: str,
    workdir: Path,
    journal: Path,
    rng: random.Random,
    tasks: int,
    s: Settings,
    label: str,
    say: Callable[..., None],
) -> Phases:
    """Start the workers behind a fault proxy; publish and inject faults; drain; stop."""
    phases = Phases()
    proxy = start_proxy(broker)
    args = ["-Q", queue, "-c", str(s.concurrency), "--lease", str(LEASES[broker.name])]
    args += ["--broker-timeout", "600", "--grace", str(GRACE)]
    env = worker_env(broker.worker_url(proxy), journal, workdir / "gates")
    fleet = Fleet(workdir, journal, env, args)
    try:
        for slot in range(s.workers):
            fleet.start(slot)
        fleet.wait_ready(120)
        t0 = time.monotonic()
        ends = JournalTail(journal)
        faults = Faults(rng, fleet, broker, proxy, journal, s.restart_gap, s.kinds, ends)
        rate = s.rate_for(broker.name)
        publisher = Publisher(broker, queue, mode, tasks, rate, s.slow_fraction, rng, journal)
        try:
            run_faults(faults, fleet, publisher, ends, s, say)
        finally:
            publisher.close()
        say(f"{label}: {tasks:,} published, faults stopped at {ends.ends:,} completions; draining")
        t1 = time.monotonic()
        phases.drained, phases.stats = drain(
            broker.driver_url(), queue, fleet, journal, s.drain_timeout
        )
        phases.faults_s, phases.drain_s = t1 - t0, time.monotonic() - t1
        phases.notes += fleet.stop()
        harvest_worker_logs(fleet, journal)
    finally:
        fleet.kill_all()
        if proxy is not None:
            proxy.stop()
    return phases


def explain_findings(v: Verdict, tl: soak_check.Timeline, examples: int = 2) -> list[str]:
    """The findings grouped by kind, each group with a few examples and their evidence: the
    message's journal lines and the faults injected near them."""
    groups: dict[tuple[str, str], list[soak_check.Finding]] = {}
    for finding in v.findings:
        groups.setdefault((finding.verdict, finding.what), []).append(finding)
    out = []
    for (verdict, what), findings in groups.items():
        out.append(f"{verdict} {what}: {len(findings)} finding(s)")
        out += [evidence(finding, tl) for finding in findings[:examples]]
    return out


def evidence(finding: soak_check.Finding, tl: soak_check.Timeline) -> str:
    lines = tl.lines_for(finding.id) if finding.id != "-" else []
    times = [float(x) for x in _times(lines)]
    near = [
        tl.describe_fault(f)
        for f in tl.faults
        if times and min(times) - 10 <= f.t1 and f.t0 <= max(times) + 10
    ][:12]
    return (
        f"  {finding.id}: {finding.why}\n"
        + "".join(f"      {line}\n" for line in [*finding.detail.splitlines(), *lines[:20]])
        + (f"      faults nearby: {'; '.join(near)}\n" if near else "")
    )


def _times(lines: list[str]) -> Iterator[str]:
    for line in lines:
        _, _, rest = line.partition('"t": ')
        if rest:
            yield rest.split(",")[0].split("}")[0]


# -- the report -----------------------------------------------------------------------------
def summary(r: RunResult) -> str:
    v = r.verdict
    return (
        f"{v.ok:,} ok, {v.duplicated} duplicated, {v.lost} lost, dead {dict(v.dead) or 0}, "
        f"{v.runs:,} runs, faults {dict(v.faults)}, " + ("FAIL" if failed(r) else "explained")
    )


def failed(r: RunResult) -> bool:
    return r.verdict.failed or not r.drained or bool(r.pending)


def dead_cell(v: Verdict) -> str:
    if not v.dead:
        return "0"
    return ", ".join(f"{n} {reason}" for reason, n in sorted(v.dead.items()))


def table(results: list[RunResult]) -> list[str]:
    lines = [
        "| broker | mode | tasks | runs | ok | duplicated (explained) | lost (explained) "
        "| running at a kill | lost: early ack cut off too long | dead-lettered | executor kills "
        "| worker kills | cuts | restarts | duration | verdict |",
        "|---|---|---:|---:|---:|---:|---:|---:|---:|---|---:|---:|---:|---:|---:|---|",
    ]
    for r in results:
        v = r.verdict
        verdict = "FAIL" if failed(r) else "ok"
        lines.append(
            f"| {r.broker} | {r.mode.name} | {r.tasks:,} | {v.runs:,} | {v.ok:,} "
            f"| {v.duplicated} ({v.duplicated_explained}) | {v.lost} ({v.lost_explained}) "
            f"| {v.running_at_kill} | {v.lost_early_ack} | {dead_cell(v)} "
            f"| {v.faults[EXECUTOR_KILL]} "
            f"| {v.faults[WORKER_KILL]} | {v.faults[CUT]} | {v.faults[RESTART]} "
            f"| {r.soak_s:.0f} s | {verdict} |"
        )
    return lines


def breakdown(r: RunResult) -> str:
    v = r.verdict
    causes = (
        ", ".join(f"{what} {n}" for what, n in sorted(v.causes.items())) or "nothing to explain"
    )
    extra = f"; redeliveries without a run and without a fault nearby: {v.quiet_redeliveries}"
    notes = "".join(f"; {n}" for n in v.notes)
    pending = f"; **{r.pending}**" if r.pending else ""
    return f"- {r.broker}/{r.mode.name}: {causes}{extra}{notes}{pending}"


def git(*args: str) -> str:
    try:
        out = subprocess.run(["git", *args], cwd=REPO, capture_output=True, text=True, check=True)
    except (OSError, subprocess.CalledProcessError):
        return "?"
    return out.stdout.strip()


def tree_state() -> str:
    """HEAD, and a hash of the uncommitted changes to the code under test."""
    head = git("rev-parse", "--short", "HEAD")
    diff = git("diff", "HEAD", "--", "core", "adapters", "contrib")
    if not diff or diff == "?":
        return head
    digest = hashlib.sha256(diff.encode()).hexdigest()[:12]
    return f"{head} + uncommitted changes in core/, adapters/ or contrib/ (diff sha256 {digest})"


def cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "?"


def render(
    results: list[RunResult],
    s: Settings,
    command: str,
    tree: tuple[str, str],
    load: tuple[float, float],
    elapsed: float,
) -> str:
    changed = "" if tree[1] == tree[0] else f", {tree[1]} at the end (the code changed meanwhile)"
    lines = [
        "# Chaos soak: lost, duplicated, dead-lettered under kills, cuts and restarts",
        "",
        f"Run {dt.datetime.now(dt.UTC).strftime('%Y-%m-%d %H:%M UTC')}, git {tree[0]} at the "
        f"start{changed}; {elapsed / 60:.1f} min.",
        "",
        f"Machine: {platform.python_implementation()} {platform.python_version()}, "
        f"{os.cpu_count()} CPUs ({cpu_model()}), {platform.system()} {platform.release()}; "
        f"load average {load[0]:.2f} at the start, {load[1]:.2f} at the end.",
        "",
        f"Command: `{command}`",
        "",
        f"Setup per run: {s.workers} worker processes x {s.concurrency} slots (pools "
        f"{', '.join(POOLS[i % len(POOLS)] for i in range(s.workers))}), automatic prefetch, "
        f"leases {', '.join(f'{b} {LEASES[b]:.0f} s' for b in BROKERS)} (RabbitMQ: the "
        f"connection, 2 s heartbeats); tasks published at {s.rate:,.0f}/s (SQS "
        f"{s.sqs_rate:,.0f}/s), in a burst every {BURST:.0f} s, while the faults go on, {s.slow_fraction:.0%} of them sleep "
        f"0.02-0.2 s, the rest return at once; a fault every {s.fault_every:.1f} s on average "
        f"(x0.5-1.5) until all are published, weights "
        f"{', '.join(f'{k} {w:.0f}' for k, w in WEIGHTS.items())}, restarts at least "
        f"{s.restart_gap:.0f} s apart; seed {s.seed}.",
        "",
        *table(results),
        "",
        "What the duplicates, losses and dead letters were explained by:",
        "",
        *[breakdown(r) for r in results],
        "",
    ]
    bad = [r for r in results if r.details]
    if bad:
        lines += ["## Findings", ""]
        for r in bad:
            lines += [f"### {r.broker}/{r.mode.name}", "", "```", *r.details, "```", ""]
    return "\n".join(lines)


# -- main -----------------------------------------------------------------------------------
def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--brokers", default=",".join(BROKERS))
    p.add_argument("--modes", default=",".join(MODES))
    p.add_argument("--tasks", type=int, default=100_000)
    p.add_argument("--sqs-tasks", type=int, default=None, help="default: --tasks / 10")
    p.add_argument("--workers", type=int, default=4)
    p.add_argument("--concurrency", type=int, default=2)
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--rate", type=float, default=250.0, help="tasks published per second")
    p.add_argument("--sqs-rate", type=float, default=50.0)
    p.add_argument("--fault-every", type=float, default=2.0, help="mean seconds between faults")
    p.add_argument("--restart-gap", type=float, default=30.0)
    p.add_argument("--slow-fraction", type=float, default=0.01)
    p.add_argument("--drain-timeout", type=float, default=300.0)
    p.add_argument(
        "--faults",
        default=",".join(WEIGHTS),
        help="fault kinds to inject (default: all the broker can have)",
    )
    p.add_argument("--write", action="store_true", help="write bench/results-soak.md")
    p.add_argument("--out", default=None, help="write the results here instead")
    p.add_argument("--keep", action="store_true", help="keep the journals and worker logs")
    args = p.parse_args()
    for option, known in (
        ("brokers", BROKERS),
        ("modes", tuple(MODES)),
        ("faults", tuple(WEIGHTS)),
    ):
        unknown = [x for x in getattr(args, option).split(",") if x and x not in known]
        if unknown:
            p.error(f"--{option}: unknown {', '.join(unknown)} (known: {', '.join(known)})")
    return args


def main() -> int:
    args = parse_args()
    s = Settings(
        tasks=args.tasks,
        sqs_tasks=args.sqs_tasks if args.sqs_tasks is not None else max(1, args.tasks // 10),
        workers=args.workers,
        concurrency=args.concurrency,
        seed=args.seed,
        rate=args.rate,
        sqs_rate=args.sqs_rate,
        fault_every=args.fault_every,
        restart_gap=args.restart_gap,
        slow_fraction=args.slow_fraction,
        drain_timeout=args.drain_timeout,
        kinds=tuple(k for k in args.faults.split(",") if k in WEIGHTS),
    )
    brokers = [b for b in args.brokers.split(",") if b]
    modes = [MODES[m] for m in args.modes.split(",") if m]
    command = " ".join(["uv run python bench/soak.py", shlex.join(sys.argv[1:])]).strip()

    def say(text: str) -> None:
        print(text, file=sys.stderr, flush=True)

    started = time.monotonic()
    load_start = os.getloadavg()[0]
    tree_start = tree_state()
    root = Path(tempfile.mkdtemp(prefix="ackwise-soak-"))
    results: list[RunResult] = []
    try:
        for name in brokers:
            broker = Broker(name, root / f"{name}-broker")
            try:
                for mode in modes:
                    result = soak_one(broker, mode, s, root, say)
                    results.append(result)
                    if not (args.keep or failed(result)):  # ~60 MB of journal per 100,000
                        shutil.rmtree(result.workdir, ignore_errors=True)
            finally:
                broker.stop()
    finally:
        keep = (
            args.keep or any(failed(r) for r in results) or len(results) < len(brokers) * len(modes)
        )
        if keep:
            say(f"journals and worker logs kept in {root}")
        else:
            shutil.rmtree(root, ignore_errors=True)
    text = render(
        results,
        s,
        command,
        (tree_start, tree_state()),
        (load_start, os.getloadavg()[0]),
        time.monotonic() - started,
    )
    out = args.out or (str(BENCH_DIR / "results-soak.md") if args.write else None)
    if out:
        Path(out).write_text(text)
    print(text)
    return 1 if any(failed(r) for r in results) else 0


if __name__ == "__main__":
    sys.exit(main())
