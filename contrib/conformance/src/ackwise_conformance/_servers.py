"""Broker servers the suite owns: process groups it starts, restarts and always stops.

Every server is tracked from its start until its stop; an ``atexit`` hook stops the ones a
test forgot.
"""

from __future__ import annotations

import atexit
import contextlib
import functools
import logging
import os
import signal
import subprocess
import tempfile
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

from ackwise_conformance._ports import bindable, free_port
from ackwise_conformance.provisioning import (
    BrokerUnavailable,
    LocalServer,
    Provisioner,
    Slot,
)

__all__ = ["Process", "Server", "start_local"]

logger = logging.getLogger("ackwise_conformance.brokers")

_START_ATTEMPTS = 3  # a free port can be taken between choosing it and the server binding it


class Server:
    """A broker server the suite started (a process group, or a container)."""

    name = "broker"

    def restart(self, *, hard: bool = False) -> None:
        raise NotImplementedError

    def stop(self) -> None:
        raise NotImplementedError


_live: set[Server] = set()
_live_lock = threading.Lock()
_atexit_registered = False


def track(server: Server) -> None:
    global _atexit_registered
    with _live_lock:
        _live.add(server)
        if not _atexit_registered:
            atexit.register(_stop_all)
            _atexit_registered = True


def untrack(server: Server) -> None:
    with _live_lock:
        _live.discard(server)


def _stop_all() -> None:
    with _live_lock:
        servers = list(_live)
    for server in servers:
        try:
            server.stop()
        except Exception:  # at exit: stop what can be stopped
            logger.exception("could not stop %s", server.name)


class Process(Server):
    """A local broker process in its own process group, restartable on the same port."""

    def __init__(
        self,
        name: str,
        argv: Sequence[str],
        *,
        port: int,
        data_dir: Path,
        ready: Callable[[], bool],
        ready_timeout: float,
        stop_timeout: float,
        env: Mapping[str, str] | None = None,
        log_files: Sequence[Path] = (),
    ) -> None:
        self.name = name
        self.argv = list(argv)
        self.port = port
        self.data_dir = data_dir
        self.ready = ready
        self.ready_timeout = ready_timeout
        self.stop_timeout = stop_timeout
        self.env = dict(env) if env is not None else None
        self.log_path = data_dir / "stdout.log"
        self.log_files = [self.log_path, *log_files]
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        """Start the process and wait until it answers; clean up and raise if it does not."""
        with self.log_path.open("ab") as log:
            self.proc = subprocess.Popen(
                self.argv,
                env=self.env,
                cwd=self.data_dir,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,  # its own process group: stop() ends its children too
            )
        track(self)
        started = time.monotonic()
        timeout = self.ready_timeout
        deadline = started + timeout
        while True:
            if self.proc.poll() is not None:
                code = self.proc.returncode
                self.stop()
                raise BrokerUnavailable(
                    f"{self.argv[0]} exited with status {code} before answering on port "
                    f"{self.port}{self.log_tail()}"
                )
            if self.ready():
                logger.info(
                    "%s answers on port %d after %.1fs",
                    self.name,
                    self.port,
                    time.monotonic() - started,
                )
                return
            if time.monotonic() >= deadline:
                self.stop()
                raise BrokerUnavailable(
                    f"{self.argv[0]} did not answer on port {self.port} within {timeout:.0f}s"
                    f"{self.log_tail()}"
                )
            time.sleep(0.1)

    def stop(self, *, hard: bool = False) -> None:
        proc = self.proc
        if proc is None:
            return
        pgid = proc.pid  # the leader of its own session and group
        if not hard:
            _signal_group(pgid, signal.SIGTERM)
            _wait_group(proc, self.stop_timeout)
        if _group_alive(proc, pgid):
            _signal_group(pgid, signal.SIGKILL)
            if not _wait_group(proc, 5.0):
                logger.warning("%s (process group %d) survived SIGKILL", self.name, pgid)
        self.proc = None
        untrack(self)

    def restart(self, *, hard: bool = False) -> None:
        self.stop(hard=hard)
        self.start()

    def log_tail(self, lines: int = 30) -> str:
        tail: list[str] = []
        for path in self.log_files:
            with contextlib.suppress(OSError):
                text = path.read_text(errors="replace").rstrip()
                if text:
                    tail.append(f"\n--- {path} (last {lines} lines) ---\n")
                    tail.append("\n".join(text.splitlines()[-lines:]))
        return "".join(tail)


def _signal_group(pgid: int, sig: signal.Signals) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, sig)


def _group_alive(proc: subprocess.Popen[bytes], pgid: int) -> bool:
    """True while any process of the group is alive (zombies do not count)."""
    if proc.poll() is None:
        return True
    proc_dir = Path("/proc")
    if not proc_dir.is_dir():  # not Linux: ask the kernel, zombies included
        try:
            os.killpg(pgid, 0)
        except ProcessLookupError:
            return False
        except PermissionError:
            return True
        return True
    for stat in proc_dir.glob("[0-9]*/stat"):
        try:
            # "pid (comm) state ppid pgrp ...": comm may contain spaces and parentheses.
            fields = stat.read_text().rpartition(")")[2].split()
        except OSError:
            continue
        if len(fields) > 2 and fields[2] == str(pgid) and fields[0] != "Z":
            return True
    return False


def _wait_group(proc: subprocess.Popen[bytes], timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while _group_alive(proc, proc.pid):
        if time.monotonic() >= deadline:
            return False
        time.sleep(0.05)
    return True


def _data_dir(tmp_dir: Path, name: str) -> Path:
    tmp_dir.mkdir(parents=True, exist_ok=True)
    return Path(tempfile.mkdtemp(prefix=f"{name}-", dir=tmp_dir))


def _other_port(taken: set[int]) -> Callable[[], int]:
    def pick() -> int:
        port = free_port()
        while port in taken:
            port = free_port()
        taken.add(port)
        return port

    return pick


def start_local(
    provisioner: Provisioner, tmp_dir: Path, *, durable: bool, config: str = ""
) -> tuple[Process, LocalServer]:
    """Start the provisioner's server on a free port, on a new one if that was taken meanwhile.

    :raises BrokerUnavailable: the provisioner cannot run here, or its server did not answer.
    """
    name = provisioner.name
    last: BrokerUnavailable | None = None
    for _ in range(_START_ATTEMPTS):
        port = free_port()
        data_dir = _data_dir(tmp_dir, name)
        slot = Slot(
            port=port,
            data_dir=data_dir,
            durable=durable,
            config=config,
            free_port=_other_port({port}),
        )
        spec = provisioner.local(slot)
        server = Process(
            name,
            spec.argv,
            port=port,
            data_dir=data_dir,
            ready=functools.partial(provisioner.ready, slot.host, slot.port),
            ready_timeout=provisioner.ready_timeout,
            stop_timeout=provisioner.stop_timeout,
            env=spec.env,
            log_files=spec.log_files,
        )
        try:
            server.start()
            return server, spec
        except BrokerUnavailable as exc:
            last = exc
            if bindable("127.0.0.1", port):  # not a lost race for the port: do not retry
                break
    assert last is not None
    raise last
