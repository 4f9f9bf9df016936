"""Tasks for the crash tests: each execution is journalled in a file that survives SIGKILL.

Configured by environment (set by the test for the worker processes it starts):
``ACKWISE_BROKER_URL`` the broker, ``CRASH_JOURNAL`` the journal file, ``CRASH_GATES`` a
directory of gate files a blocked task waits for.
"""

from __future__ import annotations

import json
import os
import signal
import time

from ackwise import Ack, App


def journal(event: str, **info: object) -> None:
    path = os.environ["CRASH_JOURNAL"]
    line = json.dumps({"event": event, "pid": os.getpid(), "t": time.time(), **info}) + "\n"
    # One O_APPEND write per line: atomic, and in the kernel before a SIGKILL can land.
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, line.encode())
    finally:
        os.close(fd)


def _wait_gate(name: str, timeout: float = 120.0) -> None:
    gate = os.path.join(os.environ["CRASH_GATES"], name)
    deadline = time.monotonic() + timeout
    while not os.path.exists(gate):
        if time.monotonic() > deadline:
            raise TimeoutError(f"gate {name} never opened")
        time.sleep(0.01)


def _make(app: App, ack: Ack, suffix: str) -> None:
    @app.task(name=f"block_{suffix}", ack=ack, bind=True, max_deliveries=3)
    def block(self, key: str) -> None:
        """Journal the start, wait for gate ``key`` (or ``key-<attempt>``), journal the end."""
        journal("start", task=f"block_{suffix}", key=key, id=self.id, attempt=self.attempt)
        gate_any = os.path.join(os.environ["CRASH_GATES"], key)
        gate_this = f"{gate_any}-{self.attempt}"
        deadline = time.monotonic() + 120
        while not (os.path.exists(gate_any) or os.path.exists(gate_this)):
            if time.monotonic() > deadline:
                raise TimeoutError(f"gate {key} never opened")
            time.sleep(0.01)
        journal("end", task=f"block_{suffix}", key=key, id=self.id, attempt=self.attempt)

    @app.task(name=f"poison_{suffix}", ack=ack, bind=True, max_deliveries=3)
    def poison(self, key: str) -> None:
        """Kill the process running this task, every time."""
        journal("start", task=f"poison_{suffix}", key=key, id=self.id, attempt=self.attempt)
        os.kill(os.getpid(), signal.SIGKILL)

    @app.task(name=f"sleep_{suffix}", ack=ack, bind=True)
    def sleep(self, key: str, seconds: float) -> None:
        journal("start", task=f"sleep_{suffix}", key=key, id=self.id, attempt=self.attempt)
        time.sleep(seconds)
        journal("end", task=f"sleep_{suffix}", key=key, id=self.id, attempt=self.attempt)

    @app.task(name=f"note_{suffix}", ack=ack, bind=True)
    def note(self, key: str) -> None:
        journal("start", task=f"note_{suffix}", key=key, id=self.id, attempt=self.attempt)
        journal("end", task=f"note_{suffix}", key=key, id=self.id, attempt=self.attempt)


def build(app: App) -> App:
    """Register the crash tasks on ``app`` (a producer builds its own App on the same names)."""
    for mode, suffix in ((Ack.EARLY, "early"), (Ack.LATE, "late"), (Ack.REJECT_ON_LOST, "rol")):
        _make(app, mode, suffix)
    return app


app = build(App("crashapp"))
