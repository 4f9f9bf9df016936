"""The dashboard's page loads with 100 queues and 10,000 dead letters, timed by headless
Chromium (docs/dashboard.md: each page well under 300 ms).

    uv run --group bench python bench/dashboard.py [--runs 5] [--queues 100] [--dead 10000]
                                                   [--out bench/results-dashboard.md]

Needs Chromium and its chromedriver (Debian: ``apt-get install chromium chromium-driver``);
Selenium and the dashboard's web stack come with the default (dev) dependency group.

Setup: a fresh SQLite broker file holding ``--queues`` queues with ``--dead`` dead letters
spread evenly over them, and one ``ackwise dashboard`` process on a free port of 127.0.0.1.
Pages: the queues page (``/``), the first page of dead letters (``/dead``) and the last one
(``/dead?page=N``); each is checked for what it must show (every queue, the dead-letter count
and page number) before it is timed.  Each page is loaded once after the dashboard starts
(reported apart: the first load), then ``--runs`` times, pages interleaved run by run.  The
figure is the browser's own navigation time, ``performance.getEntriesByType('navigation')[0]
.duration``: from the navigation's start to the end of the page's load event.  Verdict on each
page's median.
"""

from __future__ import annotations

import argparse
import datetime as dt
import os
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

import _common
import embedded

from ackwise import App
from ackwise.spi import Outgoing, QueueSpec

TARGET_MS = 300.0
CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
CHROMEDRIVER = shutil.which("chromedriver") or "/usr/bin/chromedriver"
PER_PAGE = 50  # dead letters per page of the dashboard

APP_MODULE = """
import os
from ackwise import App

app = App("dashbench", broker=os.environ["DASH_BENCH_BROKER"])
"""


def fill(broker: str, queues: int, dead: int) -> list[str]:
    """Declare the queues and dead-letter ``dead`` messages spread over them; their names."""
    app = App("dashbench", broker=broker)
    adapter = app.adapter()
    adapter.open()
    names = [f"q{n:03d}" for n in range(queues)]
    try:
        for i, q in enumerate(names):
            adapter.declare(QueueSpec(q))
            share = dead // queues + (1 if i < dead % queues else 0)
            adapter.publish_dead(
                q, [Outgoing(uuid.uuid4().hex, b'{"v":1}') for _ in range(share)], reason="failed"
            )
    finally:
        adapter.close()
        app.close()
    return names


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def start_dashboard(tmp: Path, broker: str) -> tuple[subprocess.Popen[bytes], str]:
    (tmp / "dash_bench.py").write_text(APP_MODULE)
    env = {**os.environ, "PYTHONPATH": str(tmp), "DASH_BENCH_BROKER": broker}
    port = free_port()
    proc = subprocess.Popen(
        [sys.executable, "-m", "ackwise", "--loglevel", "WARNING", "dashboard", "dash_bench:app",
         "--port", str(port)],
        cwd=tmp, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
    )  # fmt: skip
    deadline = time.monotonic() + 60
    while True:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=0.5).close()
            return proc, f"http://127.0.0.1:{port}"
        except OSError:
            if proc.poll() is not None:
                raise SystemExit(
                    f"the dashboard exited: {proc.communicate()[1].decode()}"
                ) from None
            if time.monotonic() > deadline:
                proc.kill()
                raise SystemExit("the dashboard did not listen within 60 s") from None
            time.sleep(0.05)


def browser() -> Any:
    from selenium import webdriver

    for path in (CHROMIUM, CHROMEDRIVER):
        if not Path(path).exists():
            raise SystemExit(f"{path} not found: apt-get install chromium chromium-driver")
    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for flag in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--disable-gpu",
                 "--window-size=1280,900"):  # fmt: skip
        options.add_argument(flag)
    driver = webdriver.Chrome(options=options, service=webdriver.ChromeService(CHROMEDRIVER))
    driver.set_page_load_timeout(60)
    return driver


def load(driver: Any, url: str) -> float:
    """Navigate to ``url``; the browser's navigation time in ms."""
    driver.get(url)
    duration = driver.execute_script(
        "return performance.getEntriesByType('navigation')[0].duration"
    )
    return float(duration)


_QUEUES_SHOWN = "return [...document.querySelectorAll('tr[data-queue]')].map(r => r.dataset.queue)"


