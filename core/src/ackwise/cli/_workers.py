"""``ackwise workers``: the workers of an app's broker, as they last announced themselves
(docs/workers.md)."""

from __future__ import annotations

import argparse
import json
import time
from dataclasses import asdict
from typing import Any

from ackwise.cli._common import table
from ackwise.contract._spi import redact_url
from ackwise.errors import ConfigurationError
from ackwise.plugins._manager import open_worker_registry
from ackwise.stores._presence import GONE_AFTER

__all__ = ["add_parser"]


def add_parser(sub: Any) -> None:
    w = sub.add_parser(
        "workers",
        help="list the workers and whether they are alive",
        description="List the workers of the app's broker as they last announced themselves: "
        f"running, stopping, stopped, or gone (not heard from for {GONE_AFTER:.0f} s).",
    )
    w.add_argument("app", metavar="MODULE:APP", help="import path of the App, e.g. proj.tasks:app")
    w.add_argument("--json", action="store_true", help="print JSON")
    w.add_argument("--alive", action="store_true", help="only the running and stopping ones")
    w.set_defaults(func=cmd_workers)


def cmd_workers(args: argparse.Namespace) -> int:
    from ackwise.app._execution import load_app

    app = load_app(args.app)
    url = app.worker_registry_url
    if url is None:
        raise ConfigurationError(
            f"no worker registry for {app.broker.scheme}:// brokers: give the app one, "
            "App(worker_registry='redis://…', 'postgresql://…' or 'sqlite:///…')"
        )
    registry = open_worker_registry(url, app.plugins)
    try:
        infos = registry.workers()
    finally:
        registry.close()
    now = time.time()
    rows = [(w, w.status(now)) for w in infos]
    if args.alive:
        rows = [(w, s) for w, s in rows if s in ("running", "stopping")]
    if args.json:
        print(
            json.dumps(
                {
                    "registry": redact_url(url),
                    "workers": [{**asdict(w), "status": s} for w, s in rows],
                },
                indent=2,
            )
        )
        return 0
    print(f"registry: {redact_url(url)}")
    print(
        table(
            [
                "worker",
                "status",
                "queues",
                "pool",
                "running",
                "succeeded",
                "failed",
                "last seen",
                "up",
                "version",
            ],
            [
                [
                    w.id,
                    s,
                    ",".join(w.queues),
                    f"{w.pool} x{w.concurrency}",
                    w.running,
                    w.counters.get("succeeded", 0),
                    w.counters.get("failed", 0),
                    f"{now - w.last_seen:.0f}s ago",
                    _ago(w.last_seen - w.started_at),
                    w.version,
                ]
                for w, s in rows
            ],
        )
    )
    return 0


def _ago(seconds: float) -> str:
    seconds = max(0.0, seconds)
    if seconds < 120:
        return f"{seconds:.0f}s"
    if seconds < 7200:
        return f"{seconds / 60:.0f}m"
    return f"{seconds / 3600:.1f}h"
