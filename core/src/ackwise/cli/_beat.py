"""``ackwise beat``: its command line and ``--list``'s table (the scheduler is :mod:`ackwise.beat`)."""

from __future__ import annotations

import argparse
import datetime as dt
from typing import Any

from ackwise.app._app import App
from ackwise.app._execution import load_app
from ackwise.beat._loop import Beat, BeatConfig, utcnow
from ackwise.cli._common import positive_float, table

__all__ = ["add_parser", "cmd_beat", "format_schedules"]


# -- --list --------------------------------------------------------------------------------
def _when(t: dt.datetime, tz: dt.tzinfo) -> str:
    local = t.astimezone(tz)
    return local.isoformat(timespec="milliseconds" if local.microsecond else "seconds")


def format_schedules(app: App, *, now: dt.datetime | None = None, count: int = 3) -> str:
    """The ``ackwise beat --list`` table: every schedule with its next ``count`` fire times."""
    now = now or utcnow()
    rows = []
    for p in app.schedules.values():
        upcoming = p.schedule.upcoming(now, count)
        rows.append(
            [
                p.name,
                p.task,
                p.schedule.describe(),
                p.missed if p.missed == "coalesce" else f"catch_up (limit {p.catch_up_limit})",
                p.queue or app.tasks[p.task].queue,
                ", ".join(_when(t, p.schedule.tz) for t in upcoming) or "never",
            ]
        )
    if not rows:
        return f"app {app.name}: no periodic schedules"
    return table(["schedule", "task", "when", "missed", "queue", "next fire times"], rows)


# -- command line --------------------------------------------------------------------------
def add_parser(sub: Any) -> None:
    """Add ``ackwise beat`` to the ``ackwise`` sub-commands."""
    b = sub.add_parser(
        "beat",
        help="run the periodic-task scheduler (safe to run several)",
        description="Fire periodic tasks. Several beat processes may run: one leads, each "
        "fire is claimed once in the lock store (docs/periodic.md).",
    )
    b.add_argument("app", metavar="MODULE:APP", help="import path of the App")
    b.add_argument("--lock", metavar="URL", help="lock store URL (default: the app's broker URL)")
    b.add_argument(
        "--list", action="store_true", help="print the schedules and their next fire times"
    )
    b.add_argument(
        "--tick",
        type=positive_float,
        default=BeatConfig.tick,
        metavar="SECONDS",
        help="longest sleep of the loop; followers try the lock this often (< --ttl)",
    )
    b.add_argument(
        "--ttl",
        type=positive_float,
        default=BeatConfig.ttl,
        metavar="SECONDS",
        help="seconds the lock lives without a renewal; a dead leader is replaced within ttl + tick",
    )
    b.add_argument(
        "--renew",
        type=positive_float,
        default=None,
        metavar="SECONDS",
        help="seconds between renewals of the lock, < ttl / 2 (default: ttl / 3)",
    )
    b.set_defaults(func=cmd_beat, service=True)


def cmd_beat(args: argparse.Namespace) -> int:
    app = load_app(args.app)
    if args.list:
        print(format_schedules(app))
        return 0
    config = BeatConfig(lock=args.lock, ttl=args.ttl, tick=args.tick, renew=args.renew)
    beat = Beat(app, config)
    beat.install_signal_handlers()
    return beat.run()
