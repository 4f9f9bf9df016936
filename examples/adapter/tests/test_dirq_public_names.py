"""The example imports only ackwise's public names: ``ackwise`` and ``ackwise.errors``.

``lint-imports`` (run by scripts/test) enforces the same through pyproject.toml; this test
makes the rule fail under plain pytest too, and names the file and line.
"""

from __future__ import annotations

import ast
from pathlib import Path

import ackwise

SOURCE = Path(__file__).resolve().parents[1] / "src" / "ackwise_dirq"
ALLOWED = {"ackwise", "ackwise.errors"}


def ackwise_imports(path: Path) -> list[tuple[int, str]]:
    """``(line, module)`` of every import of an ``ackwise`` module in ``path``."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found += [(node.lineno, alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.append((node.lineno, node.module))
            if node.module == "ackwise":  # `from ackwise import _spi` imports a module too
                found += [(node.lineno, f"ackwise.{a.name}") for a in node.names]
    return [(n, m) for n, m in found if m == "ackwise" or m.startswith("ackwise.")]


def test_the_example_imports_only_public_ackwise_names() -> None:
    files = sorted(SOURCE.rglob("*.py"))
    assert files, f"no sources under {SOURCE}"
    offending = []
    for path in files:
        for line, module in ackwise_imports(path):
            # `from ackwise import Adapter` reads as "ackwise.Adapter": a public name.
            if module in ALLOWED or module.removeprefix("ackwise.") in ackwise.__all__:
                continue
            offending.append(f"{path.name}:{line}: {module}")
    assert not offending, "private ackwise imports (use ackwise / ackwise.errors):\n" + "\n".join(
        offending
    )


def test_the_check_sees_a_private_import(tmp_path: Path) -> None:
    sample = tmp_path / "sample.py"
    sample.write_text(
        "from ackwise.contract._spi import Adapter\nfrom ackwise import _memory, Outgoing\n"
    )
    assert ackwise_imports(sample) == [
        (1, "ackwise.contract._spi"),
        (2, "ackwise"),
        (2, "ackwise.backends.memory._adapter"),
        (2, "ackwise.Outgoing"),
    ]
