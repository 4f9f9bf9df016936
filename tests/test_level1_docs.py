"""The docs state how many level-1 tests there are, and list them: both agree with what the
suite collects, so that neither can drift ("about forty" and "about fifty" did)."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

import ackwise_conformance

ROOT = Path(__file__).resolve().parent.parent
DOCS = ROOT / "docs"

#: Every sentence that states the number of level-1 tests: (page, pattern with the number).
STATED = [
    ("conformance.md", r"\*\*Level 1, the SPI checks\.\*\* (\d+) pytest tests"),
    ("conformance.md", r"`AdapterConformance` runs these (\d+) tests"),
    ("adapter-authors.md", r"^(\d+) tests run \(\[the list\]"),
]


@pytest.fixture(scope="module")
def collected(tmp_path_factory: pytest.TempPathFactory) -> list[str]:
    """The node ids of the level-1 module ``ackwise conformance --level 1`` runs."""
    workdir = tmp_path_factory.mktemp("level1")
    template = Path(ackwise_conformance.__file__).with_name("_level1_template.py")
    (workdir / "test_level1_spi.py").write_text(template.read_text())
    options = ["--collect-only", "-q", "-p", "no:cacheprovider", "-o", "addopts="]
    done = subprocess.run(
        [sys.executable, "-m", "pytest", *options, "--rootdir", str(workdir), "test_level1_spi.py"],
        cwd=workdir,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    ids = [line for line in done.stdout.splitlines() if line.startswith("test_level1_spi.py::")]
    assert ids, done.stdout[-3000:]
    return ids


def test_the_docs_state_the_number_of_level_1_tests_the_suite_collects(
    collected: list[str],
) -> None:
    for page, pattern in STATED:
        found = re.findall(pattern, (DOCS / page).read_text(), re.M)
        assert len(found) == 1, f"docs/{page}: the sentence /{pattern}/ is gone or doubled"
        assert int(found[0]) == len(collected), (
            f"docs/{page} says {found[0]} level-1 tests, the suite collects {len(collected)}: "
            "change the number there (and in every sentence of STATED)"
        )


def test_the_docs_state_the_number_of_level_1_test_functions(collected: list[str]) -> None:
    text = (DOCS / "conformance.md").read_text()
    [stated] = re.findall(r"runs these \d+ tests \((\d+) test functions", text)
    assert int(stated) == len(_names(collected)), (
        f"docs/conformance.md says {stated} level-1 test functions, the suite has "
        f"{len(_names(collected))}"
    )


def _names(collected: list[str]) -> set[str]:
    """The test functions' names (a parametrized one once)."""
    return {re.sub(r"\[.*\]$", "", node.rpartition("::")[2]) for node in collected}


def test_the_docs_say_no_vague_number_of_level_1_tests() -> None:
    for page in ("conformance.md", "adapter-authors.md"):
        text = (DOCS / page).read_text()
        vague = re.findall(r"[Aa]bout (?:\w+ )?(?:forty|fifty|sixty|\d+) (?:pytest )?tests", text)
        assert vague == [], f"docs/{page}: {vague}"


def test_every_level_1_test_is_listed_in_the_conformance_page(collected: list[str]) -> None:
    section = (DOCS / "conformance.md").read_text()
    section = section[section.index("## 4. Level 1") : section.index("## 5.")]
    listed = set(re.findall(r"`(test_\w+)`", section))
    names = _names(collected)
    assert sorted(names - listed) == [], "level-1 tests missing from docs/conformance.md § 4"
    assert sorted(listed - names) == [], "docs/conformance.md § 4 lists tests that do not exist"
