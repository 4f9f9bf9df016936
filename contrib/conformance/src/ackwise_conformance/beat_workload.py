"""The app that conformance ``ackwise beat`` processes run (scenarios B01-B04).

One interval schedule named ``tick``, firing the task ``conformance.beat.fire``; all of it comes
from the environment the harness sets:

``ACKWISE_CONFORMANCE_BEAT_APP``
    the app name, hence the lock name ``ackwise.beat.<app name>``: one per group of beats.
``ACKWISE_CONFORMANCE_BEAT_EVERY``
    seconds between ticks (no schedule when unset).
``ACKWISE_CONFORMANCE_BEAT_QUEUE``
    where fires go.

The schedule catches up every missed tick (``missed="catch_up"``), so after a leader change
the catalogue can demand *every* tick exactly once.  The scenarios count fires in the queue
itself, not from executions: a worker honouring the fires' idempotency keys would hide a
double fire.  When a worker does run the task, it journals the fire.
"""

from __future__ import annotations

import os

from ackwise import App, TaskContext
from ackwise_conformance.journal import record

__all__ = ["SCHEDULE", "TASK", "app", "build_app"]

TASK = "conformance.beat.fire"
SCHEDULE = "tick"


def build_app(name: str | None = None, broker: str | None = None) -> App:
    """The beat workload app (default name and schedule from the environment)."""
    app = App(name or os.environ.get("ACKWISE_CONFORMANCE_BEAT_APP", "conformance-beat"), broker)

    @app.task(name=TASK, bind=True)
    def fire(ctx: TaskContext) -> None:
        journal = os.environ.get("ACKWISE_CONFORMANCE_JOURNAL")
        if journal:
            record(journal, "fire", id=ctx.id, key=ctx.headers.get("idempotency_key"))

    every = os.environ.get("ACKWISE_CONFORMANCE_BEAT_EVERY")
    if every:
        app.periodic(
            fire,
            every=float(every),
            name=SCHEDULE,
            queue=os.environ.get("ACKWISE_CONFORMANCE_BEAT_QUEUE") or None,
            missed="catch_up",
            catch_up_limit=10_000,
        )
    return app


app = build_app()
