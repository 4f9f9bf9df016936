"""The processes of a case: ``ackwise worker`` (or an in-process worker on the memory broker)
and ``ackwise beat``, started, signalled, stopped and read back by the harness."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from ackwise.testing import InProcessWorker
from ackwise_conformance.helpers import eventually
from ackwise_conformance.verdicts import NotApplicable, ScenarioFailed

__all__ = ["BeatHandle", "CaseDirectory", "Fire", "WorkerHandle", "process_stopped"]


class CaseDirectory(Protocol):
    """What a process handle needs of its case (a :class:`~ackwise_conformance.harness.Harness`):
    the directory its log goes in."""

    @property
    def workdir(self) -> Path: ...


def process_stopped(pid: int) -> bool:
    """Whether process ``pid`` is stopped (a SIGSTOP took effect), from ``/proc``."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rpartition(")")[2].split()[0] in ("T", "t")


class WorkerHandle:
    """One ``ackwise worker`` process (or an in-process worker for the memory broker)."""

    def __init__(
        self,
        harness: CaseDirectory,
        index: int,
        args: Sequence[str],
        env: dict[str, str],
        *,
        in_process: InProcessWorker | None = None,
    ) -> None:
        self.harness = harness
        self.index = index
        self.log = harness.workdir / f"worker-{index}.log"
        self.in_process = in_process
        self.proc: subprocess.Popen[bytes] | None = None
        if in_process is None:
            self.proc = _spawn("worker", "ackwise_conformance.workload:app", args, env, self.log)

    @property
    def pid(self) -> int:
        if self.proc is None:
            return os.getpid()
        return self.proc.pid

    def output(self) -> str:
        return self.log.read_text(errors="replace") if self.log.exists() else ""

    def wait_ready(self, timeout: float) -> WorkerHandle:
        if self.proc is None:
            return self
        _wait_started(self.proc, "ready:", timeout, f"worker {self.index}", self.output)
        return self

    def alive(self) -> bool:
        return self.proc.poll() is None if self.proc is not None else True

    def stopped(self) -> bool:
        """Whether the worker process is stopped (SIGSTOP took effect)."""
        return self.proc is not None and process_stopped(self.proc.pid)

    def signal(self, sig: int) -> None:
        if self.proc is None:
            raise NotApplicable("signals need worker processes")
        if self.proc.poll() is None:
            os.kill(self.proc.pid, sig)

    def kill(self) -> None:
        """SIGKILL the whole worker (its executor children die with it) and reap it."""
        self.signal(signal.SIGKILL)
        self.wait(10)

    def terminate(self) -> None:
        """SIGTERM: a graceful stop."""
        if self.in_process is not None:
            self.in_process.worker.request_stop()
            return
        self.signal(signal.SIGTERM)

    def wait(self, timeout: float) -> int | None:
        if self.in_process is not None:
            return self.in_process.stop(timeout)
        assert self.proc is not None
        return _exit_status(self.proc, timeout, f"worker {self.index}", self.output)

    def close(self) -> None:
        if self.in_process is not None:
            self.in_process.stop(30)
            return
        assert self.proc is not None
        _kill_and_reap(self.proc)


@dataclass(frozen=True)
class Fire:
    """One message a beat process enqueued, as read back from the queue."""

    schedule: str
    fire_time: str
    #: ``fire_time`` in microseconds since the Unix epoch.
    fire_us: int
    fence: int
    key: str
    #: When the beat published it (the envelope's ``created_at``, wall clock).
    published_at: float


class BeatHandle:
    """One ``ackwise beat`` process running ``ackwise_conformance.beat_workload:app``."""

    def __init__(
        self, harness: CaseDirectory, index: int, args: Sequence[str], env: dict[str, str]
    ):
        self.harness = harness
        self.index = index
        self.log = harness.workdir / f"beat-{index}.log"
        self.proc = _spawn("beat", "ackwise_conformance.beat_workload:app", args, env, self.log)

    @property
    def pid(self) -> int:
        return self.proc.pid

    def output(self) -> str:
        return self.log.read_text(errors="replace") if self.log.exists() else ""

    def wait_ready(self, timeout: float) -> BeatHandle:
        _wait_started(self.proc, "beat ready", timeout, f"beat {self.index}", self.output)
        return self

    def alive(self) -> bool:
        return self.proc.poll() is None

    def signal(self, sig: int) -> None:
        if self.proc.poll() is None:
            os.kill(self.proc.pid, sig)

    def stopped(self) -> bool:
        """Whether the process is stopped (SIGSTOP took effect)."""
        return process_stopped(self.pid)

    def terminate(self) -> None:
        self.signal(signal.SIGTERM)

    def wait(self, timeout: float) -> int:
        return _exit_status(self.proc, timeout, f"beat {self.index}", self.output)

    def close(self) -> None:
        _kill_and_reap(self.proc)


def _spawn(
    command: str, app: str, args: Sequence[str], env: dict[str, str], log_path: Path
) -> subprocess.Popen[bytes]:
    """``ackwise <command> <app> <args>`` with its output appended to ``log_path``."""
    with open(log_path, "ab") as log:
        return subprocess.Popen(
            [sys.executable, "-m", "ackwise", command, app, *args],
            env=env,
            stdout=log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
        )


def _wait_started(
    proc: subprocess.Popen[bytes],
    marker: str,
    timeout: float,
    name: str,
    output: Callable[[], str],
) -> None:
    eventually(
        lambda: marker in output() or proc.poll() is not None,
        timeout,
        description=f"{name} to start",
    )
    if proc.poll() is not None:
        raise ScenarioFailed(f"{name} exited at start:\n{output()[-3000:]}")


def _exit_status(
    proc: subprocess.Popen[bytes], timeout: float, name: str, output: Callable[[], str]
) -> int:
    try:
        return proc.wait(timeout)
    except subprocess.TimeoutExpired:
        raise ScenarioFailed(
            f"{name} did not exit within {timeout:.1f}s:\n{output()[-3000:]}"
        ) from None


def _kill_and_reap(proc: subprocess.Popen[bytes]) -> None:
    """SIGKILL (after a SIGCONT, should it be stopped) and reap ``proc`` if it still runs."""
    if proc.poll() is None:
        try:
            os.kill(proc.pid, signal.SIGCONT)
            proc.kill()
        except ProcessLookupError:
            pass
        proc.wait(10)
