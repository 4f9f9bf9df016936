"""A worker started while its broker cannot be reached waits for it instead of exiting.

Under Kubernetes or compose a worker often starts before its broker (or while another process
holds the SQLite write lock): an exit at once is a crash loop.  Real ``ackwise worker``
processes, a real SQLite write lock, a real redis-server that comes up late.
"""

from __future__ import annotations

import re
import shutil
import sqlite3
import subprocess
import time
from pathlib import Path

import pytest

from ackwise import Ack
from ackwise_conformance import eventually
from ackwise_conformance.brokers import free_port, missing_broker
from ackwise_conformance.harness import Harness, SimpleBroker

pytestmark = pytest.mark.slow


def _attempts(output: str) -> list[int]:
    return [int(n) for n in re.findall(r"not reachable at start \(attempt (\d+)", output)]


def test_a_worker_started_while_another_process_holds_the_sqlite_write_lock_waits(
    tmp_path: Path,
) -> None:
    # Defect: a transient error at start was fatal; a worker paused inside a write
    # transaction (SIGSTOP, a long GC pause) made every worker starting meanwhile exit with
    # "SQLite database busy".
    db = tmp_path / "broker.db"
    h = Harness(SimpleBroker(f"sqlite:///{db}?busy_timeout=0.2"), Ack.LATE, tmp_path / "case")
    try:
        holder = sqlite3.connect(db, isolation_level=None)
        holder.execute("BEGIN IMMEDIATE")  # what a paused writer holds
        w = h.worker(pool="threads", wait_ready=False)
        eventually(lambda: len(_attempts(w.output())) >= 2, 20, description="two attempts")
        assert w.alive(), w.output()
        holder.execute("COMMIT")
        holder.close()
        w.wait_ready(20)
        assert "reachable after" in w.output()
        h.publish(["after-the-lock"])
        h.wait_for("end", key="after-the-lock")
        h.drain()
        h.history().expect_ok_once()
    finally:
        h.close()


def test_a_worker_started_before_its_redis_waits_for_it_with_backoff(tmp_path: Path) -> None:
    binary = shutil.which("redis-server")
    if binary is None:
        missing_broker("redis-server is not on PATH")
    port = free_port()
    url = f"redis://127.0.0.1:{port}/0?prefix=start-{port}&socket_connect_timeout=1"
    # The harness needs the broker for its own handle: give it a SQLite file and point the
    # worker at the Redis that is not there yet.
    h = Harness(SimpleBroker(f"sqlite:///{tmp_path / 'unused.db'}"), Ack.LATE, tmp_path / "case")
    server: subprocess.Popen[bytes] | None = None
    try:
        w = h.worker(
            pool="threads", url=url, wait_ready=False, extra_args=["--broker-timeout", "60"]
        )
        eventually(lambda: len(_attempts(w.output())) >= 3, 30, description="three attempts")
        assert w.alive(), w.output()
        # one line per attempt, counting up, each saying when it tries again
        tried = _attempts(w.output())
        assert tried == list(range(1, len(tried) + 1)), w.output()
        assert "retrying in" in w.output() and "Traceback" not in w.output()
        server = subprocess.Popen(
            [
                binary,
                "--port",
                str(port),
                "--bind",
                "127.0.0.1",
                "--save",
                "",
                "--appendonly",
                "no",
            ],
            cwd=tmp_path,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        w.wait_ready(30)
        assert w.alive()
    finally:
        h.close()
        if server is not None:
            server.kill()
            server.wait(10)


def test_a_worker_gives_up_after_broker_timeout_with_one_clear_line_and_status_2(
    tmp_path: Path,
) -> None:
    port = free_port()  # nothing listens there
    url = f"redis://127.0.0.1:{port}/0?socket_connect_timeout=0.5"
    h = Harness(SimpleBroker(f"sqlite:///{tmp_path / 'unused.db'}"), Ack.LATE, tmp_path / "case")
    try:
        started = time.monotonic()
        w = h.worker(
            pool="threads", url=url, wait_ready=False, extra_args=["--broker-timeout", "3"]
        )
        status = w.wait(30)
        took = time.monotonic() - started
        out = w.output()
        assert status == 2, out
        assert 3 <= took < 20, took
        assert len(_attempts(out)) >= 3, out
        [last] = [line for line in out.splitlines() if line.startswith("ackwise: error:")]
        assert "unreachable at start" in last and "--broker-timeout 3s" in last, last
        assert "Traceback" not in out
    finally:
        h.close()
