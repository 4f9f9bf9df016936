"""The app of tests/test_outbox.py's relay and worker processes.

``OUTBOX_TEST_BROKER`` is its broker URL; each run of ``outbox.record`` appends its argument to
the file ``OUTBOX_TEST_JOURNAL``.
"""

from __future__ import annotations

import os

from ackwise import App

app = App("outbox", broker=os.environ.get("OUTBOX_TEST_BROKER", "sqlite:///outbox.db"))


@app.task(name="outbox.record")
def record(value: str) -> None:
    with open(os.environ["OUTBOX_TEST_JOURNAL"], "a") as journal:
        journal.write(value + "\n")
