"""The ackwise side of the broker benchmarks' task modules (``redisbench/redis_tasks.py``,
``rabbitbench/rabbit_tasks.py``): one App with one no-op task, ``bench.noop``.

Imported by the task module in the driver and in every worker (``bench/`` is on their
``PYTHONPATH``, see ``_common.worker_env``); the task body is ``startlog.record(sent)``.
"""

from __future__ import annotations

from startlog import record


def make_ackwise_app(url: str, queue: str):  # type: ignore[no-untyped-def]
    import ackwise

    app = ackwise.App("bench", broker=url)

    @app.task(name="bench.noop", queue=queue)  # Ack.LATE, the default
    def noop(sent: float = 0.0) -> None:
        record(sent)

    app.bench_noop = noop
    return app
