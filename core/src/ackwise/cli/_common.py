"""Helpers of the command line shared by its subcommands (``worker``, ``stats``, ``beat``,
``dlq``): the parser class and its help, the logging options of every command, argument types,
the broker and queues a command names, the figures of ``stats`` as cells (``n/a`` for those a
broker cannot know), tables."""

from __future__ import annotations

import argparse
import os
import re
from collections.abc import Collection
from typing import Any

from ackwise.contract._logconfig import LOG_FORMATS
from ackwise.contract._spi import Adapter, QueueStats, redact_url
from ackwise.errors import AckwiseError, UnsupportedCapability

__all__ = [
    "BROKER_HELP",
    "NA",
    "HelpFormatter",
    "Parser",
    "add_logging_options",
    "figure",
    "positive_float",
    "queue_list",
    "queues_or_all",
    "resolve_broker",
    "shows_default",
    "stats_dict",
    "table",
]

#: The help of ``--broker`` (``stats``, ``dlq``): what :func:`resolve_broker` falls back to.
BROKER_HELP = "broker URL (default: the app's, else $ACKWISE_BROKER_URL, else sqlite:///ackwise.db)"

#: What a table prints for a figure the broker cannot know (JSON: ``null``).
NA = "n/a"

_SAYS_DEFAULT = re.compile(r"\bdefault\b", re.IGNORECASE)


def shows_default(action: argparse.Action) -> bool:
    """Whether ``action`` has a default worth printing: a value, not a flag's off state, an
    empty list or ``None`` (whose meaning, where it has one, the help says in words)."""
    if action.nargs == 0:  # --flag, --help, --version
        return False
    return action.default not in (None, argparse.SUPPRESS, "", [])


class HelpFormatter(argparse.HelpFormatter):
    """Every option's help ends with ``(default: X)``, unless the help says its default itself
    (in words: "default: the app's broker") or there is none worth printing."""

    def _get_help_string(self, action: argparse.Action) -> str | None:
        text = action.help or ""
        if not shows_default(action) or _SAYS_DEFAULT.search(text):
            return text
        return f"{text} (default: %(default)s)" if text else "(default: %(default)s)"


class Parser(argparse.ArgumentParser):
    """The parser of ``ackwise`` and of every subcommand (``add_subparsers`` makes its parsers
    of the same class, plugins' commands included): help with :class:`HelpFormatter`; every
    subcommand takes the logging options too (:class:`_Commands`)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs.setdefault("formatter_class", HelpFormatter)
        super().__init__(*args, **kwargs)
        self.register("action", "parsers", _Commands)


class _Commands(argparse._SubParsersAction):  # type: ignore[type-arg]
    """``add_subparsers()`` of a :class:`Parser`: each command's parser (a plugin's too, and
    the commands of a command: ``dlq list``) takes the logging options after the command."""

    def add_parser(self, name: str, **kwargs: Any) -> Any:
        parser = super().add_parser(name, **kwargs)
        add_logging_options(parser, after_command=True)
        return parser


def add_logging_options(parser: argparse.ArgumentParser, *, after_command: bool) -> None:
    """Add ``--loglevel``, ``--log-format``, ``--task-loglevel`` and ``--driver-loglevel``.

    ``ackwise`` itself holds their defaults (from the environment); a command's copy
    (``after_command``) has none (``SUPPRESS``), so a value given before the command stays
    unless the same option is given again after it: the one after the command wins.
    """
    level = os.environ.get("ACKWISE_LOGLEVEL") or "INFO"
    fmt = os.environ.get("ACKWISE_LOG_FORMAT") or "text"

    def default(value: str | None) -> str | None:
        return argparse.SUPPRESS if after_command else value

    where = "before" if after_command else "after"
    group = parser.add_argument_group(
        f"logging options (also {where} the command)",
        "Given both before and after the command, the one after it wins.",
    )
    group.add_argument(
        "--loglevel",
        default=default(level),
        metavar="LEVEL",
        help=f"DEBUG, INFO, WARNING or ERROR (default: {level}; $ACKWISE_LOGLEVEL sets it)",
    )
    group.add_argument(
        "--log-format",
        choices=LOG_FORMATS,
        default=default(fmt),
        help=f"text, or json: one object per line (default: {fmt}; $ACKWISE_LOG_FORMAT sets it)",
    )
    group.add_argument(
        "--task-loglevel",
        default=default(os.environ.get("ACKWISE_TASK_LOGLEVEL") or None),
        metavar="LEVEL",
        help="level of the worker's task log (ackwise.task: two lines a task at INFO) "
        "(default: $ACKWISE_TASK_LOGLEVEL, else as --loglevel)",
    )
    group.add_argument(
        "--driver-loglevel",
        default=default(os.environ.get("ACKWISE_DRIVER_LOGLEVEL") or None),
        metavar="LEVEL",
        help="level of the broker client libraries' loggers (pika, botocore, urllib3, redis) "
        "(default: $ACKWISE_DRIVER_LOGLEVEL, else WARNING)",
    )


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
        from ackwise.app._execution import load_app

        app = load_app(args.app)
        broker = broker or app.broker_url
        queues = queues or app.queues()
    broker = broker or os.environ.get("ACKWISE_BROKER_URL") or "sqlite:///ackwise.db"
    return broker, list(queues)


def stats_dict(row: QueueStats, unknown: Collection[str]) -> dict[str, Any]:
    """``row`` as ``stats --json`` prints it: ``None`` for the figures in ``unknown``
    (:func:`ackwise.contract._figures.unknown_figures`)."""
    return {k: None if k in unknown else v for k, v in row.as_dict().items()}


def figure(row: QueueStats, field: str, unknown: Collection[str]) -> str:
    """One figure of ``row`` as a table cell: ``n/a`` when unknown, ages in seconds."""
    if field in unknown:
        return NA
    value = getattr(row, field)
    return f"{value:.1f}s" if field == "oldest_age" else str(value)


def table(header: list[str], rows: list[list[Any]]) -> str:
    cells = [header, *[[str(c) for c in r] for r in rows]]
    widths = [max(len(r[i]) for r in cells) for i in range(len(header))]
    lines = ["  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip() for r in cells]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines)
