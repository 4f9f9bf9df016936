"""Helpers for tests that run real worker processes against a broker."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

HERE = Path(__file__).parent


def eventually(predicate: Callable[[], Any], timeout: float = 10.0, interval: float = 0.02) -> Any:
    """Poll ``predicate`` until it returns something truthy; fail after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() >= deadline:
            raise AssertionError(f"condition not met within {timeout}s: {predicate}")
        time.sleep(interval)


class Journal:
    def __init__(self, path: Path) -> None:
        self.path = path

    def lines(self, **match: Any) -> list[dict[str, Any]]:
        if not self.path.exists():
            return []
        out = []
        for raw in self.path.read_text().splitlines():
            rec = json.loads(raw)
            if all(rec.get(k) == v for k, v in match.items()):
                out.append(rec)
        return out


class WorkerProcess:
    """An ``ackwise worker`` process; its output is kept in a log file."""

    def __init__(self, env: dict[str, str], log: Path, *args: str) -> None:
        self.log = log
        self._log_file = open(log, "ab")  # noqa: SIM115 - closed in wait()
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "ackwise", "worker", "crashapp:app", *args],
            env=env,
            stdout=self._log_file,
            stderr=subprocess.STDOUT,
            cwd=str(HERE),
        )

    @property
    def pid(self) -> int:
        return self.proc.pid

    def output(self) -> str:
        return self.log.read_text(errors="replace")

    def wait_ready(self, timeout: float = 30.0) -> None:
        eventually(lambda: "ready:" in self.output() or self.proc.poll() is not None, timeout)
        assert self.proc.poll() is None, f"worker exited early:\n{self.output()}"

    def signal(self, sig: int) -> None:
        os.kill(self.proc.pid, sig)

    def wait(self, timeout: float = 30.0) -> int:
        try:
            return self.proc.wait(timeout)
        finally:
            self._log_file.close()

    def stop(self) -> None:
        if self.proc.poll() is None:
            try:
                os.kill(self.proc.pid, signal.SIGCONT)
                self.proc.kill()
            except ProcessLookupError:
                pass
        self.proc.wait(10)
        self._log_file.close()


def pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # A zombie still answers kill(0); look at its state.
    try:
        state = Path(f"/proc/{pid}/stat").read_text().split()[2]
    except FileNotFoundError:
        return False
    return state != "Z"
