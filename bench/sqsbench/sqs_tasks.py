"""The tasks of ``bench/sqs.py``: one no-op task for ackwise and one for Celery, on one moto.

Every worker imports this module (``bench/sqsbench`` and ``bench/`` on ``PYTHONPATH``); the
system, the URL and the queue come from ``$SQS_BENCH_SYSTEM``, ``$SQS_BENCH_URL`` and
``$SQS_BENCH_QUEUE``; Celery's configuration (ack mode, prefetch) from
``$SQS_BENCH_CELERY_LATE`` and ``$SQS_BENCH_CELERY_PREFETCH``.  The task body records its start
time with ``startlog`` (one ``time.time()`` and one ``list.append``; a thread flushes them to
``$BENCH_STARTS_DIR``), as in the other benchmarks, so the driver follows the drain without
asking SQS anything.
"""

from __future__ import annotations

import os

import startlog

URL = os.environ.get("SQS_BENCH_URL", "")
QUEUE = os.environ.get("SQS_BENCH_QUEUE", "bench")
mark = startlog.mark


def make_ackwise_app(url: str = URL, queue: str = QUEUE):  # type: ignore[no-untyped-def]
    import ackwise

    app = ackwise.App("bench-sqs", broker=url)

    @app.task(name="bench.noop", queue=queue)  # Ack.LATE, the default
    def noop() -> None:
        mark()

    app.bench_noop = noop
    return app


def make_celery_app(  # type: ignore[no-untyped-def]
    url: str = URL, queue: str = QUEUE, late: bool = False, prefetch: int = 4
):
    """Celery on kombu's SQS transport; ``url`` is ``sqs://key:secret@host:port``."""
    from celery import Celery

    app = Celery("bench_sqs", broker=url)
    app.conf.update(
        broker_transport_options={
            "region": "us-east-1",
            "is_secure": False,
            # Faster than Celery's defaults (wait 10 s, poll every 1 s): a waiting worker
            # notices new messages sooner.
            "wait_time_seconds": 1,
            "polling_interval": 0,
        },
        task_default_queue=queue,
        task_acks_late=late,
        task_ignore_result=True,
        worker_prefetch_multiplier=prefetch,
        worker_hijack_root_logger=False,
        broker_connection_retry_on_startup=True,
    )

    @app.task(name="bench.noop")
    def noop() -> None:
        mark()

    app.bench_noop = noop
    return app


_SYSTEM = os.environ.get("SQS_BENCH_SYSTEM", "")
# Only the system a worker runs is built (each CLI imports this module and takes one name).
ackwise_app = make_ackwise_app() if _SYSTEM == "ackwise" else None
celery_app = (
    make_celery_app(
        late=os.environ.get("SQS_BENCH_CELERY_LATE") == "1",
        prefetch=int(os.environ.get("SQS_BENCH_CELERY_PREFETCH", "4")),
    )
    if _SYSTEM == "celery"
    else None
)
