"""The tasks that conformance workers run: one task per delivery mode, driven by a plan.

Worker processes import ``ackwise_conformance.workload:app``; its broker comes from
``ACKWISE_BROKER_URL``.  The journal and the gate directory come from
``ACKWISE_CONFORMANCE_JOURNAL`` and ``ACKWISE_CONFORMANCE_GATES``.  With
``ACKWISE_CONFORMANCE_RESULT_STORE`` (a result store URL) the tasks store their results
there: each execution returns ``{"pid": …, "attempt": …}``.  With
``ACKWISE_CONFORMANCE_WORKER_REGISTRY`` (a worker registry URL) the workers announce
themselves there (the harness gives the case's, named like its queue where the store has
namespaces) instead of in the broker's own registry.

A plan (the ``plan`` keyword argument) says what one execution does, in this order:

``crash``: ``"executor"`` or ``"worker"``
    SIGKILL the executing process, or the worker process (the prefork supervisor; with the
    threads pool the two are one), on the attempts listed in ``crash_attempts`` (default: all).
``gate``: name
    wait until the gate file ``name`` or ``name-<attempt>`` exists (a barrier the harness opens).
``sleep``: seconds
``fail_times``: n
    raise a retryable error while fewer than ``n`` retries happened.
``fatal``: true
    raise a non-retryable error.
``fatal_unless_gate``: name
    raise a non-retryable error unless the gate is open (a bug fixed before a replay).

A chord's callback (C26, C27) is the task :func:`callback_name` of the mode: it journals its
start and end under its key and returns the members' values it was given.
"""

from __future__ import annotations

import os
import signal
import time
from dataclasses import dataclass
from typing import Any

from ackwise import Ack, App, TaskContext
from ackwise_conformance.journal import record

__all__ = [
    "MAX_DELIVERIES",
    "NonRetryable",
    "Retryable",
    "app",
    "build_app",
    "callback_name",
    "task_name",
]

#: max_deliveries of every workload task (C14 / C15 use it).
MAX_DELIVERIES = 3
#: Retry backoff of the workload tasks: base and cap, in seconds (C12 checks the bounds).
BACKOFF = 0.2
BACKOFF_MAX = 0.8


class Retryable(Exception):
    """A failure the workload tasks retry."""


class NonRetryable(Exception):
    """A failure the workload tasks never retry."""


def task_name(mode: Ack) -> str:
    return f"conformance.run.{mode.value}"


def callback_name(mode: Ack) -> str:
    """The chord callback task of ``mode``."""
    return f"conformance.chord.{mode.value}"


@dataclass(frozen=True)
class _Paths:
    """Where one case's journal and gates are (in-process workers of concurrent cases share
    one environment, so each app carries its own)."""

    journal: str
    gates: str

    @classmethod
    def from_env(cls) -> _Paths:
        return cls(
            os.environ.get("ACKWISE_CONFORMANCE_JOURNAL", ""),
            os.environ.get("ACKWISE_CONFORMANCE_GATES", ""),
        )


def _gate_open(paths: _Paths, name: str, attempt: int) -> bool:
    return os.path.exists(os.path.join(paths.gates, name)) or os.path.exists(
        os.path.join(paths.gates, f"{name}-{attempt}")
    )


def _journal(paths: _Paths, event: str, ctx: TaskContext, key: str, **extra: Any) -> None:
    record(
        paths.journal,
        event,
        id=ctx.id,
        key=key,
        attempt=ctx.attempt,
        retries=ctx.retries,
        receipt=ctx.receipt,
        ppid=os.getppid(),
        **extra,
    )


