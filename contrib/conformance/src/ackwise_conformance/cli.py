"""``ackwise conformance URL``: both levels of the suite against a live broker, as a matrix."""

from __future__ import annotations

import argparse
import json
import logging
import os
import shutil
import tempfile
import time
from pathlib import Path
from typing import Any

from ackwise import Ack, redact_url
from ackwise.errors import ConfigurationError

MODES = {"early": Ack.EARLY, "late": Ack.LATE, "reject_on_lost": Ack.REJECT_ON_LOST}


def add_parser(subparsers: argparse._SubParsersAction[Any]) -> None:
    p = subparsers.add_parser(
        "conformance",
        help="prove a broker keeps the delivery contract (SPI checks and crash scenarios)",
        description="Run the conformance suite against a live broker and print the matrix.",
    )
    p.add_argument("url", metavar="URL", help="broker URL, e.g. sqlite:///tmp/c.db")
    p.add_argument("--level", choices=["1", "2", "all"], default="all")
    p.add_argument(
        "--mode",
        action="append",
        default=[],
        choices=sorted(MODES),
        help="only this delivery mode (repeatable)",
    )
    p.add_argument(
        "--scenario",
        action="append",
        default=[],
        help="only this scenario id, e.g. C02 (repeatable, or comma-separated)",
    )
    p.add_argument("--json", metavar="FILE", help="also write the results as JSON")
    p.add_argument("--time-scale", type=float, default=1.0, help="multiply leases and timeouts")
    p.add_argument("--keep", action="store_true", help="keep the work directory (journals, logs)")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    # In-process workers (memory://) would log every start and stop at INFO.
    ackwise_log = logging.getLogger("ackwise")
    if ackwise_log.getEffectiveLevel() > logging.DEBUG:
        ackwise_log.setLevel(logging.WARNING)
    out: dict[str, Any] = {"url": redact_url(args.url), "level1": [], "level2": []}
    workdir = Path(tempfile.mkdtemp(prefix="ackwise-conformance-"))
    failed = False
    started = time.monotonic()
    try:
        if args.level in ("1", "all"):
            out["level1"] = _level1(args, workdir)
            failed |= any(r["status"] == "fail" for r in out["level1"])
        if args.level in ("2", "all"):
            out["level2"] = _level2(args, workdir)
            failed |= any(r["status"] == "fail" for r in out["level2"])
    finally:
        if args.keep:
            print(f"work directory kept: {workdir}")
        else:
            shutil.rmtree(workdir, ignore_errors=True)
    out["duration"] = round(time.monotonic() - started, 1)
    out["summary"] = _summary(out["level1"] + out["level2"])
    if out["level2"]:
        print()
        print(_matrix(out["level2"]))
    print(f"\nsummary: {out['summary']} in {out['duration']}s")
    if args.json:
        Path(args.json).write_text(json.dumps(out, indent=2))
        print(f"results written to {args.json}")
    return 1 if failed else 0


def _summary(rows: list[dict[str, Any]]) -> dict[str, int]:
    counts: dict[str, int] = {}
    for r in rows:
        counts[r["status"]] = counts.get(r["status"], 0) + 1
    return counts


def _progress(line: str) -> None:
    print(line, flush=True)


class _Collector:
    def __init__(self) -> None:
        self.rows: list[dict[str, Any]] = []

    def pytest_runtest_logreport(self, report: Any) -> None:
        name = report.nodeid.split("::")[-1]
        if report.when == "call" or (report.when == "setup" and not report.passed):
            if report.passed:
                status, reason = "pass", ""
            elif report.skipped:
                reason = str(report.longrepr[2]) if isinstance(report.longrepr, tuple) else ""
                status = "pending" if reason.startswith("Skipped: pending") else "n/a"
            else:
                status, reason = "fail", str(report.longreprtext)[-3000:]
            row = {
                "test": name,
                "status": status,
                "reason": reason,
                "duration": round(report.duration, 3),
            }
            self.rows.append(row)
            _progress(f"  level 1  {name:<72} {status:<7} {report.duration:6.2f}s")


