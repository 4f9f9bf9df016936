"""Live workers (docs/workers.md): the worker registries, a worker's records from its start to
its stop, and ``ackwise workers``."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from ackwise import App, WorkerInfo, open_worker_registry
from ackwise.errors import ConfigurationError
from ackwise.stores._presence import FORGET_AFTER, GONE_AFTER
from ackwise.testing import run_worker
from ackwise_conformance.helpers import eventually


@pytest.fixture(params=["memory", "sqlite", "redis", "postgresql"])
def registry_url(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    if request.param == "memory":
        yield f"memory://{uuid.uuid4().hex}"
    elif request.param == "sqlite":
        yield f"sqlite:///{tmp_path / 'q.db'}"
    elif request.param == "redis":
        yield request.getfixturevalue("shared_redis")("workers")
    else:
        yield request.getfixturevalue("pg_schema_url")


def _info(wid: str, **fields: object) -> WorkerInfo:
    now = time.time()
    base: dict[str, object] = dict(
        id=wid, host="h", pid=1, app="a", queues=["default"], pool="threads",
        concurrency=2, version="0", started_at=now - 10, last_seen=now,
    )  # fmt: skip
    return WorkerInfo(**{**base, **fields})  # type: ignore[arg-type]


def test_a_registry_keeps_each_workers_latest_record_and_forgets_old_ones(
    registry_url: str,
) -> None:
    writer, reader = open_worker_registry(registry_url), open_worker_registry(registry_url)
    try:
        now = time.time()
        writer.beat(_info("h:1", started_at=now - 20, counters={"succeeded": 1}))
        writer.beat(_info("h:2", started_at=now - 5))
        writer.beat(_info("h:1", started_at=now - 20, counters={"succeeded": 7}, running=2))
        writer.beat(_info("h:3", started_at=now - 30, last_seen=now - FORGET_AFTER - 1))
        got = reader.workers()
        assert [w.id for w in got] == ["h:1", "h:2"]  # oldest start first; h:3 forgotten
        assert (got[0].counters, got[0].running) == ({"succeeded": 7}, 2)
        assert [w.id for w in reader.workers()] == ["h:1", "h:2"]
    finally:
        writer.close()
        reader.close()


def test_a_forgotten_workers_record_is_gone_at_once(registry_url: str) -> None:
    registry = open_worker_registry(registry_url)
    try:
        for wid in ("h:1", "h:2", "h:3"):
            registry.beat(_info(wid))
        registry.forget(["h:1", "h:3", "h:never-written"])
        assert [w.id for w in registry.workers()] == ["h:2"]
        registry.forget([])
        registry.forget(["h:2"])
        assert registry.workers() == []
        registry.beat(_info("h:4"))  # a registry emptied by forget takes records again
        assert [w.id for w in registry.workers()] == ["h:4"]
        registry.forget(["h:4"])
    finally:
        registry.close()


def test_a_worker_that_went_quiet_is_gone_and_one_that_stopped_stays_stopped() -> None:
    now = time.time()
    assert _info("a", last_seen=now - GONE_AFTER + 1).status(now) == "running"
    assert _info("a", last_seen=now - GONE_AFTER - 1).status(now) == "gone"
    assert _info("a", last_seen=now - GONE_AFTER - 1, state="stopping").status(now) == "gone"
    assert _info("a", last_seen=now - 3600, state="stopped").status(now) == "stopped"
    assert WorkerInfo.from_json(_info("a", counters={"failed": 2}).to_json()).counters == {
        "failed": 2
    }


@pytest.mark.parametrize("scheme", ["memory", "sqlite"])
def test_a_worker_announces_itself_while_it_runs_and_says_when_it_stopped(
    scheme: str, tmp_path: Path
) -> None:
    url = f"sqlite:///{tmp_path / 'q.db'}" if scheme == "sqlite" else f"memory://{uuid.uuid4()}"
    app = App("announced", broker=url)

    @app.task(name="t")
    def t() -> None: ...

    for _ in range(3):
        t.delay()
    registry = open_worker_registry(url)
    try:
        with run_worker(app, concurrency=2) as w:
            w.join()
            eventually(lambda: registry.workers(), 10.0, description="the first record")
            [info] = registry.workers()
            assert (info.id, info.status(), info.pool, info.concurrency) == (
                w.worker.worker_id, "running", "threads", 2,
            )  # fmt: skip
            assert info.queues == ["default"] and info.app == "announced"
        [info] = registry.workers()
        assert info.status() == "stopped" and info.running == 0
        assert info.counters["succeeded"] == 3
    finally:
        registry.close()
        app.close()


def test_a_registry_that_cannot_be_reached_costs_the_worker_nothing(
    caplog: pytest.LogCaptureFixture, tmp_path: Path
) -> None:
    app = App(
        "unreached",
        broker=f"sqlite:///{tmp_path / 'q.db'}",
        worker_registry="postgresql://nobody@127.0.0.1:1/none?connect_timeout=1",
    )
    ran = []

    @app.task(name="t")
    def t(n: int) -> None:
        ran.append(n)

    t.delay(1)
    with run_worker(app) as w:
        w.join()
    assert ran == [1]
    warnings = [r for r in caplog.records if "worker registry" in r.getMessage()]
    assert len(warnings) == 1, [r.getMessage() for r in warnings]  # once, not per beat
    app.close()


def test_an_app_whose_broker_has_no_registry_says_how_to_get_one(tmp_path: Path) -> None:
    from ackwise.cli._workers import cmd_workers

    module = tmp_path / "no_registry_app.py"
    module.write_text(
        "from ackwise import App\napp = App('x', broker='amqp://guest:guest@127.0.0.1:5672/%2F')\n"
    )
    sys.path.insert(0, str(tmp_path))
    try:

        class Args:
            app = "no_registry_app:app"
            json = False
            alive = False

        with pytest.raises(
            ConfigurationError, match=r"no worker registry for amqp://.*App\(worker_registry="
        ):
            cmd_workers(Args())  # type: ignore[arg-type]
    finally:
        sys.path.remove(str(tmp_path))


# -- ackwise workers, with a real worker process ---------------------------------------------
@pytest.mark.slow
def test_ackwise_workers_lists_a_live_worker_then_its_stop(tmp_path: Path) -> None:
    (tmp_path / "workers_app.py").write_text(
        "from ackwise import App\n"
        f"app = App('listed', broker='sqlite:///{tmp_path / 'q.db'}')\n"
        "@app.task(name='t')\n"
        "def t(): pass\n"
    )
    env = {**os.environ, "PYTHONPATH": str(tmp_path)}

    def listed(*options: str) -> dict[str, object]:
        out = subprocess.run(
            [sys.executable, "-m", "ackwise", "workers", "workers_app:app", *options],
            env=env, cwd=tmp_path, capture_output=True, text=True, timeout=60,
        )  # fmt: skip
        assert out.returncode == 0, out.stderr
        return json.loads(out.stdout) if "--json" in options else {"text": out.stdout}

    worker = subprocess.Popen(
        [sys.executable, "-m", "ackwise", "worker", "workers_app:app", "-c", "3"],
        env=env, cwd=tmp_path, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    try:
        eventually(
            lambda: len(listed("--json")["workers"]) == 1,  # type: ignore[arg-type]
            30.0,
            description="the worker's first record",
        )
        [record] = listed("--json")["workers"]  # type: ignore[misc]
        assert record["pid"] == worker.pid and record["status"] == "running"
        assert record["concurrency"] == 3 and record["pool"] == "prefork"
        text = listed()["text"]
        assert f":{worker.pid}" in str(text) and "running" in str(text)
    finally:
        worker.send_signal(signal.SIGTERM)
        assert worker.wait(30) == 0
    [record] = listed("--json")["workers"]  # type: ignore[misc]
    assert record["status"] == "stopped"
    assert listed("--json", "--alive")["workers"] == []
