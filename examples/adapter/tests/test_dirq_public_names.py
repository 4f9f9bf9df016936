"""The example imports only ackwise's public names for adapters: ``ackwise.spi``,
``ackwise.errors`` and ``ackwise``.

``lint-imports`` (run by scripts/test) enforces the same through pyproject.toml; this test
makes the rule fail under plain pytest too, and names the file and line.  It also refuses a
name ``ackwise`` no longer lists (one that moved to ``ackwise.spi``).
"""

from __future__ import annotations

import ast
from pathlib import Path

import ackwise

SOURCE = Path(__file__).resolve().parents[1] / "src" / "ackwise_dirq"
ALLOWED = {"ackwise", "ackwise.errors", "ackwise.spi"}


def ackwise_imports(path: Path) -> list[tuple[int, str]]:
    """``(line, module)`` of every import of an ``ackwise`` module in ``path``."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found += [(node.lineno, alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.append((node.lineno, node.module))
            if node.module == "ackwise":  # `from ackwise import worker` imports a module too
                found += [(node.lineno, f"ackwise.{a.name}") for a in node.names]
    return [(n, m) for n, m in found if m == "ackwise" or m.startswith("ackwise.")]


def offending(path: Path) -> list[str]:
    """``file:line: module`` of every import of ``path`` that is not an adapter's to make."""
    return [
        f"{path.name}:{line}: {module}"
        for line, module in ackwise_imports(path)
        # `from ackwise import App` reads as "ackwise.App": a public name.
        if module not in ALLOWED and module.removeprefix("ackwise.") not in ackwise.__all__
    ]


def test_the_example_imports_only_public_ackwise_names() -> None:
    files = sorted(SOURCE.rglob("*.py"))
    assert files, f"no sources under {SOURCE}"
    bad = [line for path in files for line in offending(path)]
    assert not bad, "imports an adapter must not make (use ackwise.spi, ackwise.errors):\n" + (
        "\n".join(bad)
    )


def test_the_check_sees_a_private_import(tmp_path: Path) -> None:
    sample = tmp_path / "sample.py"
    sample.write_text(
        "from ackwise.contract._spi import Adapter\n"
        "from ackwise import worker, Outgoing, open_adapter\n"
        "from ackwise.spi import QueueSpec\n"
    )
    assert ackwise_imports(sample) == [
        (1, "ackwise.contract._spi"),
        (2, "ackwise"),
        (2, "ackwise.worker"),
        (2, "ackwise.Outgoing"),
        (2, "ackwise.open_adapter"),
        (3, "ackwise.spi"),
    ]
    # a wing of core, and a name that moved to ackwise.spi (deprecated in ackwise)
    assert offending(sample) == [
        "sample.py:1: ackwise.contract._spi",
        "sample.py:2: ackwise.worker",
        "sample.py:2: ackwise.Outgoing",
    ]
