"""The task log and the logging options (docs/observability.md), in process."""

from __future__ import annotations

import json
import logging
import subprocess
import sys
import uuid

import pytest

from ackwise import Ack, App, Worker, WorkerConfig
from ackwise.contract import _logconfig
from ackwise.contract._logconfig import DRIVER_LOGGERS, JsonFormatter, configure, parse_level
from ackwise.testing import run_worker
from ackwise.worker._events import Received, Started, Succeeded


def _app() -> App:
    app = App("t", broker=f"memory://{uuid.uuid4().hex}")

    @app.task(name="t.ok")
    def ok() -> None:
        pass

    @app.task(name="t.early", ack=Ack.EARLY)
    def early() -> None:
        pass

    @app.task(name="t.bad", autoretry_for=(), max_retries=0)
    def bad() -> None:
        raise KeyError("nope")

    return app


def test_each_outcome_is_one_line_naming_task_message_queue_mode_and_attempt(
    caplog: pytest.LogCaptureFixture,
) -> None:
    app = _app()
    caplog.set_level(logging.DEBUG, logger="ackwise.task")
    ok_id = app.tasks["t.ok"].delay()
    early_id = app.tasks["t.early"].delay()
    bad_id = app.tasks["t.bad"].delay()
    with run_worker(app) as w:
        w.join()
    lines = [r for r in caplog.records if r.name == "ackwise.task"]
    text = [r.getMessage() for r in lines]

    def one(prefix: str) -> logging.LogRecord:
        found = [r for r in lines if r.getMessage().startswith(prefix)]
        assert len(found) == 1, (prefix, text)
        return found[0]

    received = one(f"received t.ok id={ok_id} queue=default mode=late attempt=1")
    assert received.levelno == logging.DEBUG
    assert one(f"started t.ok id={ok_id} queue=default mode=late attempt=1 waited=").levelno == (
        logging.INFO
    )
    succeeded = one(f"succeeded t.ok id={ok_id} queue=default mode=late attempt=1 duration=")
    assert succeeded.levelno == logging.INFO
    assert succeeded.ackwise["duration"] >= 0  # type: ignore[attr-defined]
    one(f"succeeded t.early id={early_id} queue=default mode=early attempt=1")
    failed = one(
        f"failed t.bad id={bad_id} queue=default mode=late attempt=1 error=\"KeyError: 'nope'\" duration="
    )
    assert failed.levelno == logging.WARNING
    dead = one(f"dead_lettered t.bad id={bad_id} queue=default mode=late attempt=1 reason=failed")
    assert dead.levelno == logging.ERROR
    assert dead.ackwise == {  # type: ignore[attr-defined]
        "event": "dead_lettered",
        "task": "t.bad",
        "message_id": bad_id,
        "queue": "default",
        "mode": "late",
        "attempt": 1,
        "reason": "failed",
        "error": "KeyError: 'nope'",
    }


def test_events_below_the_task_loggers_level_cost_nothing() -> None:
    app = _app()
    logger = logging.getLogger("ackwise.task")
    before = logger.level
    try:
        logger.setLevel(logging.WARNING)
        quiet = Worker(app, WorkerConfig(pool="threads"))
        assert not {Received, Started, Succeeded} & quiet.events.heard
        logger.setLevel(logging.INFO)
        chatty = Worker(app, WorkerConfig(pool="threads"))
        assert {Started, Succeeded} <= chatty.events.heard
        assert Received not in chatty.events.heard
    finally:
        logger.setLevel(before)


def test_the_task_log_can_be_quieter_than_the_rest() -> None:
    app = _app()
    task_logger = logging.getLogger("ackwise.task")
    try:
        configure(logging.INFO, task_level=logging.WARNING)
        assert task_logger.level == logging.WARNING
        assert Started not in Worker(app, WorkerConfig(pool="threads")).events.heard
        configure(logging.INFO)  # default: as --loglevel
        assert task_logger.level == logging.NOTSET
    finally:
        task_logger.setLevel(logging.NOTSET)
        _logconfig._settings.clear()


def test_json_lines_have_stable_keys_and_the_events_fields() -> None:
    record = logging.LogRecord(
        "ackwise.task", logging.INFO, __file__, 1, "succeeded %s", ("x",), None
    )
    record.ackwise = {"event": "succeeded", "task": "t", "duration": 0.5}
    out = json.loads(JsonFormatter().format(record))
    assert list(out)[:5] == ["ts", "level", "logger", "pid", "message"]
    assert out["message"] == "succeeded x" and out["level"] == "INFO"
    assert (out["event"], out["task"], out["duration"]) == ("succeeded", "t", 0.5)
    try:
        raise ValueError("boom")
    except ValueError:
        record = logging.LogRecord("x", logging.ERROR, __file__, 1, "m", (), sys.exc_info())
    line = JsonFormatter().format(record)
    assert "\n" not in line and "ValueError: boom" in json.loads(line)["exception"]


def test_driver_loggers_stay_at_warning_unless_asked_for() -> None:
    saved = {n: logging.getLogger(n).level for n in DRIVER_LOGGERS}
    try:
        configure(logging.DEBUG)
        assert {logging.getLogger(n).level for n in DRIVER_LOGGERS} == {logging.WARNING}
        configure(logging.ERROR)  # never chattier than the command itself
        assert logging.getLogger("pika").level == logging.ERROR
        configure(logging.INFO, driver_level=logging.DEBUG)
        assert logging.getLogger("pika").level == logging.DEBUG
    finally:
        for n, level in saved.items():
            logging.getLogger(n).setLevel(level)
        _logconfig._settings.clear()  # prefork workers of later tests log as by default


def test_an_unknown_level_is_a_one_line_error() -> None:
    assert parse_level("info") == logging.INFO and parse_level("15") == 15
    with pytest.raises(ValueError, match="--loglevel: unknown level 'LOUD'"):
        parse_level("LOUD")
    proc = subprocess.run(
        [sys.executable, "-m", "ackwise", "--loglevel", "LOUD", "adapters"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 2
    assert "--loglevel: unknown level 'LOUD'" in proc.stderr
    assert "Traceback" not in proc.stderr
