"""The ackwise side of the embedded benchmark: one App with one no-op task.

The worker process imports ``benchmod:app``; its broker comes from ``$ACKWISE_BENCH_BROKER``.
"""

from __future__ import annotations

import os

import startlog

import ackwise


def make_app(broker: str) -> ackwise.App:
    app = ackwise.App("bench", broker=broker)

    @app.task(name="benchmod.noop")  # Ack.LATE: the default
    def noop() -> None:
        startlog.mark()

    return app


app = make_app(os.environ.get("ACKWISE_BENCH_BROKER", "memory://bench"))
