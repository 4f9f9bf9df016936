"""``ackwise dashboard``: serve the web page of an app's queues, workers and dead letters
(docs/dashboard.md).  The web part (``ackwise.dashboard``) is imported only when it runs."""

from __future__ import annotations

import argparse
import logging
import os
from typing import Any

from ackwise.cli._startup import StopDuringStartUp
from ackwise.errors import ConfigurationError

log = logging.getLogger("ackwise.dashboard")

__all__ = ["add_parser"]


def add_parser(sub: Any) -> None:
    d = sub.add_parser(
        "dashboard",
        help="serve the web dashboard (queues, workers, dead letters)",
        description="Serve the dashboard of an app: queues, workers, dead letters with replay "
        "and purge. Binds 127.0.0.1; any other address needs --token.",
    )
    d.add_argument("app", metavar="MODULE:APP", help="import path of the App, e.g. proj.tasks:app")
    d.add_argument(
        "--host", default="127.0.0.1", help="address to bind; any but loopback needs --token"
    )
    d.add_argument("--port", type=int, default=8088, help="port to listen on")
    d.add_argument(
        "--token",
        # Never printed: the help says where the default comes from, not what it is.
        default=os.environ.get("ACKWISE_DASHBOARD_TOKEN"),
        help="required of every request, as a bearer token or the basic-auth password; "
        "needed to bind anything but loopback (default: $ACKWISE_DASHBOARD_TOKEN, else none)",
    )
    d.add_argument(
        "--read-only",
        action="store_true",
        help="no replay or purge (buttons hidden, POSTs refused)",
    )
    d.set_defaults(func=cmd_dashboard, service=True)


def cmd_dashboard(args: argparse.Namespace) -> int:
    try:
        import uvicorn

        from ackwise.dashboard import create_app
        from ackwise.dashboard.security import is_loopback
    except ImportError as exc:
        raise ConfigurationError(
            f"ackwise dashboard needs the dashboard extra ({exc.name} is missing): "
            "pip install 'ackwise[dashboard]'"
        ) from None
    from ackwise.app._execution import load_app

    if not is_loopback(args.host) and not args.token:
        raise ConfigurationError(
            f"ackwise dashboard: binding {args.host} (not loopback) needs a token: "
            "--token or $ACKWISE_DASHBOARD_TOKEN"
        )
    app = load_app(args.app)
    web = create_app(app, token=args.token or None, read_only=args.read_only)
    try:
        uvicorn.run(web, host=args.host, port=args.port, log_level="warning")
    except StopDuringStartUp as stop:
        # Before uvicorn takes the signals, one ends the start-up.  After its graceful stop
        # uvicorn gives the signal it handled back to the handler from before it started,
        # which is ours (ackwise.cli._startup), instead of dying of it: a stop, status 0.
        log.warning("%s received: dashboard stopped", stop.name)
    return 0
