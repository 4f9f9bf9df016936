"""The tasks of ``bench/redis_peers.py``: one no-op task per system, all on one Redis.

Every worker imports this module (``bench/redisbench`` and ``bench/`` on ``PYTHONPATH``); the
Redis URL and the queue name come from ``$REDIS_BENCH_URL`` and ``$REDIS_BENCH_QUEUE``.  The
task body is ``startlog.record(sent)``: without ``sent`` it records the start time (drain
cells); with ``sent`` (a ``time.time()`` taken by the producer just before the enqueue call) it
records the enqueue -> start latency (latency cells); warm-up tasks pass ``sent=-1`` and are
ignored.
"""

from __future__ import annotations

import os

import peer_tasks
from startlog import record

URL = os.environ.get("REDIS_BENCH_URL", "redis://127.0.0.1:6379/15")
QUEUE = os.environ.get("REDIS_BENCH_QUEUE", "bench")


# -- ackwise -------------------------------------------------------------------------------
def make_ackwise_app(url: str = URL, queue: str = QUEUE):  # type: ignore[no-untyped-def]
    return peer_tasks.make_ackwise_app(url, queue)


# -- Celery --------------------------------------------------------------------------------
def make_celery_app(url: str = URL, queue: str = QUEUE):  # type: ignore[no-untyped-def]
    from celery import Celery

    app = Celery("bench", broker=url)
    app.conf.update(
        task_acks_late=True,
        worker_prefetch_multiplier=1,
        task_default_queue=queue,
        task_ignore_result=True,
        broker_connection_retry_on_startup=True,
        worker_hijack_root_logger=False,
    )

    @app.task(name="bench.noop")
    def noop(sent: float = 0.0) -> None:
        record(sent)

    app.bench_noop = noop
    return app


# -- Dramatiq ------------------------------------------------------------------------------
def make_dramatiq_broker(url: str = URL, queue: str = QUEUE):  # type: ignore[no-untyped-def]
    import dramatiq
    from dramatiq.brokers.redis import RedisBroker

    broker = RedisBroker(url=url)
    dramatiq.set_broker(broker)

    @dramatiq.actor(actor_name="bench_noop", queue_name=queue, max_retries=0, broker=broker)
    def noop(sent: float = 0.0) -> None:
        record(sent)

    broker.bench_noop = noop
    return broker


# -- Taskiq --------------------------------------------------------------------------------
def make_taskiq_broker(url: str = URL, queue: str = QUEUE):  # type: ignore[no-untyped-def]
    from taskiq_redis import RedisStreamBroker

    broker = RedisStreamBroker(url, queue_name=queue, consumer_group_name=f"{queue}-group")

    @broker.task(task_name="bench.noop")
    async def noop(sent: float = 0.0) -> None:
        record(sent)

    broker.bench_noop = noop
    return broker


# -- Huey ----------------------------------------------------------------------------------
def make_huey(url: str = URL, queue: str = QUEUE):  # type: ignore[no-untyped-def]
    """Huey on Redis, as documented: a BRPOP consumer (``blocking=True``, its default); at most
    once (a task's message is gone from Redis once popped: a killed consumer loses it)."""
    from huey import RedisHuey

    huey = RedisHuey(queue, url=url, blocking=True, results=False)

    def noop(sent: float = 0.0) -> None:
        record(sent)

    # Huey names a task by its function's module: the consumer imports this one as
    # ``redis_tasks``, the driver as ``redisbench.redis_tasks``.
    noop.__module__ = "redis_tasks"
    huey.bench_noop = huey.task(name="bench.noop")(noop)
    return huey


_SYSTEM = os.environ.get("REDIS_BENCH_SYSTEM", "")
# Only the system a worker runs is built (each CLI imports this module and takes one name).
ackwise_app = make_ackwise_app() if _SYSTEM == "ackwise" else None
celery_app = make_celery_app() if _SYSTEM == "celery" else None
dramatiq_broker = make_dramatiq_broker() if _SYSTEM == "dramatiq" else None
taskiq_broker = make_taskiq_broker() if _SYSTEM == "taskiq" else None
huey_app = make_huey() if _SYSTEM == "huey" else None
