"""Idempotency keys on the worker's side: claim before a start, mark done or give up after.

A delivery whose task has an ``idempotency_key`` (or whose message carries one) runs only
while this worker holds the key's claim in the app's idempotency store; the claim is renewed
with the leases and ends, before the broker is told, as done (success) or released.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from ackwise.app._task import claim_key
from ackwise.contract._semantics import Outcome
from ackwise.errors import AdapterError
from ackwise.plugins._manager import open_store
from ackwise.stores._idempotency import IdempotencyStore, KeyState
from ackwise.worker._events import Skipped
from ackwise.worker._holdings import Held

if TYPE_CHECKING:
    from ackwise.app._app import App
    from ackwise.worker._settlement import Settler

__all__ = ["Claims", "NotNow"]

log = logging.getLogger("ackwise.worker")


@dataclass(frozen=True, slots=True)
class NotNow:
    """Why a delivery must not start: settle it with ``outcome`` (and ``retry_delay``)."""

    outcome: Outcome
    retry_delay: float | None = None
    detail: str = ""
    key: str = ""


class Claims:
    """The idempotency claims of one worker (the store is opened on first use)."""

    def __init__(self, app: App, worker_id: str, lease: float) -> None:
        self.app = app
        self.worker_id = worker_id
        self.lease = lease
        self._store: IdempotencyStore | None = None
        self._warned = False

    def holder(self, h: Held) -> str:
        return f"{self.worker_id}:{h.job_id}:{h.delivery.attempt}"

    def admit(self, h: Held, settler: Settler) -> bool:
        """Claim the delivery's idempotency key; settle it here when it must not run."""
        not_now = self.claim(h)
        if not_now is None:
            return True
        d = h.delivery
        if not_now.outcome is Outcome.ALREADY_DONE:
            log.info(
                "message %s: idempotency key %s is done; acked without running",
                d.message_id,
                not_now.key,
            )
            settler.settle_held(h, Outcome.ALREADY_DONE, label="done")
            settler.events.emit(
                Skipped(h.task.name, d.message_id, d.queue, d.attempt, key=not_now.key)
            )
        elif not_now.outcome is Outcome.KEY_BUSY:
            log.info(
                "message %s: idempotency key %s is held by a live execution; checked again in "
                "%.2fs",
                d.message_id,
                not_now.key,
                not_now.retry_delay,
            )
            settler.settle_held(
                h, Outcome.KEY_BUSY, label="key_busy", retry_delay=not_now.retry_delay
            )
        else:
            log.error("message %s dead-lettered: %s", d.message_id, not_now.detail)
            settler.settle_held(
                h, not_now.outcome, label="failed", reason="failed", detail=not_now.detail
            )
        return False

    def claim(self, h: Held) -> NotNow | None:
        """Claim ``h``'s key; ``None`` when it may start (it then holds the key)."""
        try:
            key = claim_key(h.task, h.envelope)
        except Exception as exc:
            return NotNow(
                Outcome.REJECTED, detail=f"idempotency_key of {h.task.name} raised {exc!r}"
            )
        if key is None:
            return None
        store = self._open()
        if store is None:
            return None
        claim = store.claim(key, self.holder(h), self.lease)
        if claim.state is KeyState.RUN:
            h.idem_key = key
            return None
        if claim.state is KeyState.DONE:
            return NotNow(Outcome.ALREADY_DONE, key=key)
        # Held by a live execution: look again soon, backing off up to the holder's lease.
        waits = sum(1 for a in h.envelope.history if a.outcome == "key_busy")
        delay = min(max(0.05, claim.retry_after), 0.25 * 2.0 ** min(waits, 20))
        return NotNow(Outcome.KEY_BUSY, retry_delay=delay, key=key)

    def done(self, h: Held, completed: bool) -> None:
        """Mark the key done (success) or give it up (failure) — before the broker is told."""
        if h.idem_key is None or self._store is None:
            return
        if completed:
            self._store.complete(h.idem_key, self.holder(h))
        else:
            self._store.release(h.idem_key, self.holder(h))
        h.idem_key = None

    def extend(self, running: Iterable[Held]) -> None:
        """Renew the claims of running executions (they live as long as the execution)."""
        if self._store is None:
            return
        claims = [(h.idem_key, self.holder(h)) for h in running if h.idem_key]
        if claims:
            self._store.extend(claims, self.lease)

    def close(self) -> None:
        if self._store is not None:
            try:
                self._store.close()
            except AdapterError:  # pragma: no cover
                log.debug("closing the idempotency store failed", exc_info=True)

    def _open(self) -> IdempotencyStore | None:
        if self._store is None:
            url = self.app.idempotency_store_url
            if url is None:
                if not self._warned:
                    log.warning(
                        "a message carries an idempotency key but app %s has no "
                        "idempotency store; it runs without one",
                        self.app.name,
                    )
                    self._warned = True
                return None
            self._store = open_store(url, self.app.plugins)
        return self._store
