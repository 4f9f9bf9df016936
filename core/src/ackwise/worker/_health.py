"""``/healthz``: whether a worker's consumer loop is turning, for liveness probes.

The loop renews the leases of everything the worker holds, settles what finished and
receives more.  A loop that has not begun a turn for a whole lease lets those leases lapse:
its messages may run elsewhere while it hangs, so that is the line between healthy and not.
Served beside ``/metrics`` (``ackwise worker --metrics-port``).
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Iterable
from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from ackwise.worker._loop import Worker

__all__ = ["Health", "health_of", "with_health"]

PATH = "/healthz"

WSGIApp = Callable[[dict[str, Any], Callable[..., Any]], Iterable[bytes]]


@dataclass(frozen=True)
class Health:
    """A worker's liveness: ``ok`` unless its loop stalled for a lease or it has stopped."""

    ok: bool
    #: ``starting`` (connecting, before the loop's first turn), ``running``,
    #: ``reconnecting`` (after a broker error), ``stopping`` (a graceful stop under way) or
    #: ``stopped``.
    state: str
    #: Seconds since the loop last began a turn (``None`` before its first).
    loop_age: float | None
    #: The most ``loop_age`` may be: the worker's lease.
    limit: float


def health_of(worker: Worker, now: float | None = None) -> Health:
    """The health of ``worker`` now (``now``: a ``time.monotonic()`` reading)."""
    limit = worker.config.lease
    if worker.stopped:
        return Health(False, "stopped", None, limit)
    if not worker.last_turn:
        # Still connecting: a worker that cannot reach its broker gives up by itself after
        # --broker-timeout, with a clear error; a restart by the probe would not help sooner.
        return Health(True, "starting", None, limit)
    age = (time.monotonic() if now is None else now) - worker.last_turn
    if worker.reconnecting:
        # Its turns wait for the backoff and the connect; likewise, --broker-timeout ends it.
        return Health(True, "reconnecting", age, limit)
    return Health(age <= limit, "stopping" if worker.stopping else "running", age, limit)


def with_health(app: WSGIApp, worker: Worker) -> WSGIApp:
    """``app`` with :data:`PATH` answered from the worker's health: 200 or 503, in JSON."""

    def serve(environ: dict[str, Any], start_response: Callable[..., Any]) -> Iterable[bytes]:
        if environ.get("PATH_INFO") != PATH:
            return app(environ, start_response)
        health = health_of(worker)
        body = json.dumps(asdict(health)).encode()
        status = "200 OK" if health.ok else "503 Service Unavailable"
        start_response(
            status, [("Content-Type", "application/json"), ("Content-Length", str(len(body)))]
        )
        return [body]

    return serve
