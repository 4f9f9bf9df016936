"""Executors: where task bodies run, away from the consumer thread that owns the adapter.

Every executor reports to one completion queue that the consumer loop reads:

``("done", job_id, Result)``
    the task returned or raised;
``("lost", job_id, reason)``
    the process running it died (prefork only);
``("fatal", 0, message)``
    the executor cannot go on (children die before they are ready).
"""

from __future__ import annotations

import collections
import ctypes
import logging
import os
import queue
import selectors
import signal
import struct
import subprocess
import sys
import threading
import time
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import msgspec

from ackwise.app import _tracing
from ackwise.app._execution import Gate, Job, Result, Runner
from ackwise.contract import _logconfig
from ackwise.errors import ConfigurationError
from ackwise.plugins._manager import open_rate_limiter
from ackwise.stores._ratelimit import StartGate

if TYPE_CHECKING:
    from ackwise.app._app import App

log = logging.getLogger("ackwise.worker")

Completion = tuple[str, int, Any]

_FRAME = struct.Struct("<I")
_JOB = struct.Struct("<QIH")  # job id, attempt, receipt length; then receipt, then body
_READY = b"\x00ready"
#: How long a consumer yields to a thread it woke for a job (seconds): its wake-up takes
#: tens of microseconds.
_HAND_OVER = 0.0005


class Executor:
    """Base class: a fixed number of slots that run jobs."""

    kind = "?"

    def __init__(self, concurrency: int, completions: queue.SimpleQueue[Completion]) -> None:
        if concurrency < 1:
            raise ConfigurationError(f"concurrency must be >= 1, got {concurrency}")
        self.concurrency = concurrency
        self.completions = completions

    def start(self) -> None:
        raise NotImplementedError

    def free_slots(self) -> int:
        raise NotImplementedError

    def submit(self, job: Job) -> None:
        raise NotImplementedError

    def shutdown(self, *, cold: bool) -> None:
        raise NotImplementedError

    #: Whether a hard kill of one task is possible (prefork only).
    can_kill = False
    #: Whether jobs can wait in the executor for a slot (:attr:`ahead`, threads only).
    can_queue = False
    #: Jobs :meth:`free_slots` offers beyond the idle slots: they wait in the executor and
    #: start the moment a slot frees, without a round trip through the consumer loop.  The
    #: worker sets it (0: never).
    ahead = 0

    def waiting(self) -> int:
        """Jobs submitted beyond the idle slots, waiting for one (not started)."""
        return 0

    def let_start(self, job_id: int) -> None:
        """Give the job just handed to an idle slot its start before this thread goes on."""

    def withdraw(self, job_ids: Sequence[int]) -> list[int]:
        """Take back those of ``job_ids`` that wait for a slot; return their ids."""
        return []


