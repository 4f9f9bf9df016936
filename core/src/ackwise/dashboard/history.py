"""What the dashboard remembers between pages: samples of the queues' depths and of the
workers' counters, taken while it runs, drawn as small SVG charts (no JavaScript)."""

from __future__ import annotations

import collections
import time
from collections.abc import Sequence
from dataclasses import dataclass, field

from ackwise._presence import WorkerInfo
from ackwise._spi import QueueStats

__all__ = ["History", "sparkline"]

#: Seconds between two samples, and how many are kept (an hour).
EVERY = 5.0
KEEP = 720


@dataclass
class _Sample:
    at: float
    depth: dict[str, int]  # ready + in flight, by queue
    done: int  # succeeded + failed, every worker of the registry together
    failed: int


@dataclass
class History:
    samples: collections.deque[_Sample] = field(
        default_factory=lambda: collections.deque(maxlen=KEEP)
    )

    def due(self, now: float | None = None) -> bool:
        now = time.time() if now is None else now
        return not self.samples or now - self.samples[-1].at >= EVERY

    def add(self, stats: Sequence[QueueStats], workers: Sequence[WorkerInfo] | None) -> None:
        counters = [w.counters for w in workers or ()]
        self.samples.append(
            _Sample(
                at=time.time(),
                depth={s.queue: s.ready + s.in_flight for s in stats},
                done=sum(c.get("succeeded", 0) + c.get("failed", 0) for c in counters),
                failed=sum(c.get("failed", 0) for c in counters),
            )
        )

    def depth(self, queue: str) -> list[float]:
        return [float(s.depth.get(queue, 0)) for s in self.samples]

    def throughput(self) -> list[float]:
        """Tasks finished per second between samples (a worker that restarted counts 0)."""
        pairs = zip(self.samples, list(self.samples)[1:], strict=False)
        return [max(0.0, (b.done - a.done) / max(b.at - a.at, 1e-9)) for a, b in pairs]

    def failure_rate(self) -> list[float]:
        """The share of finished tasks that failed, between samples (0 when none finished)."""
        pairs = zip(self.samples, list(self.samples)[1:], strict=False)
        return [
            (b.failed - a.failed) / (b.done - a.done) if b.done > a.done else 0.0 for a, b in pairs
        ]


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
