"""The tasks of ``bench/postgresql.py``: one no-op task for ackwise, one for Procrastinate, each
system in a database of its own on one private PostgreSQL server.

Every worker imports this module (``bench/pgbench`` and ``bench/`` on ``PYTHONPATH``); the
database URL and the queue name come from ``$PG_BENCH_URL`` and ``$PG_BENCH_QUEUE``, and only
the system named by ``$PG_BENCH_SYSTEM`` is built.  The task body is ``startlog.record(sent)``,
as in ``bench/redisbench/redis_tasks.py``: without ``sent`` it records the start time (drain
cells); with ``sent`` (the producer's ``time.time()`` just before the enqueue call) the enqueue
-> start latency; warm-up tasks pass ``sent=-1`` and are ignored.
"""

from __future__ import annotations

import os

import peer_tasks
from startlog import record

URL = os.environ.get("PG_BENCH_URL", "postgresql://postgres@127.0.0.1:5432/postgres")
QUEUE = os.environ.get("PG_BENCH_QUEUE", "bench")


# -- ackwise (late ack: the row is deleted after the task returned) -------------------------
def make_ackwise_app(url: str = URL, queue: str = QUEUE):  # type: ignore[no-untyped-def]
    return peer_tasks.make_ackwise_app(url, queue)


# -- Procrastinate (psycopg 3, its PsycopgConnector with the pool's defaults) ---------------
def make_procrastinate_app(url: str = URL, queue: str = QUEUE, sync: bool = False):  # type: ignore[no-untyped-def]
    """The app and its no-op task, ``app.bench_noop``.

    ``sync``: a plain ``def`` task (Procrastinate runs it in a thread, ``asgiref``'s
    ``sync_to_async``); else an ``async def`` task, run on the worker's event loop (its
    cheapest path, used for the headline rows).
    """
    import procrastinate

    app = procrastinate.App(connector=procrastinate.PsycopgConnector(conninfo=url))

    if sync:

        @app.task(name="bench.noop", queue=queue)
        def noop(sent: float = 0.0) -> None:
            record(sent)

    else:

        @app.task(name="bench.noop", queue=queue)
        async def noop(sent: float = 0.0) -> None:  # type: ignore[misc]
            record(sent)

    app.bench_noop = noop  # type: ignore[attr-defined]
    return app


_SYSTEM = os.environ.get("PG_BENCH_SYSTEM", "")
# Only the system a worker runs is built (each CLI imports this module and takes one name).
ackwise_app = make_ackwise_app() if _SYSTEM == "ackwise" else None
procrastinate_app = (
    make_procrastinate_app(sync=_SYSTEM == "procrastinate-sync")
    if _SYSTEM.startswith("procrastinate")
    else None
)