class ThreadExecutor(Executor):
    """Tasks run on ``concurrency`` threads of the worker process (``--pool threads``/``solo``).

    Jobs beyond the idle threads (:attr:`~Executor.ahead`) wait in the job queue; a thread
    takes the next one as it finishes, and a job withdrawn before a thread took it is skipped.
    A job handed to an idle thread has started, whether or not that thread took it yet.

    :param gate: what a thread calls right before the function of a rate-limited task (see
        :class:`~ackwise.app._execution.Runner`).
    """

    kind = "threads"
    can_queue = True

    def __init__(
        self,
        app: App,
        concurrency: int,
        completions: queue.SimpleQueue[Completion],
        gate: Gate | None = None,
    ) -> None:
        super().__init__(concurrency, completions)
        self.app = app
        self.gate = gate
        self._jobs: queue.SimpleQueue[Job | None] = queue.SimpleQueue()
        self._threads: list[threading.Thread] = []
        self._busy = 0  # submitted and not finished: running or waiting
        #: Submitted and not started yet, by job id (a thread takes its job out to start it).
        self._waiting: dict[int, Job] = {}
        self._lock = threading.Lock()

    def start(self) -> None:
        for i in range(self.concurrency):
            t = threading.Thread(target=self._run, name=f"ackwise-executor-{i}", daemon=True)
            t.start()
            self._threads.append(t)

    def free_slots(self) -> int:
        return self.concurrency + self.ahead - self._busy

    def waiting(self) -> int:
        with self._lock:
            return len(self._waiting) - self._taken_next()

    def _taken_next(self) -> int:
        """How many of the oldest submitted jobs idle threads are about to take (lock held):
        those count as started, and a job handed to an idle thread is never withdrawn."""
        idle = self.concurrency - (self._busy - len(self._waiting))
        return min(len(self._waiting), max(0, idle))

    def submit(self, job: Job) -> None:
        with self._lock:
            self._busy += 1
            self._waiting[job.job_id] = job
        self._jobs.put(job)

    def let_start(self, job_id: int) -> None:
        # The woken thread needs the GIL, which this thread would keep until its next
        # blocking call (a log line's formatting, a broker round trip): yield it until that
        # thread took the job, for at most _HAND_OVER seconds.
        waiting, sleep = self._waiting, time.sleep
        deadline = time.perf_counter() + _HAND_OVER
        sleep(0)
        while job_id in waiting and time.perf_counter() < deadline:
            sleep(0)

    def withdraw(self, job_ids: Sequence[int]) -> list[int]:
        with self._lock:
            queued = set(list(self._waiting)[self._taken_next() :])
            taken = [i for i in job_ids if i in queued and self._waiting.pop(i, None) is not None]
            self._busy -= len(taken)
        return taken

    def _run(self) -> None:
        runner = Runner(self.app, self.gate)
        lock, waiting, completions = self._lock, self._waiting, self.completions
        try:
            while True:
                job = self._jobs.get()
                if job is None:
                    return
                with lock:
                    if waiting.pop(job.job_id, None) is None:
                        continue  # withdrawn before it started
                result = runner.run(job)
                with lock:
                    self._busy -= 1
                completions.put(("done", job.job_id, result))
        finally:
            runner.close()

    def shutdown(self, *, cold: bool) -> None:
        for _ in self._threads:
            self._jobs.put(None)
        if not cold:
            for t in self._threads:
                t.join()
        # Cold: threads cannot be killed; they die with the process.


class _Child:
    __slots__ = ("buf", "job_id", "job_w", "proc", "ready", "result_r")

    def __init__(self, proc: subprocess.Popen[bytes], job_w: int, result_r: int) -> None:
        self.proc = proc
        self.job_w = job_w
        self.result_r = result_r
        self.ready = False
        self.job_id: int | None = None
        self.buf = bytearray()


