"""Every Python snippet of the user guide pages listed here runs, as a reader would run it.

A block whose first line is ``# some/module.py`` is written to that path in a fresh directory;
then the page's worker starts (``ackwise worker …`` in that directory, on the embedded SQLite
broker) and every other block runs there, in order, each in its own interpreter.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
from pathlib import Path

import pytest

DOCS = Path(__file__).parent.parent / "docs"

#: The pages, and the worker each one's snippets need.
PAGES = {
    "results.md": ["proj.tasks:app", "--pool", "prefork", "-c", "2"],  # values cross a pipe
    "workflows.md": ["shop.tasks:app", "--pool", "threads", "-c", "2"],
    "rate-limits.md": ["api.tasks:app", "--pool", "threads", "-c", "2"],
    "priorities.md": ["shop.tasks:app", "--pool", "threads", "-c", "2"],
}

_BLOCK = re.compile(r"^```python\n(.*?)^```", re.DOTALL | re.MULTILINE)
_MODULE = re.compile(r"^# ([\w/]+\.py)\n")


def _blocks(page: str) -> list[str]:
    return _BLOCK.findall((DOCS / page).read_text())


@pytest.mark.slow
@pytest.mark.parametrize("page", sorted(PAGES))
def test_every_snippet_of_the_page_runs(page: str, tmp_path: Path) -> None:
    blocks = _blocks(page)
    assert blocks, f"docs/{page} has no python block"
    scripts = []
    for block in blocks:
        module = _MODULE.match(block)
        if module:
            path = tmp_path / module.group(1)
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(block)
            for parent in path.relative_to(tmp_path).parents:
                if parent != Path("."):
                    (tmp_path / parent / "__init__.py").touch()
        else:
            scripts.append(block)
    env = {**os.environ, "PYTHONPATH": str(tmp_path)}
    env.pop("ACKWISE_BROKER_URL", None)
    worker = subprocess.Popen(
        [sys.executable, "-m", "ackwise", "worker", *PAGES[page]],
        cwd=tmp_path,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        for i, script in enumerate(scripts, 1):
            run = subprocess.run(
                [sys.executable, "-c", script],
                cwd=tmp_path,
                env=env,
                capture_output=True,
                text=True,
                timeout=60,
            )
            assert run.returncode == 0, (
                f"docs/{page}, snippet {i} of {len(scripts)} failed:\n{script}\n"
                f"{run.stdout}{run.stderr}"
            )
    finally:
        worker.send_signal(signal.SIGTERM)
        out, _ = worker.communicate(timeout=60)
    assert worker.returncode == 0, out[-3000:]
