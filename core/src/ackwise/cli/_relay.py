"""``ackwise relay``: its command line (the relay itself is :mod:`ackwise.relay`)."""

from __future__ import annotations

import argparse
import logging
import os
import time
from typing import Any

from ackwise.app._execution import load_app
from ackwise.cli._common import positive_float
from ackwise.errors import ConfigurationError
from ackwise.relay._loop import Relay

__all__ = ["add_parser", "cmd_relay"]

log = logging.getLogger("ackwise.relay")


# -- command line --------------------------------------------------------------------------
def add_parser(sub: Any) -> None:
    """Add ``ackwise relay`` to the ``ackwise`` sub-commands."""
    r = sub.add_parser(
        "relay",
        help="publish the outbox of app.transaction() (safe to run several)",
        description="Publish the messages app.transaction() wrote to the ackwise_outbox table "
        "of a PostgreSQL database, then delete them (docs/outbox.md).",
    )
    r.add_argument("app", metavar="MODULE:APP", help="import path of the App")
    r.add_argument(
        "--database",
        metavar="URL",
        help="the outbox's PostgreSQL URL (default: $ACKWISE_OUTBOX_URL, else the app's broker "
        "when it is PostgreSQL)",
    )
    r.add_argument(
        "--batch", type=int, default=100, metavar="N", help="rows published per transaction"
    )
    r.add_argument(
        "--interval",
        type=positive_float,
        default=1.0,
        metavar="SECONDS",
        help="longest sleep between two looks when no enqueue wakes it",
    )
    r.set_defaults(func=cmd_relay, service=True)


def cmd_relay(args: argparse.Namespace) -> int:
    app = load_app(args.app)
    url = args.database or os.environ.get("ACKWISE_OUTBOX_URL")
    if url is None and app.broker.scheme in ("postgresql", "postgres"):
        url = app.broker_url
    if url is None:
        raise ConfigurationError(
            "ackwise relay: which database holds the outbox? give --database URL or "
            "$ACKWISE_OUTBOX_URL (a postgresql:// URL)"
        )
    if args.batch < 1:
        raise ConfigurationError(f"ackwise relay: --batch must be >= 1, got {args.batch}")
    if app.idempotency_store_url is None:
        log.warning(
            "relay: app %s has no idempotency store (App(idempotency_store=URL)): a message a "
            "relay publishes twice (killed before it deleted the row) would run twice",
            app.name,
        )
    relay = Relay(app, url, batch=args.batch, interval=args.interval)
    relay.install_signal_handlers()
    started = time.monotonic()
    status = relay.run()
    log.info(
        "relay: stopped after %.0fs, %d message(s) relayed",
        time.monotonic() - started,
        relay.relayed,
    )
    return status
