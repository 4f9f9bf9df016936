"""Turning a delivery into a task to run, or settling it at once when it cannot run.

Nothing one delivery holds may stop the worker: a record the adapter found malformed, a body
that is not bytes, or any error while turning it into a task dead-letters that delivery (the
body kept as it is) and the worker goes on.  Broker errors still reach the loop, which
reconnects.
"""

from __future__ import annotations

import itertools
import logging
from typing import TYPE_CHECKING

from ackwise.contract import _envelope
from ackwise.contract._semantics import DeadLetterMessage, NackMessage, Outcome, settle
from ackwise.contract._spi import Delivery
from ackwise.errors import AdapterError, EnvelopeError, UnknownEnvelopeVersion
from ackwise.worker._events import Received
from ackwise.worker._holdings import Held
from ackwise.worker._settlement import Settler

if TYPE_CHECKING:
    from ackwise.app._app import App
    from ackwise.app._policy import WorkerConfig

__all__ = ["Intake"]

log = logging.getLogger("ackwise.worker")


class Intake:
    """Decodes deliveries for a worker of ``app``; what cannot run goes to ``settler``."""

    def __init__(self, app: App, config: WorkerConfig, settler: Settler) -> None:
        self.app = app
        self.config = config
        self.settler = settler
        self._job_ids = itertools.count(1)

    def accept(self, d: Delivery) -> Held | None:
        """The delivery as a task to run, or ``None`` when it was settled here."""
        self.settler.counters.received += 1
        try:
            return self._classify(d)
        except AdapterError:
            raise
        except Exception as exc:
            log.debug("turning message %s into a task raised", d.message_id, exc_info=True)
            self.settler.reject(
                d, "decode_error", f"turning it into a task raised {type(exc).__name__}: {exc}"
            )
            return None

    def _classify(self, d: Delivery) -> Held | None:
        env, reason, detail = _decode(d)
        if Received in self.settler.events.heard:
            task_name = env.task if env is not None else None
            self.settler.events.emit(Received(task_name, d.message_id, d.queue, d.attempt))
        if env is None:
            self.settler.reject(d, reason, detail)
            return None
        task = self.app.tasks.get(env.task)
        if task is None:
            cfg = self.config
            decision = settle(
                None,
                Outcome.UNKNOWN_TASK,
                attempt=d.attempt,
                max_deliveries=cfg.unknown_task_deliveries,
                retry_delay=cfg.unknown_task_delay,
            )
            detail = f"no task named {env.task!r} is registered in app {self.app.name!r}"
            if isinstance(decision, NackMessage):
                log.warning(
                    "message %s on %s: %s; offered again in %.1fs (delivery %d of %d)",
                    d.message_id,
                    d.queue,
                    detail,
                    cfg.unknown_task_delay,
                    d.attempt,
                    cfg.unknown_task_deliveries,
                )
            else:
                detail += f" ({d.attempt} deliveries)"
                # Its record is written as a task of the app's defaults would write it: an
                # app that does not store results by default writes none.
                if isinstance(decision, DeadLetterMessage) and self.app.store_results:
                    self.settler.record_dead(d, env.task, "unknown_task", detail)
            self.settler.carry_out(decision, d, env.task, env, label="unknown_task", error=detail)
            return None
        held = Held(d, task, env, next(self._job_ids))
        if d.attempt > task.max_deliveries:
            self.settler.settle_held(held, Outcome.OVER_LIMIT, label="max_deliveries")
            return None
        return held


def _decode(d: Delivery) -> tuple[_envelope.Envelope | None, str, str]:
    """The delivery's envelope, or ``None`` with the dead-letter reason and its detail."""
    if d.corrupt is not None:
        return None, "corrupt_record", d.corrupt
    if not isinstance(d.body, bytes):
        return (
            None,
            "corrupt_record",
            f"the adapter delivered a {type(d.body).__name__} body, not bytes",
        )
    try:
        return _envelope.decode(d.body), "", ""
    except UnknownEnvelopeVersion as exc:
        return None, "unknown_envelope_version", str(exc)
    except EnvelopeError as exc:
        return None, "decode_error", str(exc)