def _level1(args: argparse.Namespace, workdir: Path) -> list[dict[str, Any]]:
    import pytest

    print(f"level 1: SPI conformance against {redact_url(args.url)}", flush=True)
    src = Path(__file__).with_name("_level1_template.py")
    target = workdir / "test_level1_spi.py"
    target.write_text(src.read_text())
    os.environ["ACKWISE_CONFORMANCE_URL"] = args.url
    os.environ["ACKWISE_CONFORMANCE_TIME_SCALE"] = str(args.time_scale)
    collector = _Collector()
    pytest.main(
        [
            str(target),
            "-q",
            "-p",
            "no:cacheprovider",
            "--rootdir",
            str(workdir),
            "-o",
            "addopts=",
            "--no-header",
            "-p",
            "no:randomly",
            "--tb=short",
            "-qq",
        ],
        plugins=[collector],
    )
    return collector.rows


def _level2(args: argparse.Namespace, workdir: Path) -> list[dict[str, Any]]:
    from ackwise_conformance.harness import LEASE, SimpleBroker, lease_url
    from ackwise_conformance.scenarios import SCENARIOS, cases, run_case

    scenario_ids = [s.strip().upper() for arg in args.scenario for s in arg.split(",") if s.strip()]
    unknown = [s for s in scenario_ids if s not in SCENARIOS]
    if unknown:
        raise SystemExit(
            f"ackwise conformance: unknown scenario(s) {unknown}; known: {', '.join(SCENARIOS)}"
        )
    modes = [MODES[m] for m in args.mode] or None
    try:
        url, added = lease_url(args.url, LEASE * args.time_scale)
    except ConfigurationError as exc:
        raise SystemExit(f"ackwise conformance: {exc}") from None
    broker = SimpleBroker(url)
    selected = cases(scenario_ids or None, modes)
    print(
        f"\nlevel 2: {len(selected)} crash-scenario cases against {redact_url(args.url)}",
        flush=True,
    )
    if added:
        settings = ", ".join(f"{k}={v}" for k, v in added.items())
        print(f"  connection settings for leases of {LEASE * args.time_scale:g}s: {settings}")
    rows = []
    for i, (sid, mode) in enumerate(selected, 1):
        result = run_case(broker, sid, mode, workdir / "level2", time_scale=args.time_scale)
        row = result.as_dict()
        rows.append(row)
        label = f"{sid} {mode.name if mode else '-'}"
        _progress(
            f"  [{i:>3}/{len(selected)}] {label:<22} {result.status:<7} "
            f"{result.duration:6.1f}s  {SCENARIOS[sid].title}"
        )
        if result.status == "fail":
            _progress("      " + result.reason.replace("\n", "\n      ")[:4000])
    return rows


def _matrix(rows: list[dict[str, Any]]) -> str:
    from ackwise_conformance.scenarios import SCENARIOS

    columns = ["EARLY", "LATE", "REJECT_ON_LOST"]
    cell: dict[tuple[str, str | None], dict[str, Any]] = {
        (r["scenario"], r["mode"]): r for r in rows
    }
    lines = [f"{'id':<4} {'scenario':<58} " + " ".join(f"{c:<16}" for c in columns)]
    lines.append("-" * len(lines[0]))
    reasons: dict[str, list[str]] = {}
    for sid, sc in SCENARIOS.items():
        if not any(k[0] == sid for k in cell):
            continue
        cells = []
        for col in columns:
            r = cell.get((sid, col)) or cell.get((sid, None))
            if r is None:
                cells.append(f"{'':<16}")
                continue
            text = (
                f"{r['status']} {r['duration']:.1f}s"
                if r["status"] in ("pass", "fail")
                else r["status"]
            )
            cells.append(f"{text:<16}")
            if r["status"] in ("n/a", "pending"):
                reasons.setdefault(f"{r['status']}: {r['reason']}", []).append(
                    f"{sid}-{r['mode'] or 'any'}"
                )
        lines.append(f"{sid:<4} {sc.title[:58]:<58} " + " ".join(cells))
    if reasons:
        lines.append("")
        for reason, which in reasons.items():
            lines.append(f"{', '.join(sorted(set(which)))}: {reason}")
    return "\n".join(lines)
