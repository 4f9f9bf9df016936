"""docs/observability.md: a real worker's task log (JSON lines) and its Prometheus metrics
equal what happened, under both pools."""

from __future__ import annotations

import json
import os
import re
import signal
import sqlite3
import subprocess
import sys
import time
import urllib.error
import urllib.request
import uuid
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families

APP = """
import logging, os, signal, time
from ackwise import Ack, App

app = App("obs", broker={url!r})
MARKS = {marks!r}

@app.task(name="obs.ok")
def ok(i):
    logging.getLogger("obs.app").info("ok %s", i)  # the task's own line

@app.task(name="obs.flaky", autoretry_for=(ValueError,), max_retries=2, retry_backoff=0.0)
def flaky():
    # Fails once, then succeeds: the marker file says it ran before.
    mark = os.path.join(MARKS, "flaky")
    if not os.path.exists(mark):
        open(mark, "w").close()
        raise ValueError("first try fails")

@app.task(name="obs.broken", autoretry_for=())
def broken():
    raise RuntimeError("always broken")

@app.task(name="obs.nap")
def nap(seconds):
    time.sleep(seconds)

@app.task(name="obs.killer", ack=Ack.LATE)
def killer():
    os.kill(os.getpid(), signal.SIGKILL)  # the executor process dies mid-task
"""


def _write_app(tmp_path: Path) -> str:
    name = f"obs_app_{uuid.uuid4().hex[:8]}"
    marks = tmp_path / "marks"
    marks.mkdir()
    url = f"sqlite:///{tmp_path / 'broker.db'}"
    (tmp_path / f"{name}.py").write_text(APP.format(url=url, marks=str(marks)))
    return name


def _import(tmp_path: Path, name: str) -> Any:
    sys.path.insert(0, str(tmp_path))
    try:
        import importlib

        return importlib.import_module(name)
    finally:
        sys.path.remove(str(tmp_path))


