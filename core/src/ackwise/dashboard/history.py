"""What the dashboard remembers between pages: samples of the queues' depths and of the
workers' counters, taken while it runs, drawn as small SVG charts (no JavaScript)."""

from __future__ import annotations

import collections
import time
from collections.abc import Collection, Sequence
from dataclasses import dataclass, field

from ackwise.contract._spi import QueueStats
from ackwise.stores._presence import WorkerInfo

__all__ = ["History", "sparkline"]

#: Seconds between two samples, and how many are kept (an hour).
EVERY = 5.0
KEEP = 720


@dataclass
class _Sample:
    at: float
    depth: dict[str, int]  # ready + in flight (ready alone where in flight is unknown), by queue
    #: ``(finished, failed)`` by every worker of the registry together; ``""``: all queues.
    done: dict[str, tuple[int, int]]


@dataclass
class History:
    samples: collections.deque[_Sample] = field(
        default_factory=lambda: collections.deque(maxlen=KEEP)
    )

    def due(self, now: float | None = None) -> bool:
        now = time.time() if now is None else now
        return not self.samples or now - self.samples[-1].at >= EVERY

    def add(
        self,
        stats: Sequence[QueueStats],
        workers: Sequence[WorkerInfo] | None,
        unknown: Collection[str] = (),
    ) -> None:
        """Remember ``stats`` and the workers' counts now; ``unknown``: the figures the broker
        cannot report (:func:`ackwise.contract._figures.unknown_figures`), which count for nothing
        (an unknown in flight is not 0: the depth is then the ready messages alone)."""
        done: dict[str, tuple[int, int]] = {}
        for w in workers or ():
            for queue, (ok, failed) in w.by_queue.items():
                for key in (queue, ""):
                    n, f = done.get(key, (0, 0))
                    done[key] = (n + ok + failed, f + failed)
        if "in_flight" in unknown:
            depth = {s.queue: s.ready for s in stats}
        else:
            depth = {s.queue: s.ready + s.in_flight for s in stats}
        self.samples.append(_Sample(at=time.time(), depth=depth, done=done))

    def depth(self, queue: str) -> list[float]:
        return [float(s.depth.get(queue, 0)) for s in self.samples]

    def _steps(self, queue: str) -> list[tuple[float, int, int]]:
        """(seconds, finished, failed) between two samples; a worker that restarted or went
        away counts no negative work."""
        out = []
        for a, b in zip(self.samples, list(self.samples)[1:], strict=False):
            (n0, f0), (n1, f1) = a.done.get(queue, (0, 0)), b.done.get(queue, (0, 0))
            out.append((max(b.at - a.at, 1e-9), max(0, n1 - n0), max(0, f1 - f0)))
        return out

    def throughput(self, queue: str = "") -> list[float]:
        """Tasks finished per second between samples, of ``queue`` (``""``: all)."""
        return [n / dt for dt, n, _ in self._steps(queue)]

    def failure_rate(self, queue: str = "") -> list[float]:
        """The share of finished tasks that failed, between samples (0 when none finished)."""
        return [min(1.0, f / n) if n else 0.0 for _, n, f in self._steps(queue)]


def sparkline(values: Sequence[float], width: int = 120, height: int = 24) -> str:
    """An inline SVG line of ``values`` (empty with fewer than two)."""
    if len(values) < 2:
        return ""
    top = max(values) or 1.0
    step = width / (len(values) - 1)
    points = " ".join(
        f"{i * step:.1f},{height - 1 - (v / top) * (height - 2):.1f}" for i, v in enumerate(values)
    )
    return (
        f'<svg class="spark" width="{width}" height="{height}" viewBox="0 0 {width} {height}" '
        f'role="img" aria-label="last {len(values)} samples, max {top:g}">'
        f'<polyline fill="none" stroke="#1d4ed8" stroke-width="1.5" points="{points}"/></svg>'
    )
