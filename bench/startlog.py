"""Task-start timestamps, recorded inside whatever process runs the task.

A benchmarked no-op task calls :func:`mark` as its only statement: one ``time.time()`` and one
``list.append`` (well under a microsecond; both the ackwise and the Huey task pay it).

When ``$BENCH_STARTS_DIR`` is set, a daemon thread appends the new timestamps every
``FLUSH_EVERY`` seconds to ``$BENCH_STARTS_DIR/<pid>.f64`` (raw little-endian float64), so the
benchmark driver can follow the drain from outside without touching the broker, and prefork
children (which leave with ``os._exit``) lose nothing: the driver waits one flush interval
before it stops the worker.  A process forked from one that imported this module (Celery's
prefork pool, Dramatiq, Taskiq) starts a flusher of its own.  In-process runs (``memory://``)
read :data:`starts` directly.
"""

from __future__ import annotations

import atexit
import os
import sys
import threading
import time
from array import array

FLUSH_EVERY = 0.1

starts: list[float] = []
_now = time.time
_append = starts.append


def mark() -> None:
    _append(_now())


def record(sent: float = 0.0) -> None:
    """The no-op task's body where it also measures latency (the Redis and RabbitMQ benchmarks).

    Without ``sent`` it records the start time (drain cells); with ``sent`` (the producer's
    ``time.time()`` just before the enqueue call), the enqueue -> start latency; warm-up tasks
    pass ``sent=-1``, recorded as -1 (ignored).
    """
    if sent == 0.0:
        _append(_now())  # drain: the start time
    elif sent > 0:
        _append(_now() - sent)  # latency: enqueue -> start
    else:
        _append(-1.0)  # warm-up marker


def reset() -> None:
    del starts[:]


def _flusher(directory: str) -> None:
    path = os.path.join(directory, f"{os.getpid()}.f64")
    done = 0
    lock = threading.Lock()

    def flush() -> None:
        nonlocal done
        with lock:
            n = len(starts)
            if n > done:
                chunk = array("d", starts[done:n])
                if sys.byteorder != "little":  # pragma: no cover
                    chunk.byteswap()
                with open(path, "ab") as f:
                    f.write(chunk.tobytes())
                done = n

    atexit.register(flush)
    while True:
        time.sleep(FLUSH_EVERY)
        flush()


def read_dir(directory: str) -> list[float]:
    """All timestamps flushed to ``directory`` so far, sorted."""
    out = array("d")
    for name in os.listdir(directory):
        if name.endswith(".f64"):
            with open(os.path.join(directory, name), "rb") as f:
                data = f.read()
            out.frombytes(data[: len(data) - len(data) % 8])
    if sys.byteorder != "little":  # pragma: no cover
        out.byteswap()
    return sorted(out)


def count_dir(directory: str) -> int:
    """How many timestamps were flushed to ``directory`` so far (file sizes only)."""
    total = 0
    for entry in os.scandir(directory):
        if entry.name.endswith(".f64"):
            total += entry.stat().st_size // 8
    return total


def _start_flusher() -> None:
    directory = os.environ.get("BENCH_STARTS_DIR")
    if directory:
        threading.Thread(
            target=_flusher, args=(directory,), name="bench-startlog", daemon=True
        ).start()


def _after_fork_in_child() -> None:
    # Pools that fork their workers (Celery's prefork, Dramatiq, Taskiq): the parent's flusher
    # thread does not survive fork(), and its unflushed starts are the parent's to write.
    reset()
    _start_flusher()


_start_flusher()
os.register_at_fork(after_in_child=_after_fork_in_child)
