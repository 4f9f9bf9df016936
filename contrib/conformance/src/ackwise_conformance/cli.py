"""``ackwise conformance URL``: both levels of the suite against a live broker, as a matrix."""

from __future__ import annotations

import argparse
import json
import logging
import os
import shutil
import signal
import sys
import tempfile
import threading
import time
import uuid
from pathlib import Path
from typing import TYPE_CHECKING, Any, NoReturn

from ackwise import Ack, redact_url
from ackwise.errors import AdapterError, ConfigurationError

if TYPE_CHECKING:
    from ackwise_conformance.runner import Progress
    from ackwise_conformance.scenarios import CaseResult

MODES = {"early": Ack.EARLY, "late": Ack.LATE, "reject_on_lost": Ack.REJECT_ON_LOST}


def add_parser(subparsers: argparse._SubParsersAction[Any]) -> None:
    p = subparsers.add_parser(
        "conformance",
        help="prove a broker keeps the delivery contract (SPI checks and crash scenarios)",
        description="Run the conformance suite against a live broker and print the matrix.",
    )
    p.add_argument("url", metavar="URL", help="broker URL, e.g. sqlite:///tmp/c.db")
    p.add_argument(
        "--level",
        choices=["1", "2", "all"],
        default="all",
        help="1: the SPI checks; 2: the crash scenarios with real workers; all: both",
    )
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
    p.add_argument(
        "--time-scale",
        type=float,
        default=None,
        metavar="FACTOR",
        help="multiply leases and timeouts (default: 1, or what the broker's timer "
        "resolution needs, e.g. 2 on SQS)",
    )
    p.add_argument(
        "--jobs",
        type=int,
        default=None,
        metavar="N",
        help="level-2 cases run at once (default: 4 per CPU, at most 8; 1: one by one)",
    )
    p.add_argument(
        "--case-timeout",
        type=float,
        default=None,
        metavar="SECONDS",
        help="fail and close a level-2 case still running after this long (default: 300 x "
        "the time scale)",
    )
    p.add_argument(
        "--prefix",
        default=None,
        help="what every queue, key and exchange the run creates is named with first "
        "(default: conformance-<random>-); all of them are deleted at the end",
    )
    p.add_argument("--keep", action="store_true", help="keep the work directory (journals, logs)")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    # In-process workers (memory://) would log every start and stop at INFO.
    ackwise_log = logging.getLogger("ackwise")
    if ackwise_log.getEffectiveLevel() > logging.DEBUG:
        ackwise_log.setLevel(logging.WARNING)
    if args.prefix is None:
        args.prefix = f"conformance-{uuid.uuid4().hex[:6]}-"
    stopped_by = _interrupt_on_sigterm()
    if args.jobs is not None and args.jobs < 1:
        _refuse(f"ackwise conformance: --jobs {args.jobs}: expected 1 or more")
    if args.case_timeout is not None and not args.case_timeout > 0:
        _refuse(f"ackwise conformance: --case-timeout {args.case_timeout:g}: expected seconds > 0")
    args.time_scale = _time_scale(args.url, args.time_scale)
    _check_opens(args.url)
    out: dict[str, Any] = {
        "url": redact_url(args.url),
        "prefix": args.prefix,
        "level1": [],
        "level2": [],
    }
    workdir = Path(tempfile.mkdtemp(prefix="ackwise-conformance-"))
    failed = False
    started = time.monotonic()
    print(f"names of this run's queues and keys start with {args.prefix!r}", flush=True)
    try:
        if args.level in ("1", "all"):
            out["level1"] = _level1(args, workdir)
            failed |= any(r["status"] == "fail" for r in out["level1"])
        if args.level in ("2", "all"):
            out["level2"] = _level2(args, workdir)
            failed |= any(r["status"] == "fail" for r in out["level2"])
    except KeyboardInterrupt:
        _status.clear()
        print(
            f"\ninterrupted: the running cases were stopped and their queues deleted "
            f"(prefix {args.prefix!r})",
            flush=True,
        )
        return 128 + stopped_by.get("signal", signal.SIGINT)
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


def _refuse(message: str) -> NoReturn:
    """A usage error: ``message`` on one line of standard error, exit status 2 (1 is a failed
    check)."""
    print(message, file=sys.stderr)
    raise SystemExit(2)


def _check_opens(url: str) -> None:
    """Open the broker once, so that a wrong URL is one line, not a failure of every test."""
    from ackwise import open_adapter

    try:
        adapter = open_adapter(url)
        adapter.open()
    except (AdapterError, ConfigurationError) as exc:
        print(f"ackwise conformance: cannot open {redact_url(url)}: {exc}", file=sys.stderr)
        raise SystemExit(2) from None
    try:
        adapter.close()
    except AdapterError:
        pass


