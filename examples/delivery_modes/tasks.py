"""Tasks of the delivery-modes demo: one set per mode, each execution journalled to a file."""

from __future__ import annotations

import json
import os
import time

from ackwise import Ack, App

# The broker comes from ACKWISE_BROKER_URL (the demo points it at a fresh SQLite file);
# without it, App() uses the embedded default, sqlite:///ackwise.db.
app = App("demo")

MODES = {"EARLY": Ack.EARLY, "LATE": Ack.LATE, "REJECT_ON_LOST": Ack.REJECT_ON_LOST}


def journal(**record: object) -> None:
    line = json.dumps({"pid": os.getpid(), "t": time.time(), **record}) + "\n"
    fd = os.open(os.environ["DEMO_JOURNAL"], os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, line.encode())  # one O_APPEND write: survives a SIGKILL right after
    finally:
        os.close(fd)


def _register(mode_name: str, mode: Ack) -> None:
    @app.task(name=f"demo.work.{mode_name}", ack=mode, bind=True, max_deliveries=3)
    def work(self, label: str, victim: bool = False) -> None:
        """A short task; a victim blocks on its first delivery so the demo can kill it."""
        journal(event="start", mode=mode_name, label=label, attempt=self.attempt)
        if victim and self.attempt == 1:
            time.sleep(120)
        time.sleep(0.05)
        journal(event="end", mode=mode_name, label=label, attempt=self.attempt)


for _name, _mode in MODES.items():
    _register(_name, _mode)
