"""Every comparison benchmark, one after another, each regenerating its results file, then
``bench/RESULTS.md``: the machine, the commit, the load average around each benchmark and
each one's targets or ratios, in one place.

    uv run --group bench python bench/all.py [--runs 3] [--only redis,rabbitmq] [--soak]

Each benchmark runs its peers side by side with ackwise in its own run (cells interleaved run
by run): only the ratios inside one file compare; absolute rates vary between hosts and runs.
``--soak`` adds the chaos soak (about an hour; not a throughput benchmark).

Each benchmark's last run (when, commit, machine, minutes, load average) is kept in
``bench/RESULTS.json``, so ``--only`` rewrites its own rows of ``RESULTS.md`` and keeps the
others, each still saying when and at which commit it ran.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import platform
import re
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from embedded import cpu_model, git  # bench/ is the script's directory: first on sys.path

BENCH_DIR = Path(__file__).resolve().parent
REPO = BENCH_DIR.parent


@dataclass(frozen=True)
class Bench:
    name: str
    script: str
    out: str
    what: str
    args: tuple[str, ...] = ()
    takes_runs: bool = True
    #: Runs per cell whatever ``--runs`` says (a small effect needs more of them).
    runs: int | None = None


BENCHES = [
    Bench("embedded", "embedded.py", "results-embedded.md", "SQLite and memory vs Huey (SQLite)"),
    Bench(
        "redis",
        "redis_peers.py",
        "results-redis.md",
        "Redis vs Celery, Dramatiq, Taskiq, Huey",
    ),
    Bench("rabbitmq", "rabbitmq.py", "results-rabbitmq.md", "RabbitMQ vs Celery, Dramatiq"),
    Bench(
        "rabbitmq-close",
        "rabbitmq.py",
        "results-rabbitmq-close.md",
        "RabbitMQ latency and single-call enqueue vs Dramatiq, more runs (close calls)",
        # 3,000 tasks a latency run: its p99 then rests on 30 samples, not 10.
        (
            *("--only", "lat-ackwise,lat-dramatiq,enq-pika-quorum,enq-ackwise,enq-dramatiq"),
            *("--lat-tasks", "3000"),
        ),
        runs=9,
    ),
    Bench("postgresql", "postgresql.py", "results-postgresql.md", "PostgreSQL vs Procrastinate"),
    Bench("sqs", "sqs.py", "results-sqs.md", "SQS (moto server) vs Celery"),
    Bench(
        "sqs-stock-moto",
        "sqs.py",
        "results-sqs-stock-moto.md",
        "SQS on stock moto vs Celery",
        ("--tasks", "300", "--stock-moto"),
    ),
    Bench(
        "observability",
        "observability.py",
        "results-observability.md",
        "what metrics and the task log cost (Redis)",
        ("--tasks", "40000"),
        runs=9,
    ),
    Bench(
        "rate-limit",
        "rate_limit.py",
        "results-rate-limit.md",
        "a rate limit shared by two workers (Redis)",
    ),
    Bench(
        "dashboard",
        "dashboard.py",
        "results-dashboard.md",
        "the dashboard's page loads with 100 queues and 10,000 dead letters (SQLite, Chromium)",
        runs=5,
    ),
    Bench(
        "scaling",
        "scaling.py",
        "results-scaling.md",
        "drain rate with 1, 2, 4 worker processes on Redis, RabbitMQ, PostgreSQL",
        # A Redis drain of 20,000 tasks lasts half a second: too short for its CPU figures.
        args=("--tasks", "100000"),
    ),
]
SOAK = Bench(
    "soak",
    "soak.py",
    "results-soak.md",
    "chaos soak: every broker and mode under SIGKILLs, cuts, restarts",
    ("--write",),
    takes_runs=False,
)

#: The sections of a results file that say how ackwise compares (copied into RESULTS.md).
_SUMMARY = re.compile(r"^## (Targets|Target|Ratios)\b.*$", re.MULTILINE)


def summary(text: str) -> str:
    """The file's targets/ratios sections, each up to the next heading."""
    parts = []
    for m in _SUMMARY.finditer(text):
        end = text.find("\n## ", m.end())
        parts.append(text[m.start() : end if end != -1 else len(text)].strip())
    return "\n\n".join(parts).replace("\n## ", "\n### ").replace("## ", "### ", 1)


@dataclass
class Ran:
    """One benchmark's last run, as recorded in ``RESULTS.json``."""

    name: str
    when: str
    commit: str
    machine: str
    seconds: float
    load_before: float
    load_after: float
    status: int


