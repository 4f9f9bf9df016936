"""OpenTelemetry traces: a producer span per publish, a consumer span per execution.

Active where ``opentelemetry-api`` is installed (``pip install "ackwise[otel]"``) and the
application has set a tracer provider (an SDK); otherwise every function here is a no-op that
costs an attribute read (and, with the API installed, a look at the global provider).

- Publishing (``Task.delay``, ``apply_async``, ``App.send_many``) opens a ``PRODUCER`` span
  ``send <queue>`` and writes its W3C trace context (``traceparent``, ``tracestate``) into the
  envelope's ``headers``.
- Running a task opens a ``CONSUMER`` span ``process <queue>`` in the executor (the prefork
  child or the thread that runs it), child of and linked to the producer's context, so the
  task's own spans nest under it.

Attributes follow OpenTelemetry's messaging conventions (``messaging.system``,
``messaging.destination.name``, ``messaging.message.id``, ``messaging.operation.type``,
``messaging.batch.message_count``); ackwise adds ``ackwise.task``, ``ackwise.mode``,
``ackwise.delivery_count`` (the conventions have no broker-neutral delivery count) and
``ackwise.outcome``.  ``ACKWISE_TRACING=0`` turns it off.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator, Mapping, Sequence
from contextlib import AbstractContextManager
from typing import Any

from ackwise._version import __version__

__all__ = [
    "ENABLED",
    "ProducerSpan",
    "active",
    "finish",
    "flush",
    "messaging_system",
    "process_span",
    "send_span",
]

try:  # the optional dependency: everything below is skipped without it
    from opentelemetry import context as _otel_context
    from opentelemetry import propagate as _propagate
    from opentelemetry import trace as _trace
except ImportError:  # pragma: no cover - exercised by the no-OTel test environment
    _trace = None  # type: ignore[assignment]

ENABLED = _trace is not None and os.environ.get("ACKWISE_TRACING", "1") not in ("0", "false")

#: ``messaging.system`` by URL scheme: OpenTelemetry's well-known names where there is one.
_SYSTEMS = {"amqp": "rabbitmq", "amqps": "rabbitmq", "sqs": "aws_sqs", "rediss": "redis"}

_W3C_HEADERS = ("traceparent", "tracestate")


def active() -> bool:
    """Whether to trace: the API is installed and the application has set a tracer provider.

    Until it has, the API's spans would record nothing, yet cost ~10 µs a task (context,
    propagation, a no-op span): ackwise then does nothing at all.
    """
    global _provider_set
    if _provider_set:
        return True  # a tracer provider is set once per process, never unset
    if not ENABLED:
        return False
    # The API's own global, read directly: get_tracer_provider() looks at os.environ on every
    # call until a provider is set (~0.7 µs a task).  Where it is absent (another API
    # version) or the provider comes from the environment, the public call decides.
    if getattr(_trace, "_TRACER_PROVIDER", _MISSING) is None and not _PROVIDER_FROM_ENV:
        return False
    provider = _trace.get_tracer_provider()
    _provider_set = not isinstance(provider, _trace.ProxyTracerProvider | _trace.NoOpTracerProvider)
    return _provider_set


_provider_set = False
_MISSING = object()
_PROVIDER_FROM_ENV = "OTEL_PYTHON_TRACER_PROVIDER" in os.environ


_OFF: contextlib.nullcontext[None] = contextlib.nullcontext()


def messaging_system(scheme: str) -> str:
    """The ``messaging.system`` value of a broker URL scheme."""
    return _SYSTEMS.get(scheme, scheme)


# A proxy until the application sets its tracer provider, which it then follows.
_TRACER: Any = _trace.get_tracer("ackwise", __version__) if ENABLED else None


class ProducerSpan:
    """The span of one publish: its trace headers go into each envelope it sends."""

    def __init__(self, span: Any, headers: dict[str, str]) -> None:
        self.span = span
        #: ``traceparent`` (and ``tracestate``) of this span, for the envelope's headers.
        self.headers = headers

    def sent(self, message_ids: Sequence[str]) -> None:
        if len(message_ids) == 1:
            self.span.set_attribute("messaging.message.id", message_ids[0])
        else:
            self.span.set_attribute("messaging.batch.message_count", len(message_ids))


def send_span(scheme: str, queue: str | None) -> AbstractContextManager[ProducerSpan | None]:
    """A ``PRODUCER`` span around one publish (``None`` when tracing is off).

    ``queue`` is ``None`` for a publish to several queues (``send_many``).
    """
    return _send_span(scheme, queue) if active() else _OFF


@contextlib.contextmanager
def _send_span(scheme: str, queue: str | None) -> Iterator[ProducerSpan]:
    attributes = {
        "messaging.system": messaging_system(scheme),
        "messaging.operation.type": "send",
        "messaging.operation.name": "send",
    }
    if queue is not None:
        attributes["messaging.destination.name"] = queue
    with _TRACER.start_as_current_span(
        f"send {queue}" if queue else "send",
        kind=_trace.SpanKind.PRODUCER,
        attributes=attributes,
    ) as span:
        headers: dict[str, str] = {}
        _propagate.inject(headers)
        yield ProducerSpan(span, {k: v for k, v in headers.items() if k in _W3C_HEADERS})


@contextlib.contextmanager
def process_span(
    *,
    scheme: str,
    queue: str,
    message_id: str,
    task: str,
    mode: str,
    attempt: int,
    headers: Mapping[str, Any],
) -> Iterator[Any]:
    """A ``CONSUMER`` span around one execution, child of and linked to its producer.

    Yields the span; the caller sets ``ackwise.outcome`` through :func:`finish`.  Call it
    where :func:`active` is true.
    """
    carrier = {k: headers[k] for k in _W3C_HEADERS if isinstance(headers.get(k), str)}
    parent = _propagate.extract(carrier) if carrier else None
    links = []
    if parent is not None:
        producer = _trace.get_current_span(parent).get_span_context()
        if producer.is_valid:
            links.append(_trace.Link(producer))
    token = _otel_context.attach(parent) if parent is not None else None
    try:
        with _TRACER.start_as_current_span(
            f"process {queue}",
            kind=_trace.SpanKind.CONSUMER,
            links=links,
            attributes={
                "messaging.system": messaging_system(scheme),
                "messaging.operation.type": "process",
                "messaging.operation.name": "process",
                "messaging.destination.name": queue,
                "messaging.message.id": message_id,
                "ackwise.task": task,
                "ackwise.mode": mode,
                "ackwise.delivery_count": attempt,
            },
            record_exception=False,
            set_status_on_exception=False,
        ) as span:
            yield span
    finally:
        if token is not None:
            _otel_context.detach(token)


def finish(span: Any, outcome: str, exc: BaseException | None = None) -> None:
    """Record how the execution ended on its consumer span."""
    if span is None:
        return
    span.set_attribute("ackwise.outcome", outcome)
    if exc is not None:
        span.record_exception(exc)
        span.set_status(_trace.Status(_trace.StatusCode.ERROR, f"{type(exc).__name__}: {exc}"))


def flush(timeout_millis: int = 5000) -> None:
    """Export what the process's tracer provider still holds (before a prefork child exits)."""
    if not ENABLED:
        return
    force = getattr(_trace.get_tracer_provider(), "force_flush", None)
    if force is not None:
        force(timeout_millis)
