"""The journal: every publish and every execution, in a file that survives SIGKILL.

Each record is one JSON line written with a single ``write()`` on a file opened ``O_APPEND``:
the kernel has it before the writer can be killed, and concurrent writers (workers, executor
processes, the harness) never interleave within a line.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any

__all__ = ["Journal", "record"]


def record(path: str | os.PathLike[str], event: str, **fields: Any) -> None:
    """Append one record ``{"ev": event, "pid": …, "t": …, **fields}`` to the journal at ``path``."""
    line = json.dumps({"ev": event, "pid": os.getpid(), "t": time.time(), **fields}) + "\n"
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, line.encode())
    finally:
        os.close(fd)


class Journal:
    """A journal file: append records, read them back, filter them."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def write(self, event: str, **fields: Any) -> None:
        record(self.path, event, **fields)

    def records(self, **match: Any) -> list[dict[str, Any]]:
        """Every record whose fields equal ``match``, in write order."""
        if not self.path.exists():
            return []
        out = []
        text = self.path.read_text()
        # A reader can see a line while its write is in progress: only complete lines count.
        for line in text[: text.rfind("\n") + 1].splitlines():
            if not line.strip():
                continue
            rec = json.loads(line)
            if all(rec.get(k) == v for k, v in match.items()):
                out.append(rec)
        return out

    def count(self, **match: Any) -> int:
        return len(self.records(**match))

    def lines_for(self, message_id: str) -> list[str]:
        """The raw journal lines that mention ``message_id`` (for failure reports)."""
        if not self.path.exists():
            return []
        return [line for line in self.path.read_text().splitlines() if message_id in line]
