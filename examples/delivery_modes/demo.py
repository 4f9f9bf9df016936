"""The delivery contract made visible: real workers, real SIGKILLs, on the embedded SQLite broker.

For each mode (EARLY, LATE, REJECT_ON_LOST) it sends ordinary tasks and two victims, then:

1. kills the executor child running the first victim (the supervisor lives);
2. kills the whole worker while it runs the second victim, and starts a new worker;
3. stops the new worker gracefully (SIGTERM);

and prints what happened to every task, checked against the delivery contract (docs/semantics.md). Exit status 0 when every
mode kept its contract.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
LEASE = 2.0
MODES = ["EARLY", "LATE", "REJECT_ON_LOST"]
EXPECTED = {
    ("EARLY", "executor killed"): "lost",
    ("LATE", "executor killed"): "dead-lettered (worker_lost)",
    ("REJECT_ON_LOST", "executor killed"): "redelivered, ran (attempt 2)",
    ("EARLY", "worker killed"): "lost",
    ("LATE", "worker killed"): "redelivered, ran (attempt 2)",
    ("REJECT_ON_LOST", "worker killed"): "redelivered, ran (attempt 2)",
}


def say(text: str) -> None:
    print(text, flush=True)


def eventually(predicate: Callable[[], Any], timeout: float, what: str) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.05)
    raise SystemExit(f"demo: timed out waiting for {what}")


class Demo:
    def __init__(self, workdir: Path) -> None:
        self.workdir = workdir
        self.db = workdir / "demo.db"
        self.journal = workdir / "journal.jsonl"
        os.environ["ACKWISE_BROKER_URL"] = f"sqlite:///{self.db}"
        os.environ["DEMO_JOURNAL"] = str(self.journal)
        sys.path.insert(0, str(HERE))
        import tasks

        self.tasks = tasks
        self.adapter = tasks.app.adapter()
        self.adapter.open()
        self.workers: list[subprocess.Popen[bytes]] = []

    def records(self, **match: Any) -> list[dict[str, Any]]:
        if not self.journal.exists():
            return []
        rows = [json.loads(line) for line in self.journal.read_text().splitlines()]
        return [r for r in rows if all(r.get(k) == v for k, v in match.items())]

    def start_worker(self, name: str) -> subprocess.Popen[bytes]:
        log = open(self.workdir / f"{name}.log", "wb")  # noqa: SIM115 - lives with the process
        proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "ackwise",
                "worker",
                "tasks:app",
                "--pool",
                "prefork",
                "-c",
                "3",
                "--lease",
                str(LEASE),
                "--grace",
                "10",
            ],
            cwd=HERE,
            stdout=log,
            stderr=subprocess.STDOUT,
        )
        self.workers.append(proc)
        eventually(
            lambda: "ready:" in (self.workdir / f"{name}.log").read_text(), 60, f"{name} to start"
        )
        say(f"  started {name} (pid {proc.pid}): prefork, 3 executor processes, lease {LEASE:.0f}s")
        return proc

    def send(self, mode: str, label: str, victim: bool = False) -> None:
        self.tasks.app.tasks[f"demo.work.{mode}"].delay(label, victim=victim)

    def run(self) -> int:
        say("ackwise delivery-modes demo on the embedded SQLite broker")
        say(f"  broker: sqlite:///{self.db}\n")
        say("Sending 3 ordinary tasks per mode, then starting a worker.")
        for mode in MODES:
            for i in range(3):
                self.send(mode, f"task-{i}")
        w1 = self.start_worker("worker-1")
        eventually(lambda: len(self.records(event="end")) >= 9, 30, "the ordinary tasks")

        say("\n1. SIGKILL the executor process running a task (the worker's supervisor lives).")
        for mode in MODES:
            self.send(mode, "executor killed", victim=True)
            start = eventually(
                lambda m=mode: self.records(event="start", mode=m, label="executor killed"),
                30,
                f"the {mode} victim to start",
            )[0]
            os.kill(start["pid"], signal.SIGKILL)
            say(f"  {mode:<15} killed executor pid {start['pid']} mid-task")
        time.sleep(2.0)  # the supervisor notices at once; give the re-run a moment

        say("\n2. SIGKILL the whole worker while it runs a task; start another worker.")
        for mode in MODES:
            self.send(mode, "worker killed", victim=True)
        eventually(
            lambda: len(self.records(event="start", label="worker killed")) >= 3,
            30,
            "the victims to start",
        )
        w1.send_signal(signal.SIGKILL)
        w1.wait()
        say(f"  killed worker-1 (pid {w1.pid}) with 3 tasks running")
        w2 = self.start_worker("worker-2")
        say(f"  waiting for the dead worker's leases ({LEASE:.0f}s) to expire...")
        eventually(
            lambda: len(self.records(event="end", label="worker killed")) >= 2,
            30,
            "the redeliveries",
        )
        time.sleep(LEASE + 1.0)  # long enough for an (incorrect) early redelivery to show

        say("\n3. SIGTERM worker-2: graceful stop.")
        w2.send_signal(signal.SIGTERM)
        code = w2.wait(30)
        say(f"  worker-2 exited with status {code}")
        return self.report()

    def outcome(self, mode: str, label: str) -> str:
        starts = self.records(event="start", mode=mode, label=label)
        ends = self.records(event="end", mode=mode, label=label)
        dead = [
            d
            for d in self.adapter.dead_letters("default", limit=1000)
            if json.loads(d.body).get("task") == f"demo.work.{mode}"
            and json.loads(d.body)["args"][0] == label
        ]
        if dead:
            return f"dead-lettered ({dead[0].reason})"
        if ends:
            last = max(e["attempt"] for e in ends)
            if len(starts) == 1:
                return "ran once"
            return f"redelivered, ran (attempt {last})"
        return "lost"

    def report(self) -> int:
        stats = self.adapter.stats("default")
        say("\nWhat happened to every task:\n")
        say(f"  {'mode':<15} {'task':<18} {'executions':>10}  outcome")
        say(f"  {'-' * 15} {'-' * 18} {'-' * 10}  {'-' * 40}")
        ok = True
        for mode in MODES:
            for label in ["task-0", "task-1", "task-2", "executor killed", "worker killed"]:
                got = self.outcome(mode, label)
                expected = EXPECTED.get((mode, label), "ran once")
                mark = "ok" if got == expected else f"CONTRACT BROKEN: expected {expected}"
                ok &= got == expected
                runs = len(self.records(event="start", mode=mode, label=label))
                say(f"  {mode:<15} {label:<18} {runs:>10}  {got}  [{mark}]")
        say(
            f"\nBroker's own view: ready={stats.ready} delayed={stats.delayed} "
            f"in_flight={stats.in_flight} dead={stats.dead}"
        )
        say(
            "\nEARLY acks just before the task starts: at most once, so a crash loses it.\n"
            "LATE acks after the task: a dead worker's task comes back when its lease expires;\n"
            "  an executor killed under a live supervisor is dead-lettered (worker_lost), never looped.\n"
            "REJECT_ON_LOST is LATE, and re-runs a task whose executor died (up to max_deliveries)."
        )
        ok &= stats.ready == stats.in_flight == 0
        say("\nEvery mode kept its contract." if ok else "\nA contract was broken (see above).")
        return 0 if ok else 1

    def cleanup(self) -> None:
        for proc in self.workers:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
        self.adapter.close()


def main() -> int:
    with tempfile.TemporaryDirectory(prefix="ackwise-demo-") as tmp:
        demo = Demo(Path(tmp))
        try:
            return demo.run()
        finally:
            demo.cleanup()


if __name__ == "__main__":
    sys.exit(main())
