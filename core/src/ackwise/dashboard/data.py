"""What the dashboard shows, read from the broker and the worker registry."""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass

from ackwise.app._app import App
from ackwise.app._deadletters import SCAN_LIMIT, Entry
from ackwise.contract._figures import unknown_figures
from ackwise.contract._spi import Adapter, DeadLetter, QueueStats
from ackwise.errors import UnsupportedCapability
from ackwise.plugins._manager import open_worker_registry
from ackwise.stores._presence import WorkerInfo

__all__ = ["DeadPage", "Source"]

#: Dead letters on one page.
PAGE = 50


@dataclass
class DeadPage:
    entries: list[Entry]
    total: int
    page: int
    pages: int
    reasons: list[str]


class Source:
    """The app's broker (one connection, opened on first use) and worker registry."""

    def __init__(self, app: App) -> None:
        self.app = app
        self._adapter: Adapter | None = None

    @property
    def adapter(self) -> Adapter:
        if self._adapter is None:
            adapter = self.app.adapter()
            adapter.open()
            self._adapter = adapter
        return self._adapter

    def close(self) -> None:
        if self._adapter is not None:
            self._adapter.close()
            self._adapter = None

    def queues(self) -> list[str]:
        """The broker's queues where it can list them, else the app's."""
        try:
            names = list(self.adapter.queues())
        except UnsupportedCapability:
            names = []
        return sorted(set(names) | set(self.app.queues()))

    def stats(self) -> list[QueueStats]:
        return [self.adapter.stats(q) for q in self.queues()]

    def unknown(self) -> dict[str, str]:
        """The figures of :meth:`stats` this broker cannot report, each with why (as
        ``ackwise stats`` decides them: shown "—", never a 0)."""
        return unknown_figures(self.adapter.capabilities)

    def workers(self) -> list[WorkerInfo] | None:
        """The registry's records; ``None`` when the app has no registry."""
        url = self.app.worker_registry_url
        if url is None:
            return None
        registry = open_worker_registry(url, self.app.plugins)
        try:
            return registry.workers()
        finally:
            registry.close()

    def dead(
        self, queues: Sequence[str], *, reason: str = "", task: str = "", page: int = 1
    ) -> DeadPage:
        """One page of dead letters, newest first; filtered by reason and task."""
        letters: list[DeadLetter] = []
        for q in queues:
            letters.extend(self.adapter.dead_letters(q, limit=SCAN_LIMIT))
        reasons = sorted({d.reason for d in letters})
        if reason:
            letters = [d for d in letters if d.reason == reason]
        letters.sort(key=lambda d: d.dead_at, reverse=True)
        if task:  # decoding every letter costs: only when asked to filter on it
            entries = [e for e in map(Entry.of, letters) if e.task == task]
            total = len(entries)
        else:
            total = len(letters)
            entries = []
        pages = max(1, -(-total // PAGE))
        page = min(max(1, page), pages)
        start = (page - 1) * PAGE
        if task:
            shown = entries[start : start + PAGE]
        else:
            shown = [Entry.of(d) for d in letters[start : start + PAGE]]
        return DeadPage(shown, total, page, pages, reasons)

    def recent_dead(self, n: int) -> list[Entry]:
        """The ``n`` newest dead letters of every queue (with their last error)."""
        letters: list[DeadLetter] = []
        for q in self.queues():
            letters.extend(self.adapter.dead_letters(q, limit=SCAN_LIMIT))
        letters.sort(key=lambda d: d.dead_at, reverse=True)
        return [Entry.of(d) for d in letters[:n]]

    def dead_letter(self, queue: str, message_id: str) -> Entry | None:
        for d in self.adapter.dead_letters(queue, limit=SCAN_LIMIT):
            if d.message_id == message_id:
                return Entry.of(d)
        return None


def age(t: float) -> str:
    """``12s``, ``5m``, ``3.2h``, ``2.0d`` ago."""
    s = max(0.0, time.time() - t)
    if s < 120:
        return f"{s:.0f}s"
    if s < 7200:
        return f"{s / 60:.0f}m"
    if s < 172800:
        return f"{s / 3600:.1f}h"
    return f"{s / 86400:.1f}d"
