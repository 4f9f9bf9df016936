"""The ackwise command line: stats, worker start-up errors."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from ackwise import App, QueueSpec

HERE = Path(__file__).parent


def _run(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "ackwise", *args],
        capture_output=True,
        text=True,
        cwd=HERE,
        env={**os.environ, **(env or {})},
        timeout=60,
    )


def test_stats_prints_a_table_and_json(tmp_path):
    url = f"sqlite:///{tmp_path / 'b.db'}"
    app = App("s", broker=url)

    @app.task(name="t")
    def t():
        pass

    for _ in range(3):
        t.delay()
    t.apply_async(countdown=600)
    adapter = app.adapter()
    adapter.open()
    adapter.declare(QueueSpec("other"))
    [d] = adapter.receive("default", max_messages=1, wait=0, lease=60)
    adapter.dead_letter(d, reason="failed")
    out = _run("stats", "--broker", url, "--json")
    assert out.returncode == 0, out.stderr
    rows = {r["queue"]: r for r in json.loads(out.stdout)["queues"]}
    assert (rows["default"]["ready"], rows["default"]["delayed"], rows["default"]["dead"]) == (
        2,
        1,
        1,
    )
    assert rows["other"]["ready"] == 0
    table = _run("stats", "--broker", url, "-Q", "default")
    assert table.returncode == 0
    assert "default" in table.stdout and "oldest age" in table.stdout


@pytest.mark.parametrize(
    ("args", "fragment"),
    [
        (["worker", "no_such_module_xyz:app"], "cannot import 'no_such_module_xyz'"),
        (["worker", "ackwise_conformance.workload:nope"], "has no attribute 'nope'"),
        (["stats", "--broker", "kafka://x"], "no adapter is installed for broker scheme 'kafka'"),
    ],
)
def test_cli_errors_are_clear_and_exit_2(args, fragment):
    out = _run(*args, env={"ACKWISE_BROKER_URL": "memory://"})
    assert out.returncode == 2
    assert fragment in out.stderr
    assert "Traceback" not in out.stderr
