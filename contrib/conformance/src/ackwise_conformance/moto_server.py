"""moto's server, as the conformance suite runs it: ``python -m ackwise_conformance.moto_server``.

The same arguments as ``moto_server``.  One change, for a known emulator deviation: moto 5.2's
server is threaded and its SQS ``ReceiveMessage`` is not atomic, so two concurrent receives can
both take the same visible message (both get it, with receive counts 1 and 2, within
milliseconds).  SQS hands a message to one receiver per visibility timeout (standard queues
may, rarely, deliver a copy twice; never two receivers racing as a rule).  Here every SQS
operation that reads or changes messages runs under one lock; a long poll waits *outside* the
lock, polling every 0.1 s, so one waiting receiver does not stall the others.
"""

from __future__ import annotations

import functools
import threading
import time
from typing import Any

from moto.server import main
from moto.sqs.models import SQSBackend

_LOCK = threading.RLock()
_POLL = 0.1
_LOCKED = (
    "send_message",
    "send_message_batch",
    "delete_message",
    "delete_message_batch",
    "change_message_visibility",
    "change_message_visibility_batch",
    "purge_queue",
    "get_queue_attributes",
)


def _locked(method: Any) -> Any:
    @functools.wraps(method)
    def call(*args: Any, **kwargs: Any) -> Any:
        with _LOCK:
            return method(*args, **kwargs)

    return call


def patch() -> None:
    """Make moto's SQS message operations atomic with respect to each other."""
    receive = SQSBackend.receive_message
    if getattr(receive, "_ackwise_atomic", False):
        return

    def receive_message(
        self: Any,
        queue_name: str,
        count: int,
        wait_seconds_timeout: int,
        visibility_timeout: int,
        message_attribute_names: list[str] | None = None,
    ) -> Any:
        deadline = time.monotonic() + (wait_seconds_timeout or 0)
        while True:
            with _LOCK:
                got = receive(
                    self, queue_name, count, 0, visibility_timeout, message_attribute_names
                )
            remaining = deadline - time.monotonic()
            if got or remaining <= 0:
                return got
            time.sleep(min(_POLL, remaining))

    receive_message._ackwise_atomic = True  # type: ignore[attr-defined]
    SQSBackend.receive_message = receive_message  # type: ignore[method-assign]
    for name in _LOCKED:
        setattr(SQSBackend, name, _locked(getattr(SQSBackend, name)))


if __name__ == "__main__":
    patch()
    main()