def _time_scale(url: str, asked: float | None) -> float:
    """The run's time scale: ``asked``, or 1; refused when the broker's timers are too coarse.

    The shortest lease of the suite (1 s x scale) must be two steps of the broker's timers
    (``Capabilities.time_resolution``) or more, or its checks of "not before the lease ends"
    measure the rounding.
    """
    from ackwise import BrokerURL, get_plugins
    from ackwise_conformance.harness import LEASE

    if asked is not None and not asked > 0:
        _refuse(f"ackwise conformance: --time-scale {asked:g}: expected a number > 0")
    try:
        adapter = get_plugins().adapters.get(BrokerURL.parse(url).scheme).load()
    except ConfigurationError as exc:
        _refuse(f"ackwise conformance: {exc}")
    resolution = float(adapter.capabilities.time_resolution)
    needed = max(1.0, 2 * resolution / LEASE)
    if asked is None:
        if needed > 1.0:
            print(
                f"time scale {needed:g}: the broker's timers count {resolution:g}s steps "
                f"(leases of {LEASE * needed:g}s)",
                flush=True,
            )
        return needed
    if asked < 1.0:
        _refuse(
            f"ackwise conformance: --time-scale {asked:g}: expected 1 or more (the scenarios' "
            "timings are the shortest they can be at 1; a scale only lengthens them)"
        )
    if asked < needed:
        _refuse(
            f"ackwise conformance: --time-scale {asked:g} is too short for {adapter.name}: its "
            f"timers count {resolution:g}s steps, so leases must be {2 * resolution:g}s or "
            f"more; use --time-scale {needed:g} or more"
        )
    return asked


def _interrupt_on_sigterm() -> dict[str, int]:
    """Make SIGTERM interrupt the run as Ctrl-C does (its cases closed, its queues deleted).

    Returns where the signal that stopped the run is recorded (SIGINT when none is).
    """
    stopped_by: dict[str, int] = {}
    if threading.current_thread() is not threading.main_thread():
        return stopped_by

    def handler(signum: int, frame: object) -> None:
        stopped_by["signal"] = signum
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, handler)
    return stopped_by


def _summary(rows: list[dict[str, Any]]) -> dict[str, int]:
    counts: dict[str, int] = {}
    for r in rows:
        counts[r["status"]] = counts.get(r["status"], 0) + 1
    return counts


def _progress(line: str) -> None:
    print(line, flush=True)


class _StatusLine:
    """One line at the bottom of a terminal, rewritten in place (nothing when not a tty)."""

    def __init__(self) -> None:
        self.shown = False

    def show(self, text: str) -> None:
        if not sys.stdout.isatty():
            return
        width = shutil.get_terminal_size((100, 20)).columns - 1
        sys.stdout.write("\r\x1b[2K" + text[:width])
        sys.stdout.flush()
        self.shown = True

    def clear(self) -> None:
        if self.shown:
            sys.stdout.write("\r\x1b[2K")
            sys.stdout.flush()
            self.shown = False


_status = _StatusLine()


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
    os.environ["ACKWISE_CONFORMANCE_PREFIX"] = args.prefix
    collector = _Collector()
    code = pytest.main(
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
    if code == pytest.ExitCode.INTERRUPTED:  # pytest ran the teardowns: the queues are gone
        raise KeyboardInterrupt
    return collector.rows


def _level2(args: argparse.Namespace, workdir: Path) -> list[dict[str, Any]]:
    from ackwise_conformance.harness import LEASE, SimpleBroker, lease_url
    from ackwise_conformance.scenarios import SCENARIOS, cases

    scenario_ids = [s.strip().upper() for arg in args.scenario for s in arg.split(",") if s.strip()]
    unknown = [s for s in scenario_ids if s not in SCENARIOS]
    if unknown:
        _refuse(
            f"ackwise conformance: unknown scenario(s) {unknown}; known: {', '.join(SCENARIOS)}"
        )
    modes = [MODES[m] for m in args.mode] or None
    try:
        url, added = lease_url(args.url, LEASE * args.time_scale)
    except ConfigurationError as exc:
        _refuse(f"ackwise conformance: {exc}")
    broker = SimpleBroker(url)
    selected = cases(scenario_ids or None, modes)
    print(
        f"\nlevel 2: {len(selected)} crash-scenario cases against {redact_url(args.url)}",
        flush=True,
    )
    if added:
        settings = ", ".join(f"{k}={v}" for k, v in added.items())
        print(f"  connection settings for leases of {LEASE * args.time_scale:g}s: {settings}")
    from ackwise_conformance.runner import default_jobs, run_cases

    jobs = args.jobs or default_jobs()
    print(f"  {jobs} case(s) at once; C19 (restarts the broker) alone, at the end", flush=True)

    def finished(result: CaseResult, progress: Progress) -> None:
        label = f"{result.scenario} {result.mode.name if result.mode else '-'}"
        _status.clear()
        _progress(
            f"  [{progress.done:>3}/{progress.total}] {label:<22} {result.status:<7} "
            f"{result.duration:6.1f}s  {SCENARIOS[result.scenario].title}"
        )
        if result.status == "fail":
            _progress("      " + result.reason.replace("\n", "\n      ")[:4000])

    results = run_cases(
        broker,
        selected,
        workdir / "level2",
        time_scale=args.time_scale,
        jobs=jobs,
        prefix=args.prefix,
        case_timeout=args.case_timeout,
        on_result=finished,
        on_tick=lambda progress: _status.show(progress.line()),
    )
    _status.clear()
    return [r.as_dict() for r in results]


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
