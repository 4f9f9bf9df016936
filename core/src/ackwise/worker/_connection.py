"""The worker's connection to its broker: opened at start with retries, reopened after errors.

A worker started with its broker (or a service in front of it) still coming up, or while
another process holds a SQLite write lock, waits instead of exiting: under a process
supervisor an exit at once is a crash loop.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

from ackwise.app._policy import check_hold_limit
from ackwise.contract._backoff import Backoff
from ackwise.contract._spi import Adapter, QueueSpec
from ackwise.errors import (
    AdapterError,
    BrokerUnavailable,
    ConfigurationError,
    TransientAdapterError,
)
from ackwise.worker._events import BrokerError, Events

if TYPE_CHECKING:
    from ackwise.app._app import App

__all__ = ["BrokerConnection"]

log = logging.getLogger("ackwise.worker")


class BrokerConnection:
    """Opens, declares and reopens ``adapter`` for a worker of ``app`` on ``queues``."""

    def __init__(
        self,
        app: App,
        adapter: Adapter,
        queues: Sequence[str],
        broker_timeout: float,
        events: Events | None = None,
    ) -> None:
        self.app = app
        self.adapter = adapter
        self.queues = list(queues)
        self.broker_timeout = broker_timeout
        self.events = events

    def open(self, stopping: Callable[[], bool], pause: Callable[[float], None]) -> bool:
        """Connect and declare the queues, retrying while the broker is unreachable.

        Returns ``False`` when ``stopping()`` became true meanwhile; raises
        :class:`BrokerUnavailable` after ``broker_timeout``.  Permanent errors (credentials,
        configuration) are raised at once.  ``pause(seconds)`` waits between attempts.
        """
        backoff = Backoff()
        started = time.monotonic()
        attempt = 0
        while not stopping():
            attempt += 1
            try:
                self.adapter.open()
                self._check_hold_limit()
                for q in self.queues:
                    self.adapter.declare(QueueSpec(q, max_deliveries=self._max_deliveries_for(q)))
            except TransientAdapterError as exc:
                self.close()
                if self.events is not None:
                    self.events.emit(BrokerError(str(exc), transient=True))
                waited = time.monotonic() - started
                left = self.broker_timeout - waited
                if left <= 0:
                    raise BrokerUnavailable(
                        f"broker {self.app.broker} unreachable at start for {waited:.0f}s "
                        f"({attempt} attempts, --broker-timeout {self.broker_timeout:.0f}s); "
                        f"last error: {exc}"
                    ) from exc
                delay = min(backoff.next(), left)
                log.warning(
                    "broker %s not reachable at start (attempt %d, %.0fs of --broker-timeout "
                    "%.0fs): %s; retrying in %.1fs",
                    self.app.broker,
                    attempt,
                    waited,
                    self.broker_timeout,
                    exc,
                    delay,
                )
                pause(delay)
                continue
            if attempt > 1:
                log.info(
                    "broker %s reachable after %d attempts (%.1fs)",
                    self.app.broker,
                    attempt,
                    time.monotonic() - started,
                )
            return True
        return False

    def reopen(self, delay: float) -> None:
        """After a broker error: wait ``delay``, then connect again."""
        time.sleep(delay)
        self.close()
        self.adapter.open()

    def close(self) -> None:
        try:
            self.adapter.close()
        except AdapterError:
            log.debug("closing the adapter failed", exc_info=True)

    def _check_hold_limit(self) -> None:
        limit = self.adapter.capabilities.max_hold
        if limit is None:
            return
        queues = set(self.queues)
        try:
            unbounded = check_hold_limit(
                [t for t in self.app.tasks.values() if t.queue in queues], limit
            )
        except ConfigurationError:
            self.close()
            raise
        if unbounded:
            log.info(
                "tasks %s have no time_limit; the broker takes a delivery back after %.0fs "
                "unacknowledged",
                unbounded,
                limit,
            )

    def _max_deliveries_for(self, queue_name: str) -> int:
        values = [t.max_deliveries for t in self.app.tasks.values() if t.queue == queue_name]
        return max(values, default=5)
