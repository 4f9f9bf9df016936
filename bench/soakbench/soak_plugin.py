"""The worker's own view in the soak journal: which worker held a delivery when.

``bench/soak.py`` registers this module in every worker process (``ACKWISE_PLUGINS=soak_plugin``,
this directory on ``PYTHONPATH``).  The conformance workload journals what the *executor* does
(``start`` / ``end``, with its pid and ppid); these hooks run on the worker's consumer thread
and add what the executor cannot say:

``handed``  the delivery was handed to the executor (``ackwise_task_started``): after an early
            ack, before the body starts.  A worker SIGKILLed in between loses an EARLY task
            that has no ``start`` record; this record ties the loss to the worker.
``lost``    the worker reports an early-acked task lost (its executor died).
``dead``    the worker dead-lettered the message, with the reason.

One ``O_APPEND`` write per record, like the workload's own journal lines (a few µs).
"""

from __future__ import annotations

import os

from ackwise import hookimpl
from ackwise_conformance.journal import record

_JOURNAL = os.environ.get("ACKWISE_CONFORMANCE_JOURNAL", "")


@hookimpl
def ackwise_task_started(task: str, message_id: str, attempt: int, queue: str) -> None:
    if _JOURNAL:
        record(_JOURNAL, "handed", id=message_id, attempt=attempt)


@hookimpl
def ackwise_task_lost(task: str, message_id: str, queue: str, reason: str) -> None:
    if _JOURNAL:
        record(_JOURNAL, "lost", id=message_id, reason=reason)


@hookimpl
def ackwise_task_dead_lettered(task: str | None, message_id: str, queue: str, reason: str) -> None:
    if _JOURNAL:
        record(_JOURNAL, "dead", id=message_id, reason=reason)
