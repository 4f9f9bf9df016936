"""The documentation site: it builds with MkDocs in strict mode (a broken link, an unknown
anchor, a page missing from the navigation or an API name that does not resolve fails), every
public name is in the API reference, and every public name has a docstring."""

from __future__ import annotations

import importlib
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import griffe
import pytest

ROOT = Path(__file__).resolve().parent.parent

#: The modules whose ``__all__`` is ackwise's public API.
PUBLIC_MODULES = [
    "ackwise",
    "ackwise.errors",
    "ackwise.spi",
    "ackwise.testing",
    "ackwise.contrib.django",
    "ackwise.contrib.sqlalchemy",
    "ackwise.dashboard",
    "ackwise_conformance",
]
SEARCH_PATHS = [str(ROOT / "core/src"), str(ROOT / "contrib/conformance/src")]


def _public_names() -> list[tuple[str, str]]:
    names = []
    for module in PUBLIC_MODULES:
        for name in importlib.import_module(module).__all__:
            if name != "__version__":
                names.append((module, name))
    return names


def _documented(obj: griffe.Object | griffe.Alias) -> bool:
    target = obj.final_target if obj.is_alias else obj
    return bool(target.docstring and target.docstring.value.strip())


def test_the_site_builds_in_strict_mode(tmp_path: Path) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(tmp_path)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        env={**os.environ, "NO_MKDOCS_2_WARNING": "1"},
        timeout=300,
    )
    problems = [line for line in done.stderr.splitlines() if not line.startswith("INFO")]
    assert done.returncode == 0, "\n".join(problems)
    assert (tmp_path / "reference/app/index.html").is_file()
    assert (tmp_path / "quickstart/index.html").is_file()


def _same_object_rendered(module: str, name: str, directives: set[str]) -> bool:
    """A name two public modules export (``ackwise.Adapter`` is ``ackwise.spi.Adapter``) is
    rendered once, under either."""
    value = getattr(importlib.import_module(module), name)
    return any(
        other != module
        and f"{other}.{name}" in directives
        and getattr(importlib.import_module(other), name, None) is value
        for other in PUBLIC_MODULES
    )


def test_every_public_name_is_in_the_api_reference() -> None:
    directives = set()
    for page in (ROOT / "docs/reference").glob("*.md"):
        directives |= set(re.findall(r"^::: (\S+)", page.read_text(), re.M))
    missing = [
        f"{module}.{name}"
        for module, name in _public_names()
        if module not in directives
        and f"{module}.{name}" not in directives
        and not _same_object_rendered(module, name, directives)
    ]
    assert missing == [], "public names no page of docs/reference renders (add a ::: line)"


def test_every_public_name_and_method_has_a_docstring() -> None:
    # In a process of its own: griffe builds ASTs, and CPython 3.11 keeps the AST
    # constructor's recursion depth per interpreter, not per thread (python/cpython#106905):
    # a thread of another test still running in this process (a traceback formatted in a
    # worker's thread parses its lines) made it raise "SystemError: AST constructor
    # recursion depth mismatch" in a clean run.
    code = (
        "import json, sys; sys.path.insert(0, sys.argv[1]); "
        "import test_docs_site; print(json.dumps(test_docs_site.undocumented()))"
    )
    done = subprocess.run(
        [sys.executable, "-c", code, str(Path(__file__).parent)],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
        cwd=ROOT,
    )
    assert done.returncode == 0, done.stderr[-4000:]
    missing = json.loads(done.stdout.strip().splitlines()[-1])
    assert missing == [], "public names without a docstring"


def undocumented() -> list[str]:
    """The public names and methods without a docstring, as griffe reads the sources."""
    loader = griffe.GriffeLoader(search_paths=SEARCH_PATHS)
    packages = {module: loader.load(module) for module in PUBLIC_MODULES}
    loader.resolve_aliases(implicit=True, external=None)
    missing = []
    for module, name in _public_names():
        obj = packages[module][name]
        if not _documented(obj):
            missing.append(f"{module}.{name}")
        target = obj.final_target if obj.is_alias else obj
        if not target.is_class:
            continue
        for member_name, member in target.members.items():
            # test_* methods of the conformance suites are pytest's tests: their names say it
            if member_name.startswith(("_", "test_")):
                continue
            real = member.final_target if member.is_alias else member
            if real.is_function and not _documented(real):
                missing.append(f"{module}.{name}.{member_name}")
    return missing


@pytest.mark.parametrize("page", ["semantics.md", "conformance.md"])
def test_the_contract_pages_are_first_class(page: str) -> None:
    nav = (ROOT / "mkdocs.yml").read_text()
    assert re.search(rf"^\s+- [^:\n]+: {re.escape(page)}$", nav, re.M), f"{page} not in the nav"