def _execute(paths: _Paths, ctx: TaskContext, key: str, plan: dict[str, Any]) -> dict[str, int]:
    _journal(paths, "start", ctx, key)
    crash = plan.get("crash")
    if crash:
        attempts = plan.get("crash_attempts")
        if attempts is None or ctx.attempt in attempts:
            _journal(paths, "crash", ctx, key, target=crash)
            if crash == "worker" and plan.get("pool", "prefork") == "prefork":
                os.kill(os.getppid(), signal.SIGKILL)
                time.sleep(30)  # the supervisor's death takes this process with it
            os.kill(os.getpid(), signal.SIGKILL)
    gate = plan.get("gate")
    if gate:
        deadline = time.monotonic() + float(plan.get("gate_timeout", 300))
        while not _gate_open(paths, gate, ctx.attempt):
            if time.monotonic() > deadline:
                _journal(paths, "gate-timeout", ctx, key)
                raise NonRetryable(f"gate {gate} never opened")
            time.sleep(0.005)
    if plan.get("sleep"):
        time.sleep(float(plan["sleep"]))
    if ctx.retries < int(plan.get("fail_times", 0)):
        _journal(paths, "fail", ctx, key, retryable=True)
        raise Retryable(f"planned failure {ctx.retries + 1}")
    if plan.get("fatal_unless_gate") and not _gate_open(
        paths, plan["fatal_unless_gate"], ctx.attempt
    ):
        _journal(paths, "fail", ctx, key, retryable=False)
        raise NonRetryable("planned failure until the gate opens")
    if plan.get("fatal"):
        _journal(paths, "fail", ctx, key, retryable=False)
        raise NonRetryable("planned non-retryable failure")
    _journal(paths, "end", ctx, key)
    return {"pid": os.getpid(), "attempt": ctx.attempt}


def build_app(
    broker: str | None = None,
    *,
    idempotency_store: str | None = None,
    journal: str | None = None,
    gates: str | None = None,
    result_store: str | None = None,
    worker_registry: str | None = None,
) -> App:
    """The workload App on ``broker`` (default: ``$ACKWISE_BROKER_URL``).

    :param idempotency_store: default ``$ACKWISE_CONFORMANCE_IDEMPOTENCY_STORE``, else the
        broker's own store where its adapter has one.
    :param journal: the journal file its tasks write (default ``$ACKWISE_CONFORMANCE_JOURNAL``
        when a task runs).
    :param gates: the gate directory (default ``$ACKWISE_CONFORMANCE_GATES``).
    :param result_store: where the tasks store their results (default
        ``$ACKWISE_CONFORMANCE_RESULT_STORE``; neither: no results are stored).
    :param worker_registry: where its workers announce themselves (default
        ``$ACKWISE_CONFORMANCE_WORKER_REGISTRY``, else the broker's own registry).
    """
    fixed = _Paths(journal, gates) if journal is not None and gates is not None else None
    store = idempotency_store or os.environ.get("ACKWISE_CONFORMANCE_IDEMPOTENCY_STORE")
    results = result_store or os.environ.get("ACKWISE_CONFORMANCE_RESULT_STORE")
    app = App(
        "ackwise-conformance",
        broker=broker,
        idempotency_store=store or None,
        result_store=results or None,
        store_results=bool(results),
        worker_registry=worker_registry
        or os.environ.get("ACKWISE_CONFORMANCE_WORKER_REGISTRY")
        or None,
    )
    for mode in Ack:

        @app.task(
            name=task_name(mode),
            ack=mode,
            bind=True,
            max_deliveries=MAX_DELIVERIES,
            autoretry_for=(Retryable,),
            dont_autoretry_for=(NonRetryable,),
            max_retries=10,
            retry_backoff=BACKOFF,
            retry_backoff_max=BACKOFF_MAX,
            # No jitter: C12 checks both bounds of the delay (jitter is tested property-based).
            retry_jitter=False,
        )
        def run(ctx: TaskContext, key: str, plan: dict[str, Any] | None = None) -> dict[str, int]:
            return _execute(fixed or _Paths.from_env(), ctx, key, plan or {})

        @app.task(name=callback_name(mode), ack=mode, bind=True, max_deliveries=MAX_DELIVERIES)
        def collect(ctx: TaskContext, values: list[Any], key: str) -> dict[str, Any]:
            paths = fixed or _Paths.from_env()
            _journal(paths, "start", ctx, key, members=len(values))
            _journal(paths, "end", ctx, key)
            return {"pid": os.getpid(), "members": values}

    return app


app = build_app()
