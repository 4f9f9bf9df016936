"""The ``ackwise`` command line."""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
from collections.abc import Sequence
from typing import Any

from ackwise._version import __version__
from ackwise.cli import _startup
from ackwise.cli._common import (
    BROKER_HELP,
    Parser,
    add_logging_options,
    figure,
    positive_float,
    queue_list,
    queues_or_all,
    resolve_broker,
    stats_dict,
    table,
)
from ackwise.contract._figures import unknown_figures
from ackwise.contract._logconfig import configure as configure_logging
from ackwise.contract._logconfig import parse_level
from ackwise.contract._spi import QueueStats, redact_url
from ackwise.errors import AckwiseError
from ackwise.plugins._manager import ENTRY_POINT_GROUP, get_plugins

log = logging.getLogger("ackwise")


def build_parser() -> argparse.ArgumentParser:
    parser = Parser(
        prog="ackwise", description="ackwise: a task queue with explicit delivery guarantees"
    )
    parser.add_argument(
        "--version",
        action=_Version,
        help="print the versions of ackwise, of each installed adapter and plugin, and of Python",
    )
    add_logging_options(parser, after_command=False)
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    w = sub.add_parser("worker", help="run a worker", description="Run a worker process.")
    w.add_argument("app", metavar="MODULE:APP", help="import path of the App, e.g. proj.tasks:app")
    w.add_argument(
        "-Q",
        "--queues",
        type=queue_list,
        default=[],
        help="comma-separated queues to consume, round robin (default: the queues of the "
        "app's tasks)",
    )
    w.add_argument(
        "-c",
        "--concurrency",
        type=int,
        default=0,
        metavar="N",
        help="executor slots (default: the CPU count; solo: 1)",
    )
    w.add_argument(
        "--pool",
        choices=["prefork", "threads", "solo"],
        default="prefork",
        help="prefork: a child process per slot; threads: threads of the worker process; "
        "solo: one executor thread",
    )
    w.add_argument(
        "--prefetch",
        type=int,
        default=0,
        metavar="N",
        help="messages held at once, running included (default: 0, automatic: 4 x -c, and up "
        "to 64 while tasks are short on brokers with deep_prefetch: RabbitMQ, SQS, Redis, "
        "SQLite)",
    )
    w.add_argument(
        "--lease",
        type=positive_float,
        default=30.0,
        metavar="SECONDS",
        help="seconds a delivery is owned, renewed every lease/3",
    )
    w.add_argument(
        "--grace",
        type=positive_float,
        default=30.0,
        metavar="SECONDS",
        help="seconds running tasks get to finish after SIGTERM; then a cold stop",
    )
    w.add_argument(
        "--unknown-task-delay",
        type=positive_float,
        default=5.0,
        metavar="SECONDS",
        help="seconds before a message of a task this worker does not know is offered again, "
        "for rolling deploys",
    )
    w.add_argument(
        "--unknown-task-deliveries",
        type=int,
        default=3,
        metavar="N",
        help="deliveries of an unknown task's message before it is dead-lettered unknown_task",
    )
    w.add_argument(
        "--broker-timeout",
        type=positive_float,
        default=60.0,
        metavar="SECONDS",
        help="seconds the broker may stay unreachable, at start or while running, before the "
        "worker gives up with exit status 2",
    )
    w.add_argument(
        "--metrics-port",
        type=int,
        default=_env_int("ACKWISE_METRICS_PORT"),
        metavar="PORT",
        help="serve Prometheus metrics and /healthz on this port, 0: any free one (default: "
        "$ACKWISE_METRICS_PORT, else none; needs ackwise[prometheus])",
    )
    w.add_argument(
        "--metrics-host",
        default=os.environ.get("ACKWISE_METRICS_HOST") or "0.0.0.0",
        metavar="HOST",
        help="address the metrics server listens on (default: %(default)s; "
        "$ACKWISE_METRICS_HOST sets it)",
    )
    w.add_argument(
        "--metrics-stats-interval",
        type=positive_float,
        default=15.0,
        metavar="SECONDS",
        help="read the queues' depths from the broker at most this often, in seconds; 0: no "
        "queue gauges",
    )
    w.set_defaults(func=cmd_worker, service=True)

    s = sub.add_parser("stats", help="show queue depths", description="Show per-queue state.")
    s.add_argument(
        "app", metavar="MODULE:APP", nargs="?", help="App whose broker and queues to show"
    )
    s.add_argument("--broker", metavar="URL", help=BROKER_HELP)
    s.add_argument(
        "-Q",
        "--queues",
        type=queue_list,
        default=[],
        help="comma-separated queues (default: the app's, else every queue the broker lists)",
    )
    s.add_argument("--json", action="store_true", help="print JSON (null: the broker cannot tell)")
    s.add_argument(
        "--watch", action="store_true", help="refresh the table until Ctrl-C, with rates"
    )
    s.add_argument(
        "--interval",
        type=positive_float,
        default=2.0,
        metavar="SECONDS",
        help="seconds between refreshes of --watch",
    )
    s.set_defaults(func=cmd_stats)

    a = sub.add_parser("adapters", help="list installed adapters and their capabilities")
    a.add_argument("--json", action="store_true", help="print JSON")
    a.set_defaults(func=cmd_adapters)

    from ackwise.cli._beat import add_parser as add_beat
    from ackwise.cli._dashboard import add_parser as add_dashboard
    from ackwise.cli._dlq import add_parser as add_dlq
    from ackwise.cli._relay import add_parser as add_relay
    from ackwise.cli._workers import add_parser as add_workers

    add_beat(sub)
    add_dlq(sub)
    add_relay(sub)
    add_workers(sub)
    add_dashboard(sub)
    get_plugins().add_commands(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    # A signal from now on is recorded, then handled once the command is known (_startup).
    _startup.hold()
    try:
        return _main(argv)
    finally:
        _startup.restore()


def _main(argv: Sequence[str] | None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        level = parse_level(str(args.loglevel))
        drivers = (
            parse_level(args.driver_loglevel, "--driver-loglevel") if args.driver_loglevel else None
        )
        tasks = parse_level(args.task_loglevel, "--task-loglevel") if args.task_loglevel else None
    except ValueError as exc:
        parser.error(str(exc))
    configure_logging(level, args.log_format, drivers, task_level=tasks)
    try:
        _startup.release(service=getattr(args, "service", False))
        return int(args.func(args) or 0)
    except _startup.StopDuringStartUp as stop:
        log.warning("%s received while starting: stopped", stop.name)
        return 0
    except AckwiseError as exc:
        print(f"ackwise: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:  # Ctrl-C where the command does not handle it: no traceback
        print("ackwise: interrupted", file=sys.stderr)
        return 130


def cmd_worker(args: argparse.Namespace) -> int:
    from ackwise.app._execution import load_app
    from ackwise.worker._loop import Worker, WorkerConfig

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
    # From here a signal is the worker's graceful stop: run() sees it before it connects.
    worker.install_signal_handlers()
    metrics = None
    try:
        if args.metrics_port is not None:
            from ackwise.worker._metrics import WorkerMetrics

            metrics = WorkerMetrics(worker, stats_interval=args.metrics_stats_interval)
            metrics.serve(args.metrics_port, args.metrics_host)
        return worker.run()
    finally:
        if metrics is not None:
            metrics.close()


def _stats_rows(broker: str, queues: list[str]) -> tuple[list[QueueStats], dict[str, str]]:
    """Each queue's stats, and the figures this broker cannot know (from the capabilities of
    the opened adapter: a URL may change them, e.g. RabbitMQ's management API)."""
    from ackwise.plugins._manager import open_adapter

    adapter = open_adapter(broker)
    adapter.open()
    try:
        rows = [adapter.stats(q) for q in queues_or_all(adapter, broker, queues)]
        return rows, unknown_figures(adapter.capabilities)
    finally:
        adapter.close()


#: The columns of ``ackwise stats``: header, field.
STATS_COLUMNS = [
    ("ready", "ready"),
    ("delayed", "delayed"),
    ("in flight", "in_flight"),
    ("dead", "dead"),
    ("oldest age", "oldest_age"),
]


def cmd_stats(args: argparse.Namespace) -> int:
    broker, queues = resolve_broker(args)
    if args.watch:
        from ackwise.cli._watch import watch

        return watch(broker, queues, args.interval)
    rows, unknown = _stats_rows(broker, queues)
    if args.json:
        print(
            json.dumps(
                {"broker": redact_url(broker), "queues": [stats_dict(r, unknown) for r in rows]},
                indent=2,
            )
        )
        return 0
    print(f"broker: {redact_url(broker)}")
    print(
        table(
            ["queue", *(h for h, _ in STATS_COLUMNS)],
            [[r.queue, *(figure(r, f, unknown) for _, f in STATS_COLUMNS)] for r in rows],
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


def _env_int(name: str) -> int | None:
    text = os.environ.get(name, "").strip()
    if not text:
        return None
    try:
        return int(text)
    except ValueError:
        print(f"ackwise: error: ${name} must be a port number, got {text!r}", file=sys.stderr)
        raise SystemExit(2) from None


class _Version(argparse.Action):
    """``--version``: print :func:`version_lines` and exit 0 (the plugins load only then)."""

    def __init__(self, option_strings: Sequence[str], dest: str, **kwargs: Any) -> None:
        kwargs.update(nargs=0, default=argparse.SUPPRESS)
        super().__init__(option_strings, argparse.SUPPRESS, **kwargs)

    def __call__(
        self,
        parser: argparse.ArgumentParser,
        namespace: argparse.Namespace,
        values: Any,
        option_string: str | None = None,
    ) -> None:
        print("\n".join(version_lines()))
        parser.exit()


def version_lines() -> list[str]:
    """``ackwise VERSION (schemes)``, then one line per other distribution that installs an
    ``ackwise`` plugin (entry point group ``ackwise``) with the broker schemes it adds, one per
    plugin that ``$ACKWISE_PLUGINS`` names, and the Python version."""
    import platform
    from importlib import metadata

    plugins: Any = None
    schemes: dict[str, list[str]] = {}
    trouble = ""
    try:
        plugins = get_plugins()
        for entry in plugins.adapters.entries():
            schemes.setdefault(entry.plugin, []).append(f"{entry.scheme}://")
    except AckwiseError as exc:
        trouble = f"plugins could not be loaded: {exc}"

    def describe(names: list[str]) -> str:
        parts: list[str] = []
        for name in names:
            if plugins is not None and plugins.pm.is_blocked(name):
                parts.append(f"plugin {name} blocked by $ACKWISE_PLUGINS_BLOCK")
            elif name in schemes:
                parts.extend(schemes[name])
            elif plugins is not None and plugins.pm.get_plugin(name) is None:
                parts.append(f"plugin {name} not loaded")
            else:
                parts.append(f"plugin {name}, no broker scheme")
        return f" ({', '.join(parts)})" if parts else ""

    dists: dict[str, tuple[str, list[str]]] = {}
    for ep in metadata.entry_points(group=ENTRY_POINT_GROUP):
        dist = ep.dist
        name, version = (dist.name, dist.version) if dist is not None else ("?", "?")
        dists.setdefault(name, (version, []))[1].append(ep.name)
    # ackwise's own line reads the version from the source (the one place it is written), not
    # from the installed metadata, which an editable install leaves behind after a bump.
    _, core_plugins = dists.pop("ackwise", ("", ["ackwise"]))
    lines = [f"ackwise {__version__}{describe(core_plugins)}"]
    for name in sorted(dists):
        version, names = dists[name]
        lines.append(f"{name} {version}{describe(sorted(names))}")
    if plugins is not None:
        known = {n for _, names in dists.values() for n in names} | set(core_plugins)
        for name, _ in sorted(plugins.pm.list_name_plugin()):
            if name not in known:
                lines.append(f"{name} (from $ACKWISE_PLUGINS){describe([name])}")
    if trouble:
        lines.append(trouble)
    lines.append(f"Python {platform.python_version()} ({platform.python_implementation()})")
    return lines


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
