"""``ackwise stats --watch``: the queue table, refreshed, with how fast each count moves."""

from __future__ import annotations

import sys
import time
from collections.abc import Collection, Sequence
from typing import TextIO

from ackwise.cli._common import figure, queues_or_all, table
from ackwise.contract._figures import unknown_figures
from ackwise.contract._spi import Adapter, QueueStats, redact_url
from ackwise.errors import AckwiseError
from ackwise.plugins._manager import open_adapter

__all__ = ["render", "watch"]

_CLEAR = "\x1b[H\x1b[2J"


def render(
    broker: str,
    rows: Sequence[QueueStats],
    previous: dict[str, QueueStats],
    elapsed: float,
    unknown: Collection[str] = (),
) -> str:
    """The table of ``rows``; ``/s`` columns are the change per second since ``previous``
    (taken ``elapsed`` seconds earlier): a growing backlog shows a positive ``ready/s``.
    The figures in ``unknown`` (the broker cannot tell them) show ``n/a``."""

    def rate(row: QueueStats, field: str) -> str:
        before = previous.get(row.queue)
        if before is None or elapsed <= 0:
            return "-"
        return f"{(getattr(row, field) - getattr(before, field)) / elapsed:+.1f}"

    body = table(
        ["queue", "ready", "ready/s", "delayed", "in flight", "dead", "dead/s", "oldest age"],
        [
            [
                r.queue,
                r.ready,
                rate(r, "ready"),
                r.delayed,
                figure(r, "in_flight", unknown),
                r.dead,
                rate(r, "dead"),
                figure(r, "oldest_age", unknown),
            ]
            for r in rows
        ],
    )
    stamp = time.strftime("%H:%M:%S")
    return f"broker: {redact_url(broker)}   {stamp}   (Ctrl-C to stop)\n{body}"


def watch(
    broker: str,
    queues: list[str],
    interval: float,
    *,
    out: TextIO | None = None,
    rounds: int | None = None,
) -> int:
    """Print the table every ``interval`` seconds until interrupted (or ``rounds`` times).

    On a terminal each table replaces the last; elsewhere they follow one another.  A broker
    error is one line, and the next round tries again.
    """
    out = out or sys.stdout
    clear = _CLEAR if out.isatty() else ""
    adapter = open_adapter(broker)
    adapter.open()
    previous: dict[str, QueueStats] = {}
    taken = 0.0
    done = 0
    try:
        names = queues_or_all(adapter, broker, queues)
        unknown = unknown_figures(adapter.capabilities)
        broken = False
        while rounds is None or done < rounds:
            try:
                if broken:  # a fresh connection after an error
                    _close_quietly(adapter)
                    adapter.open()
                    broken = False
                now = time.monotonic()
                rows = [adapter.stats(q) for q in names]
                text = render(broker, rows, previous, now - taken if previous else 0.0, unknown)
                previous, taken = {r.queue: r for r in rows}, now
            except AckwiseError as exc:
                text = f"broker: {redact_url(broker)}: stats failed: {exc} (retrying)"
                previous, broken = {}, True
            out.write(f"{clear}{text}\n")
            out.flush()
            done += 1
            if rounds is None or done < rounds:
                time.sleep(interval)
    except KeyboardInterrupt:
        pass
    finally:
        _close_quietly(adapter)
    return 0


def _close_quietly(adapter: Adapter) -> None:
    try:
        adapter.close()
    except AckwiseError:
        pass
