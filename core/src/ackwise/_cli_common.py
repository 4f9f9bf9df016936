"""Helpers of the command line shared by its subcommands (``worker``, ``stats``, ``beat``,
``dlq``): argument types, the broker and queues a command names, tables."""

from __future__ import annotations

import argparse
import os
from typing import Any

from ackwise._spi import Adapter, redact_url
from ackwise.errors import AckwiseError, UnsupportedCapability

__all__ = ["positive_float", "queue_list", "queues_or_all", "resolve_broker", "table"]


def positive_float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number of seconds, got {text!r}") from None
    if value < 0:
        raise argparse.ArgumentTypeError(f"expected seconds >= 0, got {text!r}")
    return value


def queue_list(text: str) -> list[str]:
    return [q.strip() for q in text.split(",") if q.strip()]


def queues_or_all(adapter: Adapter, broker: str, queues: list[str]) -> list[str]:
    """``queues`` if any were named, else every queue the broker knows (or a clear error)."""
    if queues:
        return queues
    try:
        return list(adapter.queues())
    except UnsupportedCapability:
        raise AckwiseError(
            f"the broker {redact_url(broker)} cannot list its queues; name them with -Q"
        ) from None


def resolve_broker(args: argparse.Namespace) -> tuple[str, list[str]]:
    """The broker URL and queues named by ``MODULE:APP``, ``--broker`` and ``-Q``."""
    queues = args.queues if isinstance(args.queues, list) else queue_list(args.queues)
    broker = args.broker
    if args.app:
        from ackwise._execution import load_app

        app = load_app(args.app)
        broker = broker or app.broker_url
        queues = queues or app.queues()
    broker = broker or os.environ.get("ACKWISE_BROKER_URL") or "sqlite:///ackwise.db"
    return broker, list(queues)


def table(header: list[str], rows: list[list[Any]]) -> str:
    cells = [header, *[[str(c) for c in r] for r in rows]]
    widths = [max(len(r[i]) for r in cells) for i in range(len(header))]
    lines = ["  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip() for r in cells]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines)
