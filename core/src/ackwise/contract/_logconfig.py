"""How the ``ackwise`` commands log: level, text or JSON lines, and quiet broker drivers.

The command line resolves its logging options once (:func:`configure`); the prefork executor
hands them to its child processes in their environment (:func:`child_env`), where
:mod:`ackwise.worker._child` reads them (:func:`configure_from_env`), so that children log the same
way.  The command's own environment is left as it is.
"""

from __future__ import annotations

import datetime as dt
import json
import logging
import os
import sys
from typing import Any

__all__ = [
    "DRIVER_LOGGERS",
    "LOG_FORMATS",
    "JsonFormatter",
    "child_env",
    "configure",
    "configure_from_env",
    "parse_level",
]

#: Loggers of broker client libraries: chatty at INFO (pika writes ~20 lines a connection),
#: and their errors are reported again, in one line, by ackwise.  WARNING unless asked for.
DRIVER_LOGGERS = ("pika", "botocore", "boto3", "s3transfer", "urllib3", "redis", "psycopg")

LOG_FORMATS = ("text", "json")

TEXT_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"

#: The worker's task log (:mod:`ackwise.worker._tasklog`), named here so that its level can be set
#: without importing the worker.
TASK_LOGGER = "ackwise.task"


class JsonFormatter(logging.Formatter):
    """One JSON object per line.

    Every line has ``ts`` (ISO 8601, UTC), ``level``, ``logger``, ``pid`` and ``message``;
    task lines add ``event``, ``task``, ``message_id``, ``queue``, ``mode``, ``attempt`` and
    the event's own fields (``docs/observability.md``); a line with an exception adds
    ``exception`` (its traceback).
    """

    def format(self, record: logging.LogRecord) -> str:
        out: dict[str, Any] = {
            "ts": dt.datetime.fromtimestamp(record.created, dt.UTC).isoformat(
                timespec="milliseconds"
            ),
            "level": record.levelname,
            "logger": record.name,
            "pid": record.process,
            "message": record.getMessage(),
        }
        fields = getattr(record, "ackwise", None)
        if isinstance(fields, dict):
            out.update(fields)
        if record.exc_info:
            out["exception"] = self.formatException(record.exc_info)
        return json.dumps(out, default=str, ensure_ascii=False)


def parse_level(text: str, what: str = "--loglevel") -> int:
    """``"info"``, ``"INFO"`` or ``"20"`` as a logging level; a clear error otherwise."""
    if text.strip().isdigit():
        return int(text)
    level = logging.getLevelName(text.strip().upper())
    if not isinstance(level, int):
        raise ValueError(
            f"{what}: unknown level {text!r}; expected DEBUG, INFO, WARNING, ERROR or CRITICAL"
        )
    return level


def configure(
    level: int,
    fmt: str = "text",
    driver_level: int | None = None,
    *,
    task_level: int | None = None,
    text_format: str = TEXT_FORMAT,
) -> None:
    """Log to standard error at ``level`` in ``fmt``; broker drivers at ``driver_level``
    (default: WARNING, or ``level`` where that is higher); the task log (``ackwise.task``) at
    ``task_level`` (default: ``level``).

    The settings are kept for :func:`child_env`.
    """
    if fmt not in LOG_FORMATS:
        raise ValueError(f"--log-format: expected one of {', '.join(LOG_FORMATS)}, got {fmt!r}")
    root = logging.getLogger()
    ours = [h for h in root.handlers if getattr(h, "ackwise", False)]
    # As logging.basicConfig: handlers someone else installed (an embedding program, a test
    # runner) are left as they are, and so is the root level.
    if len(ours) == len(root.handlers):
        for old in ours:
            root.removeHandler(old)
        handler = logging.StreamHandler(sys.stderr)
        handler.setFormatter(JsonFormatter() if fmt == "json" else logging.Formatter(text_format))
        handler.ackwise = True  # type: ignore[attr-defined]
        root.addHandler(handler)
        root.setLevel(level)
    drivers = max(logging.WARNING, level) if driver_level is None else driver_level
    for name in DRIVER_LOGGERS:
        logging.getLogger(name).setLevel(drivers)
    # The task log (two lines a task at INFO) may be quieter than the rest.
    logging.getLogger(TASK_LOGGER).setLevel(logging.NOTSET if task_level is None else task_level)
    _settings.clear()
    _settings.update(
        ACKWISE_LOGLEVEL=logging.getLevelName(level),
        ACKWISE_LOG_FORMAT=fmt,
        ACKWISE_DRIVER_LOGLEVEL=logging.getLevelName(drivers),
    )


#: What :func:`configure` was last told, as the environment of a child process.
_settings: dict[str, str] = {}


def child_env() -> dict[str, str]:
    """The environment variables that make a child process log as this one was configured
    to (empty where :func:`configure` was not called: the child then logs warnings only)."""
    return dict(_settings)


def configure_from_env(*, text_format: str = TEXT_FORMAT) -> None:
    """Log as the process that started this one was configured to (:func:`child_env`)."""
    env = os.environ
    try:
        level = parse_level(env.get("ACKWISE_LOGLEVEL", "WARNING"))
        driver = (
            parse_level(env["ACKWISE_DRIVER_LOGLEVEL"])
            if env.get("ACKWISE_DRIVER_LOGLEVEL")
            else None
        )
    except ValueError:
        level, driver = logging.WARNING, None
    fmt = env.get("ACKWISE_LOG_FORMAT", "text")
    configure(
        level,
        fmt if fmt in LOG_FORMATS else "text",
        driver,
        text_format=text_format,
    )
