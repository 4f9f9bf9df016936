"""``ackwise conformance URL``: the matrix, the JSON file and the exit status."""

from __future__ import annotations

import json
import subprocess
import sys
import uuid

import pytest


def test_conformance_command_runs_both_levels_and_writes_json(tmp_path):
    out_file = tmp_path / "out.json"
    url = f"memory://{uuid.uuid4().hex}"
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "ackwise",
            "conformance",
            url,
            "--scenario",
            "C01,C02,C22",
            "--mode",
            "late",
            "--json",
            str(out_file),
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    data = json.loads(out_file.read_text())
    assert data["level1"] and all(r["status"] in ("pass", "n/a") for r in data["level1"])
    by_id = {r["scenario"]: r for r in data["level2"]}
    assert by_id["C01"]["status"] == "pass"
    assert by_id["C02"]["status"] == "n/a" and "multi_process=False" in by_id["C02"]["reason"]
    assert by_id["C22"]["status"] == "pass"  # idempotency keys: one effect
    assert "C01  happy path" in proc.stdout and "summary:" in proc.stdout


def test_conformance_command_exits_non_zero_on_failure_and_rejects_unknown_scenarios(tmp_path):
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "ackwise",
            "conformance",
            "memory://x",
            "--level",
            "2",
            "--scenario",
            "C99",
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode != 0
    assert "unknown scenario" in proc.stderr + proc.stdout


def test_a_broker_that_cannot_be_opened_is_one_line_before_anything_runs(tmp_path):
    missing = tmp_path / "no-such-dir" / "c.db"
    proc = subprocess.run(
        [sys.executable, "-m", "ackwise", "conformance", f"sqlite:///{missing}"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 2, proc.stdout + proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("ackwise conformance: cannot open"), lines
    assert "does not exist" in lines[0]
    assert "level 1" not in proc.stdout and "Traceback" not in proc.stderr


@pytest.mark.parametrize(
    ("scale", "expected"),
    [("0", "expected a number > 0"), ("0.5", "expected 1 or more"), ("-1", "expected a number")],
)
def test_a_time_scale_below_one_is_one_line_naming_the_rule(scale: str, expected: str) -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "ackwise", "conformance", "memory://x", "--time-scale", scale],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode != 0
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and expected in lines[0], lines
    assert "leases must be 0s" not in lines[0]


def test_a_case_timeout_that_is_not_positive_is_one_line() -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "ackwise", "conformance", "memory://x", "--case-timeout", "0"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode != 0
    lines = proc.stderr.strip().splitlines()
    assert lines == ["ackwise conformance: --case-timeout 0: expected seconds > 0"], lines