def check(driver: Any, path: str, queues: list[str], dead: int, pages: int) -> None:
    """Refuse to time a page that does not show what it must (the measure would be of
    something else: an error page, an empty table)."""
    from selenium.webdriver.common.by import By

    if path == "/":
        # In one script: the page's own refresh replaces the rows while Selenium reads them.
        shown = set(driver.execute_script(_QUEUES_SHOWN))
        missing = sorted(set(queues) - shown)
        if missing:
            raise SystemExit(f"the queues page lacks {len(missing)} queue(s), e.g. {missing[0]}")
        return
    page = 1 if path == "/dead" else pages
    want = f"{dead} dead letter(s), page {page} of {pages}"
    count = driver.find_element(By.ID, "count").text
    rows = driver.find_elements(By.CSS_SELECTOR, "#dead tr[data-id]")
    if count != want or not rows:
        raise SystemExit(f"{path}: shows {count!r} and {len(rows)} row(s); expected {want!r}")


def chromium_version() -> str:
    try:
        out = subprocess.run([CHROMIUM, "--version"], capture_output=True, text=True, check=True)
    except (OSError, subprocess.CalledProcessError):
        return "Chromium ?"
    return out.stdout.strip()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--runs", type=int, default=5, help="timed loads per page (>= 3)")
    parser.add_argument("--queues", type=int, default=100)
    parser.add_argument("--dead", type=int, default=10_000)
    parser.add_argument("--out", default="bench/results-dashboard.md")
    args = parser.parse_args()
    if args.runs < 3:
        parser.error("--runs must be at least 3 (the figure is a median)")
    pages = max(1, -(-args.dead // PER_PAGE))
    paths = ["/", "/dead", f"/dead?page={pages}"]
    began, load0 = time.time(), os.getloadavg()[0]
    head, tree = embedded.git("rev-parse", "--short", "HEAD"), _common.tree_state()
    first: dict[str, float] = {}
    times: dict[str, list[float]] = {p: [] for p in paths}
    with tempfile.TemporaryDirectory(prefix="dashbench-") as tmp_dir:
        tmp = Path(tmp_dir)
        broker = f"sqlite:///{tmp / 'q.db'}"
        started = time.monotonic()
        queues = fill(broker, args.queues, args.dead)
        print(f"filled in {time.monotonic() - started:.1f} s", file=sys.stderr)
        proc, url = start_dashboard(tmp, broker)
        driver = browser()
        try:
            for p in paths:
                first[p] = load(driver, url + p)
                check(driver, p, queues, args.dead, pages)
            for run in range(1, args.runs + 1):
                for p in paths:
                    times[p].append(load(driver, url + p))
                figures = ", ".join(f"{p} {times[p][-1]:.0f}" for p in paths)
                print(f"run {run}: {figures} (ms)", file=sys.stderr)
        finally:
            driver.quit()
            proc.terminate()
            proc.wait(10)
    medians = {p: statistics.median(t) for p, t in times.items()}
    ok = all(m < TARGET_MS for m in medians.values())
    when = dt.datetime.fromtimestamp(began, dt.UTC).strftime("%Y-%m-%d %H:%M UTC")
    lines = [
        f"# Dashboard page loads: {args.queues} queues, {args.dead:,} dead letters (SQLite)",
        "",
        f"Run {when}, git {head}{tree}, CPython {sys.version.split()[0]}, {os.cpu_count()} "
        f"CPUs ({embedded.cpu_model()}), {chromium_version()} headless through Selenium; load "
        f"average {load0:.2f} at the start, {os.getloadavg()[0]:.2f} at the end; one "
        f"`ackwise dashboard` process on a fresh SQLite file; {args.runs} timed loads per "
        "page, pages interleaved run by run, after one first load each.",
        "",
        "| page | median (ms) | min | max | each run (ms) | first load (ms) |",
        "|---|---:|---:|---:|---|---:|",
        *(
            f"| `{p}` | {medians[p]:.0f} | {min(times[p]):.0f} | {max(times[p]):.0f} | "
            f"{', '.join(f'{t:.0f}' for t in times[p])} | {first[p]:.0f} |"
            for p in paths
        ),
        "",
        "## Targets",
        "",
        "| target | measured | met |",
        "|---|---|---|",
        *(
            f"| `{p}` loads in under {TARGET_MS:.0f} ms (median; docs/dashboard.md) | "
            f"{medians[p]:.0f} ms | {'yes' if medians[p] < TARGET_MS else 'no'} |"
            for p in paths
        ),
        "",
        "## Method",
        "",
        "The browser's navigation time (`performance.getEntriesByType('navigation')[0]"
        ".duration`): from the start of the navigation to the end of the page's load event, "
        "so the server's work (reading the broker), the transfer and the browser's parse and "
        "render of the HTML. Each page is checked for what it must show (every queue; the "
        "dead-letter count and the page number, and rows) before it is timed. The first load "
        "of each page after the dashboard starts is reported apart and not in the median.",
        "",
        "Rerun: `uv run --group bench python bench/dashboard.py` (about a minute; needs "
        "chromium and chromedriver).",
    ]
    text = "\n".join(lines) + "\n"
    Path(args.out).write_text(text)
    print(text)
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