def machine() -> str:
    return (
        f"{platform.python_implementation()} {platform.python_version()}, "
        f"{os.cpu_count()} CPUs ({cpu_model()}), {platform.system()} {platform.release()}"
    )


def run(bench: Bench, runs: int, commit: str) -> Ran:
    cmd = [sys.executable, str(BENCH_DIR / bench.script), *bench.args]
    if bench.takes_runs:
        cmd += ["--runs", str(bench.runs or runs), "--out", f"bench/{bench.out}"]  # cwd: the repo
    print(f"== {bench.name}: {' '.join(cmd[1:])}", file=sys.stderr, flush=True)
    load = os.getloadavg()[0]
    started = time.monotonic()
    status = subprocess.run(cmd, cwd=REPO, stdout=subprocess.DEVNULL, check=False).returncode
    when = dt.datetime.now(dt.UTC).strftime("%Y-%m-%d %H:%M UTC")
    return Ran(
        bench.name,
        when,
        commit,
        machine(),
        time.monotonic() - started,
        load,
        os.getloadavg()[0],
        status,
    )


def load_record(path: Path) -> dict[str, Ran]:
    """The last run of every benchmark, by name ({} when there is no record yet)."""
    try:
        raw = json.loads(path.read_text())
    except FileNotFoundError:
        return {}
    return {name: Ran(**fields) for name, fields in raw.items()}


def save_record(path: Path, record: dict[str, Ran]) -> None:
    body = {name: vars(r) for name, r in record.items()}
    path.write_text(json.dumps(body, indent=1, sort_keys=True) + "\n")


def render(record: dict[str, Ran]) -> str:
    known = [b for b in [*BENCHES, SOAK] if b.name in record]
    lines = [
        "# Benchmark results: every comparison",
        "",
        "Rerun all: `uv run --group bench python bench/all.py`; one: "
        "`... bench/all.py --only <name>` (rewrites its row and section, keeps the others). "
        "Each benchmark ran its peers side by side with ackwise in the same run; ratios "
        "compare inside one file only, absolute rates vary between hosts.",
        "",
        "| benchmark | what | file | run | git | minutes | load average before / after | status |",
        "|---|---|---|---|---|---:|---|---|",
    ]
    for b in known:
        r = record[b.name]
        lines.append(
            f"| {b.name} | {b.what} | [{b.out}]({b.out}) | {r.when} | {r.commit} | "
            f"{r.seconds / 60:.1f} | {r.load_before:.2f} / {r.load_after:.2f} | "
            f"{'ok' if r.status == 0 else f'FAILED (exit {r.status})'} |"
        )
    machines = sorted({record[b.name].machine for b in known})
    lines += ["", "Machine: " + "; ".join(machines) + "."]
    for b in known:
        path = BENCH_DIR / b.out
        if record[b.name].status != 0 or not path.exists():
            continue
        lines += ["", f"## {b.name}: {b.what}", ""]
        lines.append(summary(path.read_text()) or f"(see [{b.out}]({b.out}))")
    lines.append("")
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=3, help="runs per cell (medians of these)")
    names = ",".join(b.name for b in BENCHES)
    parser.add_argument("--only", default="", help=f"comma-separated, of: {names}")
    parser.add_argument("--soak", action="store_true", help="run the chaos soak too (~1 h)")
    parser.add_argument("--out", default=str(BENCH_DIR / "RESULTS.md"))
    args = parser.parse_args()
    chosen = [b for b in BENCHES if not args.only or b.name in args.only.split(",")]
    unknown = set(filter(None, args.only.split(","))) - {b.name for b in BENCHES}
    if unknown:
        parser.error(f"--only: unknown benchmark(s) {', '.join(sorted(unknown))}; expected {names}")
    if args.soak:
        chosen.append(SOAK)
    commit = git("rev-parse", "--short", "HEAD")
    if git("status", "--porcelain", "--untracked-files=no", "--", ".", ":!bench/*.md"):
        commit += " (uncommitted changes)"  # not counting results files an earlier run wrote
    out = Path(args.out)
    record_path = out.with_suffix(".json")
    record = load_record(record_path)
    failed = False
    for b in chosen:
        ran = run(b, args.runs, commit)
        record[b.name] = ran
        failed |= ran.status != 0
        save_record(record_path, record)  # after each: an interrupted run keeps what finished
        out.write_text(render(record))
    print(out.read_text())
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
