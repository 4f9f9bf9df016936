"""The tasks of ``bench/rabbitmq.py``: one no-op task per system, all on one RabbitMQ node.

Every worker imports this module (``bench/rabbitbench`` and ``bench/`` on ``PYTHONPATH``); the
broker URL and the queue name come from ``$RABBIT_BENCH_URL`` and ``$RABBIT_BENCH_QUEUE``.  The
task body is ``startlog.record(sent)``, as in ``bench/redisbench/redis_tasks.py``: without
``sent`` it records the start time (drain cells); with ``sent`` (the producer's ``time.time()``
just before the enqueue call) the enqueue -> start latency; warm-up tasks pass ``sent=-1`` and
are ignored.
"""

from __future__ import annotations

import os

import peer_tasks
from startlog import record

URL = os.environ.get("RABBIT_BENCH_URL", "amqp://guest:guest@127.0.0.1:5672/%2F")
QUEUE = os.environ.get("RABBIT_BENCH_QUEUE", "bench")
#: Dramatiq's queue type: ``classic`` (its own) or ``quorum`` (ackwise's default, for a
#: same-queue-type comparison).
DRAMATIQ_QUEUE_TYPE = os.environ.get("RABBIT_BENCH_DRAMATIQ_QUEUE_TYPE", "classic")


# -- ackwise (publisher confirms always on; quorum queue unless ?queue_type=classic) --------
def make_ackwise_app(url: str = URL, queue: str = QUEUE):  # type: ignore[no-untyped-def]
    return peer_tasks.make_ackwise_app(url, queue)


# -- Celery (py-amqp transport; classic durable queue, its default) --------------------------
def make_celery_app(url: str = URL, queue: str = QUEUE, confirm: bool = True):  # type: ignore[no-untyped-def]
    from celery import Celery

    app = Celery("bench", broker=url)
    app.conf.update(
        task_acks_late=True,
        worker_prefetch_multiplier=1,
        task_default_queue=queue,
        task_ignore_result=True,
        broker_connection_retry_on_startup=True,
        worker_hijack_root_logger=False,
        # Not Celery's default (False): a publish waits for RabbitMQ's confirm, as ackwise's.
        broker_transport_options={"confirm_publish": confirm},
    )

    @app.task(name="bench.noop")
    def noop(sent: float = 0.0) -> None:
        record(sent)

    app.bench_noop = noop
    return app


# -- Dramatiq (RabbitmqBroker; classic durable queue, or quorum) ----------------------------
def make_dramatiq_broker(  # type: ignore[no-untyped-def]
    url: str = URL, queue: str = QUEUE, confirm: bool = True, queue_type: str = DRAMATIQ_QUEUE_TYPE
):
    import dramatiq
    from dramatiq.brokers.rabbitmq import RabbitmqBroker

    class QuorumRabbitmqBroker(RabbitmqBroker):  # type: ignore[misc]
        """Dramatiq's broker declaring its queues (and their delay queues) as quorum queues;
        the dead-letter queue stays classic."""

        def _build_queue_arguments(self, queue_name):  # type: ignore[no-untyped-def]
            return {**super()._build_queue_arguments(queue_name), "x-queue-type": "quorum"}

    cls = QuorumRabbitmqBroker if queue_type == "quorum" else RabbitmqBroker
    # confirm_delivery is not Dramatiq's default (False): with it, send() waits for the confirm.
    broker = cls(url=url, confirm_delivery=confirm)
    dramatiq.set_broker(broker)

    @dramatiq.actor(actor_name="bench_noop", queue_name=queue, max_retries=0, broker=broker)
    def noop(sent: float = 0.0) -> None:
        record(sent)

    broker.bench_noop = noop
    return broker


_SYSTEM = os.environ.get("RABBIT_BENCH_SYSTEM", "")
# Only the system a worker runs is built (each CLI imports this module and takes one name).
ackwise_app = make_ackwise_app() if _SYSTEM == "ackwise" else None
celery_app = make_celery_app() if _SYSTEM == "celery" else None
dramatiq_broker = make_dramatiq_broker() if _SYSTEM == "dramatiq" else None
