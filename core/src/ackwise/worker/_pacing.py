"""A worker's side of rate limits (docs/rate-limits.md): a rate-limited task starts only at a
slot reserved in the broker's shared :class:`~ackwise.RateLimiter`.

A worker reserves a task's next slot when a delivery of it could start (a free executor slot)
and it has no slot of that task waiting already: so it holds at most one reservation per task,
and the slots of all workers interleave in the shared store.  Until its slot comes the delivery
stays in the prefetch buffer (its lease renewed) and the others start past it.  When it comes
the delivery goes to the executor, whose thread records the start right before the task's
function (:meth:`Pacer.gate`), through the same store.
"""

from __future__ import annotations

import threading
from typing import TYPE_CHECKING

from ackwise.plugins._manager import open_rate_limiter
from ackwise.stores._ratelimit import RateLimiter, StartGate, first_margin

if TYPE_CHECKING:
    from ackwise.app._app import App
    from ackwise.worker._holdings import Held

__all__ = ["Pacer"]


class Pacer:
    """Which held deliveries of rate-limited tasks may start now."""

    def __init__(self, app: App) -> None:
        self.app = app
        #: Whether any task of the app has a rate limit (nothing to do otherwise).
        self.active = any(t.rate_interval is not None for t in app.tasks.values())
        self.limiter: RateLimiter | None = None
        self._due: dict[str, float] = {}  # task name -> when its reserved slot comes (monotonic)
        # The executor's threads record starts through the same limiter as this loop.
        self._lock = threading.Lock()

    def open(self) -> None:
        """Open the app's rate limit store, where a task has a rate limit.

        A rate-limited task of an app without one was refused before (check_app)."""
        if self.active and self.limiter is None:
            url = self.app.rate_limit_store_url
            assert url is not None, "check_app() refuses a rate_limit with nowhere to share it"
            self.limiter = open_rate_limiter(url, self.app.plugins)

    def close(self) -> None:
        with self._lock:
            limiter, self.limiter = self.limiter, None
        if limiter is not None:
            limiter.close()

    def gate(self) -> StartGate:
        """What the thread pool's threads call right before a rate-limited task's function
        (the limiter of :meth:`open`, shared with this loop)."""
        assert self.limiter is not None, "Pacer.open() first"
        return StartGate(self.limiter, self._lock)

    def may_start(self, h: Held, now: float) -> bool:
        """Whether ``h`` may start at ``now`` (monotonic); reserves its task's next slot when
        the task has none waiting here."""
        interval = h.task.rate_interval
        if interval is None:
            return True
        name = h.task.name
        due = self._due.get(name)
        if due is None:
            assert self.limiter is not None, "Pacer.open() first"
            # Slots as far apart as the starts will be: an interval, and the margin each
            # start is recorded with (StartGate), so that the gate does not wait for it.
            spacing = interval + first_margin(interval)
            with self._lock:
                due = now + self.limiter.reserve(name, spacing)
        if due <= now:
            self._due.pop(name, None)
            return True
        self._due[name] = due
        return False

    def next_due(self) -> float | None:
        """When the next reserved slot comes (monotonic), or ``None``."""
        return min(self._due.values(), default=None)
