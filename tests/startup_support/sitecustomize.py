"""Pause a process of tests/test_stop_while_starting.py inside its import of ackwise.

Python imports ``sitecustomize`` before it runs the command, so a finder put in front of
``sys.meta_path`` here sees every later import.  With ``STARTUP_TEST_PAUSE_MARKER`` set, the
first import of a module of ackwise other than an entry point (``ackwise.__main__`` and
``ackwise.worker._child``, which take the signals first thing, ``ackwise.cli._startup``, and the
packages ``ackwise.cli`` and ``ackwise.worker`` that hold them, which import nothing) creates
that file (``{pid}`` in its name: the process's id) and then pauses
``STARTUP_TEST_PAUSE_SECONDS`` (default 1): the test sends its signal during the pause, while
the process still imports.
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path
from typing import Any

_MARKER = os.environ.get("STARTUP_TEST_PAUSE_MARKER")
ENTRY = {
    "ackwise.__main__",
    "ackwise.cli",
    "ackwise.cli._startup",
    "ackwise.worker",
    "ackwise.worker._child",
}


class _PauseOnce:
    done = False

    def find_spec(self, name: str, path: Any = None, target: Any = None) -> None:
        if not self.done and name.startswith("ackwise.") and name not in ENTRY:
            self.done = True
            Path(str(_MARKER).replace("{pid}", str(os.getpid()))).write_text(name)
            time.sleep(float(os.environ.get("STARTUP_TEST_PAUSE_SECONDS", "1")))
        return None  # the usual finders import it


if _MARKER:
    sys.meta_path.insert(0, _PauseOnce())
