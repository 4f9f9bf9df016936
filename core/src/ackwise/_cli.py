"""The ``ackwise`` command line."""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
from collections.abc import Sequence
from typing import Any

from ackwise._cli_common import (
    positive_float,
    queue_list,
    queues_or_all,
    resolve_broker,
    table,
)
from ackwise._plugins import get_plugins
from ackwise._spi import QueueStats, redact_url
from ackwise.errors import AckwiseError

log = logging.getLogger("ackwise")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="ackwise", description="ackwise: a task queue with explicit delivery guarantees"
    )
    parser.add_argument("--loglevel", default=os.environ.get("ACKWISE_LOGLEVEL", "INFO"))
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    w = sub.add_parser("worker", help="run a worker", description="Run a worker process.")
    w.add_argument("app", metavar="MODULE:APP", help="import path of the App, e.g. proj.tasks:app")
    w.add_argument("-Q", "--queues", type=queue_list, default=[], help="comma-separated queues")
    w.add_argument(
        "-c", "--concurrency", type=int, default=0, help="executor slots (default: CPUs)"
    )
    w.add_argument("--pool", choices=["prefork", "threads", "solo"], default="prefork")
    w.add_argument(
        "--prefetch",
        type=int,
        default=0,
        help="messages held at once, running included (default: 4 x -c; on RabbitMQ and SQS up "
        "to 64 while tasks are short)",
    )
    w.add_argument(
        "--lease", type=positive_float, default=30.0, help="lease seconds (renewed every lease/3)"
    )
    w.add_argument(
        "--grace", type=positive_float, default=30.0, help="seconds running tasks get on SIGTERM"
    )
    w.add_argument(
        "--unknown-task-delay",
        type=positive_float,
        default=5.0,
        help="seconds before a message of an unknown task is offered again (rolling deploys)",
    )
    w.add_argument(
        "--unknown-task-deliveries",
        type=int,
        default=3,
        help="deliveries of an unknown task's message before it is dead-lettered",
    )
    w.add_argument(
        "--broker-timeout",
        type=positive_float,
        default=60.0,
        help="give up when the broker stays unreachable this many seconds",
    )
    w.set_defaults(func=cmd_worker)

    s = sub.add_parser("stats", help="show queue depths", description="Show per-queue state.")
    s.add_argument(
        "app", metavar="MODULE:APP", nargs="?", help="App whose broker and queues to show"
    )
    s.add_argument("--broker", help="broker URL (default: the app's, or $ACKWISE_BROKER_URL)")
    s.add_argument("-Q", "--queues", type=queue_list, default=[], help="comma-separated queues")
    s.add_argument("--json", action="store_true", help="print JSON")
    s.set_defaults(func=cmd_stats)

    a = sub.add_parser("adapters", help="list installed adapters and their capabilities")
    a.add_argument("--json", action="store_true", help="print JSON")
    a.set_defaults(func=cmd_adapters)

    from ackwise._beat import add_parser as add_beat
    from ackwise._dlq import add_parser as add_dlq

    add_beat(sub)
    add_dlq(sub)
    get_plugins().add_commands(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    logging.basicConfig(
        level=getattr(logging, str(args.loglevel).upper(), logging.INFO),
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    try:
        return int(args.func(args) or 0)
    except AckwiseError as exc:
        print(f"ackwise: error: {exc}", file=sys.stderr)
        return 2


def cmd_worker(args: argparse.Namespace) -> int:
    from ackwise._execution import load_app
    from ackwise._worker import Worker, WorkerConfig

    app = load_app(args.app)
    config = WorkerConfig(
        queues=args.queues,
        concurrency=args.concurrency,
        pool=args.pool,
        prefetch=args.prefetch,
        lease=args.lease,
        grace=args.grace,
        app_path=args.app,
        unknown_task_delay=args.unknown_task_delay,
        unknown_task_deliveries=args.unknown_task_deliveries,
        broker_timeout=args.broker_timeout,
    )
    worker = Worker(app, config)
    worker.install_signal_handlers()
    return worker.run()


def _stats_rows(broker: str, queues: list[str]) -> list[QueueStats]:
    from ackwise._plugins import open_adapter

    adapter = open_adapter(broker)
    adapter.open()
    try:
        return [adapter.stats(q) for q in queues_or_all(adapter, broker, queues)]
    finally:
        adapter.close()


def cmd_stats(args: argparse.Namespace) -> int:
    broker, queues = resolve_broker(args)
    rows = _stats_rows(broker, queues)
    if args.json:
        print(
            json.dumps(
                {"broker": redact_url(broker), "queues": [r.as_dict() for r in rows]}, indent=2
            )
        )
        return 0
    print(f"broker: {redact_url(broker)}")
    print(
        table(
            ["queue", "ready", "delayed", "in flight", "dead", "oldest age"],
            [
                [r.queue, r.ready, r.delayed, r.in_flight, r.dead, f"{r.oldest_age:.1f}s"]
                for r in rows
            ],
        )
    )
    return 0


def cmd_adapters(args: argparse.Namespace) -> int:
    plugins = get_plugins()
    out: list[dict[str, Any]] = []
    for entry in plugins.adapters.entries():
        item: dict[str, Any] = {
            "scheme": entry.scheme,
            "adapter": entry.import_path,
            "distribution": entry.distribution,
            "plugin": entry.plugin,
        }
        try:
            item["capabilities"] = entry.load().capabilities.describe()
        except AckwiseError as exc:
            item["error"] = str(exc)
        out.append(item)
    if args.json:
        print(json.dumps(out, indent=2))
        return 0
    rows = []
    for item in out:
        caps = item.get("capabilities")
        if caps is None:
            desc = f"unavailable: {item['error']}"
        else:
            desc = ", ".join(
                f"{k}={v}" for k, v in caps.items() if v not in (None, False) or k == "native_delay"
            )
        rows.append([item["scheme"], item["distribution"], item["adapter"], desc])
    print(table(["scheme", "distribution", "adapter", "capabilities"], rows))
    return 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