def _scrape(port: int) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10).read().decode()
    samples: dict[tuple[str, tuple[tuple[str, str], ...]], float] = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            samples[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return samples


def _value(samples: dict[Any, float], name: str, **labels: str) -> float:
    return samples.get((name, tuple(sorted(labels.items()))), 0.0)


def _total(samples: dict[Any, float], name: str, **labels: str) -> float:
    """Sum of ``name`` over every series whose labels include ``labels``."""
    want = set(labels.items())
    return sum(v for (n, lab), v in samples.items() if n == name and want <= set(lab))


@pytest.mark.slow
@pytest.mark.parametrize("pool", ["prefork", "threads"])
def test_log_lines_and_metrics_equal_what_happened(tmp_path: Path, pool: str) -> None:
    name = _write_app(tmp_path)
    mod = _import(tmp_path, name)
    for i in range(5):
        mod.ok.delay(i)
    mod.flaky.delay()
    mod.broken.delay()
    killed = pool == "prefork"  # a thread cannot be killed alone: threads run no killer
    if killed:
        mod.killer.delay()
    log_path = tmp_path / "worker.log"
    with open(log_path, "wb") as log_file:
        proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "ackwise",
                "--loglevel",
                "DEBUG",
                "--log-format",
                "json",
                "worker",
                f"{name}:app",
                "--pool",
                pool,
                "-c",
                "2",
                "--metrics-port",
                "0",
                "--metrics-host",
                "127.0.0.1",
                "--metrics-stats-interval",
                "0.2",
            ],
            cwd=tmp_path,
            env={**os.environ, "PYTHONPATH": str(tmp_path)},
            stdout=log_file,
            stderr=subprocess.STDOUT,
        )
    adapter = mod.app.adapter()
    adapter.open()
    try:
        port = _wait_for_port(log_path, proc)
        dead_expected = 1 + int(killed)
        deadline = time.monotonic() + 60
        while True:
            st = adapter.stats("default")
            if (st.ready, st.delayed, st.in_flight, st.dead) == (0, 0, 0, dead_expected):
                break
            assert time.monotonic() < deadline, f"queue did not drain: {st}"
            time.sleep(0.05)
        # The gauges are read at most every 0.2 s: wait for a read that saw the drained queue.
        deadline = time.monotonic() + 20
        while True:
            samples = _scrape(port)
            if _value(samples, "ackwise_queue_dead_messages", queue="default") == dead_expected:
                break
            assert time.monotonic() < deadline, "the queue gauges never showed the dead letters"
            time.sleep(0.1)
    finally:
        adapter.close()
        proc.send_signal(signal.SIGTERM)
        status = proc.wait(timeout=60)
    assert status == 0, log_path.read_text()

    lines = [json.loads(line) for line in log_path.read_text().splitlines() if line.strip()]
    for line in lines:  # every line, supervisor's and children's, is one JSON object
        assert {"ts", "level", "logger", "pid", "message"} <= set(line), line
    task_lines = [x for x in lines if x["logger"] == "ackwise.task"]
    # The task's own lines, in the worker's format and level, from where the task ran.
    own = [x for x in lines if x["logger"] == "obs.app"]
    assert sorted(x["message"] for x in own) == [f"ok {i}" for i in range(5)]
    supervisor = {x["pid"] for x in task_lines}
    assert len(supervisor) == 1
    assert ({x["pid"] for x in own} & supervisor) == (set() if pool == "prefork" else supervisor)
    for line in task_lines:
        assert {"event", "task", "message_id", "queue", "mode", "attempt"} <= set(line), line
    events = Counter((x["event"], x["task"]) for x in task_lines)

    # What happened, by construction.
    expected = Counter(
        {
            ("succeeded", "obs.ok"): 5,
            ("failed", "obs.flaky"): 1,
            ("retried", "obs.flaky"): 1,
            ("succeeded", "obs.flaky"): 1,
            ("failed", "obs.broken"): 1,
            ("dead_lettered", "obs.broken"): 1,
        }
    )
    if killed:
        expected[("interrupted", "obs.killer")] = 1
        expected[("dead_lettered", "obs.killer")] = 1
    for key, count in expected.items():
        assert events[key] == count, (key, events)
    started = sum(n for (event, _), n in events.items() if event == "started")
    assert started == 5 + 2 + 1 + int(killed)
    assert events[("received", "obs.ok")] == 5

    [retried] = [x for x in task_lines if x["event"] == "retried"]
    assert retried["error"] == "ValueError: first try fails" and retried["delay"] == 0.0
    reasons = sorted(x["reason"] for x in task_lines if x["event"] == "dead_lettered")
    assert reasons == sorted(["failed", *(["worker_lost"] if killed else [])])
    for x in task_lines:
        if x["event"] == "succeeded":
            assert x["mode"] == "late" and x["duration"] >= 0, x
    if killed:
        [interrupted] = [x for x in task_lines if x["event"] == "interrupted"]
        assert interrupted["reason"] == "worker_lost" and interrupted["level"] == "WARNING"

    # The scrape counts the same.
    def tasks(task: str, outcome: str) -> float:
        return _value(samples, "ackwise_tasks_total", task=task, queue="default", outcome=outcome)

    assert tasks("obs.ok", "succeeded") == 5
    assert tasks("obs.flaky", "failed") == 1 and tasks("obs.flaky", "succeeded") == 1
    assert tasks("obs.broken", "failed") == 1
    assert tasks("obs.killer", "interrupted") == int(killed)
    assert _value(samples, "ackwise_retries_total", task="obs.flaky", queue="default") == 1
    assert _value(samples, "ackwise_dead_letters_total", queue="default", reason="failed") == 1
    assert _value(
        samples, "ackwise_dead_letters_total", queue="default", reason="worker_lost"
    ) == int(killed)
    received = sum(n for (event, _), n in events.items() if event == "received")
    assert _total(samples, "ackwise_deliveries_total", queue="default") == received
    assert _total(samples, "ackwise_task_duration_seconds_count") == 5 + 2 + 1
    assert _total(samples, "ackwise_task_wait_seconds_count") == started
    assert _value(samples, "ackwise_worker_running_tasks") == 0
    assert _value(samples, "ackwise_queue_ready_messages", queue="default") == 0
    assert _value(samples, "ackwise_stale_receipts_total") == 0


def _wait_for_port(log_path: Path, proc: subprocess.Popen[bytes]) -> int:
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        found = re.search(r"metrics on http://[^:]+:(\d+)/metrics", log_path.read_text())
        if found:
            return int(found.group(1))
        assert proc.poll() is None, log_path.read_text()
        time.sleep(0.05)
    raise AssertionError(f"the worker never said where its metrics are: {log_path.read_text()}")


def test_stats_watch_refreshes_the_table_with_rates(tmp_path: Path) -> None:
    import io

    from ackwise import App, QueueStats
    from ackwise.cli._watch import render, watch

    app = App("w", broker=f"sqlite:///{tmp_path / 'b.db'}")

    @app.task(name="w.t")
    def t() -> None:
        pass

    t.delay()
    out = io.StringIO()
    assert watch(app.broker_url, ["default"], 0.01, out=out, rounds=2) == 0
    tables = out.getvalue().split("broker: ")[1:]
    assert len(tables) == 2
    first = tables[0].splitlines()
    assert first[1].split() == [
        "queue",
        "ready",
        "ready/s",
        "delayed",
        "in",
        "flight",
        "dead",
        "dead/s",
        "oldest",
        "age",
    ]
    assert first[3].split()[:3] == ["default", "1", "-"]  # no rate before a second look
    assert tables[1].splitlines()[3].split()[:3] == ["default", "1", "+0.0"]
    before = {"q": QueueStats("q", 100, 0, 0, 1, 3.0)}
    text = render("memory://", [QueueStats("q", 80, 0, 4, 3, 1.0)], before, 2.0)
    assert text.splitlines()[3].split() == ["q", "80", "-10.0", "0", "4", "3", "+1.0", "1.0s"]


