"""``ackwise relay``: publish what ``app.transaction()`` wrote to the outbox (docs/outbox.md).

Each round is one transaction on the outbox's database: claim the oldest rows no other relay
holds (``FOR UPDATE SKIP LOCKED``), publish them (the broker has accepted them when
``publish`` returns), delete them, commit.  A relay killed after the publish and before the
commit leaves the rows, unlocked, to the next round: they are published again, and their
idempotency key (``outbox:<message id>``, set when they were written) gives them one effect.
Several relays share the work; an idle one LISTENs and wakes when an enqueue commits.
"""

from __future__ import annotations

import logging
import signal
import threading
import time
from typing import Any

from ackwise.app import _outbox
from ackwise.app._app import App
from ackwise.contract._spi import Outgoing, QueueSpec, redact_url
from ackwise.errors import AckwiseError, ConfigurationError

__all__ = ["Relay"]

log = logging.getLogger("ackwise.relay")

#: Longest a stopping relay waits in an idle wait before it sees the stop.
STOP_CHECK = 0.25


class Relay:
    """Moves the outbox of the PostgreSQL database at ``url`` to ``app``'s broker."""

    def __init__(self, app: App, url: str, *, batch: int = 100, interval: float = 1.0) -> None:
        try:
            import psycopg
        except ImportError as exc:
            raise ConfigurationError(
                "ackwise relay needs psycopg: pip install 'ackwise[postgresql]'"
            ) from exc
        self._psycopg: Any = psycopg
        self.app = app
        self.url = url
        self.batch = batch
        self.interval = interval
        self.stop = threading.Event()
        self.relayed = 0
        self._declared: set[str] = set()

    def install_signal_handlers(self) -> None:
        for sig in (signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, lambda *_: self.stop.set())

    def run(self) -> int:
        """Relay until stopped; reconnect (with a growing pause) after any failure."""
        log.info("relay: outbox %s -> broker %s", redact_url(self.url), self.app.broker)
        pause = 0.1
        while not self.stop.is_set():
            try:
                self._serve()
                pause = 0.1
            except (AckwiseError, self._psycopg.Error, OSError) as exc:
                log.warning("relay: %s; again in %.1fs", str(exc).strip(), pause)
                self.stop.wait(pause)
                pause = min(pause * 2, 5.0)
        return 0

    def _serve(self) -> None:
        with self._psycopg.connect(self.url, autocommit=True) as conn:
            _outbox.create_tables(conn)
            conn.execute(f'LISTEN "{_outbox.CHANNEL}"')
            while not self.stop.is_set():
                for _ in conn.notifies(timeout=0):  # what came meanwhile: this round sees it
                    pass
                if self.round(conn) < self.batch:
                    self._idle(conn)

    def _idle(self, conn: Any) -> None:
        """Wait for an enqueue's wake-up, ``interval`` seconds, or a stop (seen within
        :data:`STOP_CHECK`: a wait for notifications does not end on a signal)."""
        deadline = time.monotonic() + self.interval
        while not self.stop.is_set():
            left = deadline - time.monotonic()
            if left <= 0:
                return
            for _ in conn.notifies(timeout=min(left, STOP_CHECK), stop_after=1):
                return

    def round(self, conn: Any) -> int:
        """Publish and delete one batch of the oldest unclaimed rows; how many it moved."""
        producer = self.app.producer()
        with conn.transaction():
            rows = conn.execute(_outbox.CLAIM, {"n": self.batch}).fetchall()
            by_queue: dict[str, list[Outgoing]] = {}
            for _, queue, message_id, body, delay, priority in rows:
                out = Outgoing(message_id, bytes(body), float(delay), int(priority))
                by_queue.setdefault(queue, []).append(out)
            for queue, messages in by_queue.items():
                if queue not in self._declared:
                    producer.declare(QueueSpec(queue))
                    self._declared.add(queue)
                producer.publish(queue, messages)
            if rows:
                conn.execute(_outbox.DELETE, {"ids": [row[0] for row in rows]})
        if rows:
            self.relayed += len(rows)
            log.debug("relay: published %d message(s)", len(rows))
        return len(rows)
