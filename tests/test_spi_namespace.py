"""``ackwise.spi``: the adapter SPI's namespace, and the names that moved to it.

Every name of ``ackwise.spi`` resolves, lazily; the names ``ackwise`` and ``ackwise.errors``
exported before and that belong to adapters only still work there, warning with the new
import; the names a user's code receives stay ``ackwise``'s too, the same objects; the table of
docs/adapter-authors.md says which is which; and no module of the repository's adapters, the
example adapter or the conformance suite imports a moved name the old way.
"""

from __future__ import annotations

import ast
import re
import subprocess
import sys
import warnings
from pathlib import Path

import pytest

import ackwise
import ackwise.errors
import ackwise.spi

ROOT = Path(__file__).resolve().parents[1]

#: Where each deprecated name used to be exported: ``module -> names``.
MOVED = {"ackwise": ackwise._MOVED_TO_SPI, "ackwise.errors": ackwise.errors._MOVED_TO_SPI}


def test_each_lazy_name_of_the_spi_is_the_one_its_type_checking_imports_name() -> None:
    tree = ast.parse(Path(ackwise.spi.__file__).read_text())
    [guard] = [n for n in tree.body if isinstance(n, ast.If)]
    imported = {
        alias.name: (node.module or "").removeprefix("ackwise.")
        for node in guard.body
        if isinstance(node, ast.ImportFrom) and node.module != "typing"
        for alias in node.names
    }
    assert imported == ackwise.spi._LAZY
    assert sorted(ackwise.spi.__all__) == sorted(imported)
    for name in ackwise.spi.__all__:
        assert getattr(ackwise.spi, name) is not None


def test_import_ackwise_spi_imports_none_of_its_modules_until_a_name_is_used() -> None:
    code = (
        "import sys, ackwise.spi\n"
        "before = sorted(m for m in sys.modules if m.startswith('ackwise.'))\n"
        "from ackwise.spi import AdapterRegistry, hookimpl\n"
        "print(before, 'ackwise.stores._results' in sys.modules)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    # a plugin module that imports what it registers with imports no store nor adapter
    assert out.stdout.split() == ["['ackwise.spi']", "False"]


def test_names_a_user_receives_too_are_the_same_objects_in_ackwise() -> None:
    shared = set(ackwise.spi.__all__) & set(ackwise.__all__)
    assert {"Adapter", "Capabilities", "QueueStats", "ResultStore", "hookimpl"} <= shared
    for name in shared:
        assert getattr(ackwise, name) is getattr(ackwise.spi, name), name


@pytest.mark.parametrize(
    ("module", "name"), sorted((m, n) for m, names in MOVED.items() for n in names)
)
def test_a_moved_name_still_works_and_warns_naming_ackwise_spi(module: str, name: str) -> None:
    old = sys.modules[module]
    assert name in ackwise.spi.__all__ and name not in old.__all__
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        value = getattr(old, name)
        again = getattr(old, name)  # warns every time: nothing is cached for it
    assert value is getattr(ackwise.spi, name) and again is value
    assert [w.category for w in caught] == [DeprecationWarning, DeprecationWarning]
    assert str(caught[0].message).startswith(
        f"{module}.{name} is deprecated: import it from ackwise.spi"
    )
    assert caught[0].filename == __file__  # the line that used it


def test_from_ackwise_import_a_moved_name_warns_once_at_the_importing_line(
    tmp_path: Path,
) -> None:
    (tmp_path / "old_plugin.py").write_text(
        "from ackwise import AdapterRegistry, hookimpl\nfrom ackwise.errors import redact\n"
    )
    code = (
        "import warnings\n"
        "warnings.simplefilter('always')\n"
        "with warnings.catch_warnings(record=True) as caught:\n"
        "    warnings.simplefilter('always')\n"
        "    import old_plugin\n"
        "print([(w.filename.rpartition('/')[2], w.lineno) for w in caught])\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], cwd=tmp_path, capture_output=True, text=True, check=True
    )
    assert out.stdout.strip() == "[('old_plugin.py', 1), ('old_plugin.py', 2)]"
    # and -W error::DeprecationWarning turns the old import into an error at that line
    failed = subprocess.run(
        [sys.executable, "-W", "error::DeprecationWarning", "-c", "import old_plugin"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
    )
    assert failed.returncode == 1
    assert "DeprecationWarning: ackwise.AdapterRegistry is deprecated" in failed.stderr


#: Every module of these packages is imported under ``-W error::DeprecationWarning``.
PACKAGES = [
    "ackwise_redis",
    "ackwise_rabbitmq",
    "ackwise_sqs",
    "ackwise_postgresql",
    "ackwise_nats",
    "ackwise_dirq",
    "ackwise_conformance",
]

IMPORT_ALL = """
import importlib, pkgutil, sys
names = []
for top in sys.argv[1:]:
    names += [top, *(m.name for m in pkgutil.walk_packages(importlib.import_module(top).__path__, top + "."))]
failed = {}
for _ in range(3):  # a module met inside an import cycle of its package imports at a later turn
    failed = {}
    for name in names:
        try:
            importlib.import_module(name)
        except ImportError as exc:
            failed[name] = exc
    names = list(failed)
for name, exc in failed.items():
    print(f"{name}: {exc}")
from ackwise import Plugins
plugins = Plugins()
for registry in (plugins.adapters, plugins.lock_backends):
    for entry in registry.entries():
        entry.load()
print("loaded", len(plugins.adapters.schemes()))
"""


def test_no_adapter_nor_the_suite_imports_a_moved_name_the_old_way() -> None:
    done = subprocess.run(
        [sys.executable, "-W", "error::DeprecationWarning", "-c", IMPORT_ALL, *PACKAGES],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr[-4000:]
    assert done.stdout.splitlines()[-1].startswith("loaded"), done.stdout
    assert done.stdout.splitlines()[:-1] == [], done.stdout


def _decision_table() -> dict[str, str]:
    """docs/adapter-authors.md's table: ``name -> what ackwise (or ackwise.errors) does``."""
    text = (ROOT / "docs/adapter-authors.md").read_text()
    rows = re.findall(r"^\| `(\w+)` \| ([^|]+) \|", text, re.M)
    assert rows, "docs/adapter-authors.md has no table of the SPI's names"
    return {name: where.strip() for name, where in rows}


def test_the_docs_table_says_which_name_is_the_spis_only() -> None:
    table = _decision_table()
    assert sorted(table) == sorted(ackwise.spi.__all__), "the table lists every name of the SPI"
    for name, where in table.items():
        if name in ackwise.__all__:
            assert where == "also `ackwise`", name
        elif name in ackwise._MOVED_TO_SPI:
            assert where == "deprecated in `ackwise`", name
        elif name in ackwise.errors._MOVED_TO_SPI:
            assert where == "deprecated in `ackwise.errors`", name
        else:
            assert where == "only `ackwise.spi`", name