def test_a_metrics_port_in_use_is_a_one_line_error(tmp_path: Path) -> None:
    import socket

    name = _write_app(tmp_path)
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        proc = subprocess.run(
            [
                sys.executable,
                "-m",
                "ackwise",
                "worker",
                f"{name}:app",
                "--pool",
                "threads",
                "--metrics-port",
                str(port),
                "--metrics-host",
                "127.0.0.1",
            ],
            cwd=tmp_path,
            env={**os.environ, "PYTHONPATH": str(tmp_path)},
            capture_output=True,
            text=True,
            timeout=60,
        )
    assert proc.returncode == 2
    assert proc.stderr.strip().splitlines() == [
        f"ackwise: error: --metrics-port {port}: cannot listen on 127.0.0.1:{port}: "
        "Address already in use"
    ]


def test_metrics_without_prometheus_client_say_what_to_install(tmp_path: Path) -> None:
    name = _write_app(tmp_path)
    code = (
        "import sys\n"
        "sys.modules['prometheus_client'] = None  # as if it were not installed\n"
        "from ackwise.cli._main import main\n"
        f"sys.exit(main(['worker', '{name}:app', '--metrics-port', '0']))\n"
    )
    proc = subprocess.run(
        [sys.executable, "-c", code],
        cwd=tmp_path,
        env={**os.environ, "PYTHONPATH": str(tmp_path)},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 2
    assert proc.stderr.strip() == (
        "ackwise: error: --metrics-port needs prometheus_client: pip install 'ackwise[prometheus]'"
    )


def _health(port: int) -> tuple[int, dict[str, Any]]:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz", timeout=10) as reply:
            return reply.status, json.loads(reply.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read())


def _until(what: Callable[[], Any], description: str, timeout: float = 20.0) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        found = what()
        if found:
            return found
        time.sleep(0.05)
    raise AssertionError(f"timed out waiting for {description}")


def test_healthz_fails_while_the_loop_is_blocked_past_a_lease(tmp_path: Path) -> None:
    name = _write_app(tmp_path)
    mod = _import(tmp_path, name)
    log_path = tmp_path / "worker.log"
    with open(log_path, "wb") as log_file:
        proc = subprocess.Popen(
            [
                *(sys.executable, "-m", "ackwise", "worker", f"{name}:app"),
                *("--pool", "threads", "-c", "1", "--lease", "1"),
                *("--metrics-port", "0", "--metrics-host", "127.0.0.1"),
                *("--metrics-stats-interval", "0"),
            ],
            cwd=tmp_path,
            env={**os.environ, "PYTHONPATH": str(tmp_path)},
            stdout=log_file,
            stderr=subprocess.STDOUT,
        )
    try:
        port = _wait_for_port(log_path, proc)
        status, body = _until(lambda: (h := _health(port))[1]["state"] == "running" and h, "a turn")
        assert status == 200 and body["loop_age"] <= 1.0 and body["limit"] == 1.0, body
        mod.nap.delay(60)
        _until(lambda: _value(_scrape(port), "ackwise_worker_running_tasks") == 1, "the nap")
        # Another process's write lock on the broker's file holds the loop's next lease
        # renewal (a write) for as long as it is kept: the loop stops turning.
        lock = sqlite3.connect(tmp_path / "broker.db", isolation_level=None)
        lock.execute("BEGIN EXCLUSIVE")
        try:
            status, body = _until(lambda: (h := _health(port))[0] == 503 and h, "a 503", 10)
            assert body["state"] == "running" and body["loop_age"] > 1.0, body
        finally:
            lock.execute("ROLLBACK")
            lock.close()
        status, body = _until(lambda: (h := _health(port))[0] == 200 and h, "a 200 again", 10)
        assert body["state"] == "running", body
    finally:
        proc.kill()  # the nap is not waited for
        proc.wait(30)


def test_health_by_state_starting_reconnecting_stalled_stopped() -> None:
    from ackwise import App, Worker, WorkerConfig
    from ackwise.worker._health import health_of

    app = App("health", broker=f"memory://health-{uuid.uuid4().hex[:8]}")
    worker = Worker(app, WorkerConfig(pool="threads", lease=2.0))
    assert health_of(worker) == health_of(worker, now=0.0)  # no turn yet: the clock is unread
    assert (health_of(worker).ok, health_of(worker).state) == (True, "starting")
    worker.last_turn = 100.0
    assert (health_of(worker, now=101.9).ok, health_of(worker, now=101.9).state) == (
        True,
        "running",
    )
    stalled = health_of(worker, now=102.5)
    assert (stalled.ok, stalled.loop_age, stalled.limit) == (False, 2.5, 2.0)
    worker.reconnecting = True  # turns at the backoff's pace: not a stall
    assert (health_of(worker, now=110.0).ok, health_of(worker, now=110.0).state) == (
        True,
        "reconnecting",
    )
    worker.reconnecting = False
    worker.request_stop()
    assert health_of(worker, now=101.0).state == "stopping"
    worker.control.ended.set()  # what run() does once its loop ended
    assert (health_of(worker).ok, health_of(worker).state) == (False, "stopped")
    app.close()
