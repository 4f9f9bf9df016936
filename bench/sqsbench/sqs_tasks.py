"""Worker-side tasks of bench/sqs.py: one no-op task for ackwise and one for Celery.

Each task appends its start time to ``$BENCH_SQS_STARTS`` (one ``write()`` on an ``O_APPEND``
file), so the driver counts starts without asking SQS (which would add API calls).
"""

from __future__ import annotations

import os
import time

from celery import Celery

from ackwise import App

STARTS = os.environ.get("BENCH_SQS_STARTS", "/dev/null")


def _started() -> None:
    fd = os.open(STARTS, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, f"{time.time():.6f}\n".encode())
    finally:
        os.close(fd)


app = App("bench-sqs", broker=os.environ.get("BENCH_SQS_ACKWISE_URL", "memory://"))


@app.task(name="bench.noop", queue=os.environ.get("BENCH_SQS_QUEUE", "bench"))
def noop(i: int) -> None:
    _started()


celery_app = Celery("bench_sqs", broker=os.environ.get("BENCH_SQS_CELERY_URL", "memory://"))
celery_app.conf.update(
    broker_transport_options={
        "region": "us-east-1",
        "is_secure": False,
        "queue_name_prefix": os.environ.get("BENCH_SQS_CELERY_PREFIX", ""),
        "wait_time_seconds": 1,
        "polling_interval": 0,
    },
    task_default_queue=os.environ.get("BENCH_SQS_QUEUE", "bench"),
    task_acks_late=bool(os.environ.get("BENCH_SQS_CELERY_LATE")),
    worker_prefetch_multiplier=1 if os.environ.get("BENCH_SQS_CELERY_LATE") else 4,
    worker_hijack_root_logger=False,
)


@celery_app.task(name="bench.celery_noop")
def celery_noop(i: int) -> None:
    _started()