class PreforkExecutor(Executor):
    """Tasks run in ``concurrency`` child processes (``--pool prefork``).

    Children are started fresh (``python -m ackwise.worker._child``), import the app by its path, and
    talk over two pipes each.  A collector thread reads results and notices a child's death the
    moment its result pipe closes, reports the job it was running as lost, and starts a new child.
    """

    kind = "prefork"
    can_kill = True

    def __init__(
        self,
        app_path: str,
        concurrency: int,
        completions: queue.SimpleQueue[Completion],
        *,
        start_timeout: float = 120.0,
    ) -> None:
        super().__init__(concurrency, completions)
        self.app_path = app_path
        self.start_timeout = start_timeout
        self._children: list[_Child] = []
        self._lock = threading.Lock()
        self._stopping = False
        self._sel = selectors.DefaultSelector()
        self._wake_r, self._wake_w = os.pipe()
        self._collector: threading.Thread | None = None
        self._ready_cv = threading.Condition(self._lock)
        self._early_deaths = 0
        #: Jobs submitted while no child was idle, oldest first (see :meth:`submit`).
        self._backlog: collections.deque[Job] = collections.deque()

    # -- children --------------------------------------------------------------------------
    def _spawn(self) -> _Child:
        job_r, job_w = os.pipe()
        result_r, result_w = os.pipe()
        env = {**os.environ, **_logconfig.child_env()}  # children log as the worker does
        env["PYTHONPATH"] = os.pathsep.join(
            p for p in [os.getcwd(), *sys.path, env.get("PYTHONPATH", "")] if p
        )
        proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "ackwise.worker._child",
                self.app_path,
                str(job_r),
                str(result_w),
                str(os.getpid()),
            ],
            pass_fds=(job_r, result_w),
            env=env,
            stdin=subprocess.DEVNULL,
        )
        os.close(job_r)
        os.close(result_w)
        os.set_blocking(result_r, False)
        child = _Child(proc, job_w, result_r)
        self._sel.register(result_r, selectors.EVENT_READ, child)
        return child

    def start(self) -> None:
        self._sel.register(self._wake_r, selectors.EVENT_READ, None)
        with self._lock:
            for _ in range(self.concurrency):
                self._children.append(self._spawn())
        self._collector = threading.Thread(
            target=self._collect, name="ackwise-prefork-collector", daemon=True
        )
        self._collector.start()
        deadline = time.monotonic() + self.start_timeout
        with self._ready_cv:
            while not all(c.ready for c in self._children):
                if self._early_deaths >= self.concurrency:
                    raise ConfigurationError(
                        f"prefork children exit before they are ready: cannot load app "
                        f"{self.app_path!r} in a child process (see the error above)"
                    )
                left = deadline - time.monotonic()
                if left <= 0:
                    raise ConfigurationError(
                        f"prefork children did not start within {self.start_timeout:.0f}s"
                    )
                self._ready_cv.wait(min(left, 0.5))

    def pids(self) -> list[int]:
        with self._lock:
            return [c.proc.pid for c in self._children]

    def free_slots(self) -> int:
        with self._lock:
            idle = sum(1 for c in self._children if c.ready and c.job_id is None)
            return max(0, idle - len(self._backlog))

    def submit(self, job: Job) -> None:
        with self._lock:
            child = self._idle_child()
            if child is None:
                # The idle child counted by free_slots() died since (a kill, the OOM killer):
                # the job waits for its replacement.  An early-acked task must still run.
                self._backlog.append(job)
                return
            child.job_id = job.job_id
        self._send(child, job)

    def _idle_child(self) -> _Child | None:
        for child in self._children:
            if child.ready and child.job_id is None:
                return child
        return None

    def _send(self, child: _Child, job: Job) -> None:
        receipt = job.receipt.encode()[:65535]
        payload = _JOB.pack(job.job_id, job.attempt, len(receipt)) + receipt + job.body
        try:
            os.write(child.job_w, _FRAME.pack(len(payload)) + payload)
        except OSError:
            # The child died before it got the job; the collector reports the job lost.
            log.debug("prefork child %d died before it got job %d", child.proc.pid, job.job_id)

    def _give_waiting_job(self, child: _Child) -> None:
        """Hand the oldest waiting job (see :meth:`submit`) to ``child``, now idle."""
        with self._lock:
            if not self._backlog or not child.ready or child.job_id is not None:
                return
            job = self._backlog.popleft()
            child.job_id = job.job_id
        self._send(child, job)

    def running_pid(self, job_id: int) -> int | None:
        with self._lock:
            for c in self._children:
                if c.job_id == job_id:
                    return c.proc.pid
        return None

    def kill_job(self, job_id: int) -> bool:
        """SIGKILL the child running ``job_id`` (hard time limit); the collector reports it."""
        pid = self.running_pid(job_id)
        if pid is None:
            return False
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            return False
        return True

    # -- collector thread ------------------------------------------------------------------
    def _collect(self) -> None:
        while True:
            for key, _ in self._sel.select(timeout=1.0):
                child = key.data
                if child is None:
                    os.read(self._wake_r, 4096)
                    continue
                self._read_child(child)
            with self._lock:
                if self._stopping and not self._children:
                    return

    def _read_child(self, child: _Child) -> None:
        try:
            data = os.read(child.result_r, 1 << 16)
        except BlockingIOError:
            return
        except OSError:
            data = b""
        if not data:
            self._child_died(child)
            return
        child.buf += data
        while len(child.buf) >= 4:
            (size,) = _FRAME.unpack_from(child.buf)
            if len(child.buf) < 4 + size:
                break
            frame = bytes(child.buf[4 : 4 + size])
            del child.buf[: 4 + size]
            if frame == _READY:
                with self._ready_cv:
                    child.ready = True
                    # Only deaths in a row say the app cannot load: a child killed while it
                    # was starting (the OOM killer, an operator) is forgiven by the next one.
                    self._early_deaths = 0
                    self._ready_cv.notify_all()
                self._give_waiting_job(child)
                self.completions.put(("wake", 0, None))
                continue
            result = Result.from_wire(msgspec.msgpack.decode(frame))
            with self._lock:
                child.job_id = None
            self._give_waiting_job(child)
            self.completions.put(("done", result.job_id, result))

    def _child_died(self, child: _Child) -> None:
        self._sel.unregister(child.result_r)
        os.close(child.result_r)
        try:
            os.close(child.job_w)
        except OSError:
            pass
        code = child.proc.wait()
        with self._ready_cv:
            self._children.remove(child)
            job_id, was_ready = child.job_id, child.ready
            stopping = self._stopping
            if not was_ready:
                self._early_deaths += 1
            self._ready_cv.notify_all()
        if job_id is not None:
            reason = "worker_lost"
            log.warning(
                "executor process %d died (exit %s) running job %d", child.proc.pid, code, job_id
            )
            self.completions.put(("lost", job_id, reason))
        elif not stopping:
            log.warning("executor process %d died (exit %s) while idle", child.proc.pid, code)
        if stopping:
            return
        if not was_ready and self._early_deaths >= self.concurrency * 3:
            self.completions.put(
                ("fatal", 0, f"prefork children keep dying at start (app {self.app_path!r})")
            )
            return
        with self._lock:
            self._children.append(self._spawn())

    def shutdown(self, *, cold: bool) -> None:
        with self._lock:
            self._stopping = True
            children = list(self._children)
        for child in children:
            if cold:
                try:
                    child.proc.kill()
                except ProcessLookupError:
                    pass
            try:
                os.close(child.job_w)  # EOF: an idle child exits
            except OSError:
                pass
        os.write(self._wake_w, b"x")
        if self._collector is not None:
            self._collector.join(timeout=30)
        for child in children:
            try:
                child.proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                child.proc.kill()
                child.proc.wait()


