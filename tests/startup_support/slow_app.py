"""An app whose import is slow, as a large project's can be: it creates the file
``STARTUP_TEST_MARKER`` and then takes ``STARTUP_TEST_IMPORT_SECONDS`` (default 30) seconds
(tests/test_stop_while_starting.py stops a command during that import)."""

from __future__ import annotations

import os
import time
from pathlib import Path

from ackwise import App

app = App("startup", broker=os.environ["STARTUP_TEST_BROKER"])

Path(os.environ["STARTUP_TEST_MARKER"]).touch()
time.sleep(float(os.environ.get("STARTUP_TEST_IMPORT_SECONDS", "30")))
