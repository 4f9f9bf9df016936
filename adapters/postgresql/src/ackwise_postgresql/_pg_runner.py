"""Run one private PostgreSQL server in the foreground, for the conformance suite's
provisioner: ``python -m ackwise_postgresql._pg_runner DATA_DIR -- POSTGRES -D DATA_DIR ...``.

The suite stops a server with SIGTERM to its process group, and PostgreSQL's answer to SIGTERM
(a "smart" shutdown) waits for every client to leave: its backends each lead a process group
of their own, so they never get the suite's signal, and the workers under test stay connected.
This runner turns SIGTERM into SIGINT (a fast shutdown: sessions ended, a clean checkpoint).
A SIGKILL of the group kills the runner and the postmaster, whose backends then exit on their
own; a start that still meets them (their shared memory in use) is tried again for 20 s, and
a ``postmaster.pid`` left by a killed postmaster that nobody reaped (a zombie passes
PostgreSQL's liveness check) is removed first.
As root, the server runs as the ``postgres`` user (PostgreSQL refuses to run as root).
"""

from __future__ import annotations

import os
import pwd
import signal
import subprocess
import sys
import time
from pathlib import Path

_RETRY = (b"is still in use", b"already exists")


def _remove_stale_lock(data: Path) -> None:
    """Remove ``postmaster.pid`` when its process is gone or a zombie."""
    lock = data / "postmaster.pid"
    try:
        pid = int(lock.read_text().split("\n", 1)[0])
    except (OSError, ValueError):
        return
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        state = "gone"
    if state in ("Z", "X", "gone"):
        lock.unlink(missing_ok=True)


def _as_postgres() -> None:
    if os.geteuid() == 0:
        user = pwd.getpwnam("postgres")
        os.setgid(user.pw_gid)
        os.initgroups("postgres", user.pw_gid)
        os.setuid(user.pw_uid)


def main(argv: list[str]) -> int:
    data, command = Path(argv[0]), argv[argv.index("--") + 1 :]
    deadline = time.monotonic() + 20.0
    while True:
        _remove_stale_lock(data)
        started = time.monotonic()
        child = subprocess.Popen(command, preexec_fn=_as_postgres, stderr=subprocess.PIPE)
        signal.signal(signal.SIGTERM, lambda *_, c=child: c.send_signal(signal.SIGINT))
        assert child.stderr is not None
        early = b""
        for line in child.stderr:
            sys.stderr.buffer.write(line)
            sys.stderr.flush()
            if time.monotonic() - started < 5.0:
                early += line
        code = child.wait()
        if code != 0 and any(r in early for r in _RETRY) and time.monotonic() < deadline:
            time.sleep(0.5)
            continue
        return code


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