# -- the child side ------------------------------------------------------------------------
def _die_with_parent(parent_pid: int) -> None:
    """Ask Linux to SIGKILL this process when the worker dies, so no orphan runs on."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(1, signal.SIGKILL, 0, 0, 0)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):  # pragma: no cover - not Linux
        pass
    if os.getppid() != parent_pid:  # the parent died before prctl took effect
        os._exit(1)


def _read_exact(fd: int, n: int) -> bytes:
    chunks = []
    while n:
        chunk = os.read(fd, n)
        if not chunk:
            raise EOFError
        chunks.append(chunk)
        n -= len(chunk)
    return b"".join(chunks)


def child_main(app_path: str, job_fd: int, result_fd: int, parent_pid: int) -> None:
    """Serve jobs from ``job_fd`` until it closes; write results to ``result_fd``."""
    _die_with_parent(parent_pid)
    # Stopping belongs to the supervisor: a Ctrl-C or a SIGTERM sent to the whole process group
    # (systemd's default KillMode) must not kill a task mid-run; the supervisor closes our job
    # pipe on a graceful stop and SIGKILLs us on a cold one.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    from ackwise.app._execution import load_app

    app = load_app(app_path)
    limiter = None
    if any(t.rate_interval is not None for t in app.tasks.values()):
        # Each child records its own starts: the gate is the last step before a function.
        # The worker refuses a store this process could not share (memory://).
        assert app.rate_limit_store_url is not None, "check_app() refuses a rate_limit without"
        limiter = open_rate_limiter(app.rate_limit_store_url, app.plugins)
    runner = Runner(app, StartGate(limiter) if limiter is not None else None)
    os.write(result_fd, _FRAME.pack(len(_READY)) + _READY)
    encode = msgspec.msgpack.encode
    while True:
        try:
            (size,) = _FRAME.unpack(_read_exact(job_fd, 4))
            payload = _read_exact(job_fd, size)
        except EOFError:
            break
        job_id, attempt, rlen = _JOB.unpack_from(payload)
        receipt = payload[_JOB.size : _JOB.size + rlen].decode()
        result = runner.run(Job(job_id, attempt, payload[_JOB.size + rlen :], receipt))
        out = encode(result.to_wire())
        os.write(result_fd, _FRAME.pack(len(out)) + out)
    runner.close()
    if limiter is not None:
        limiter.close()
    _tracing.flush()  # os._exit skips atexit, where a tracer provider would flush
    os._exit(0)
