"""No module uses a private name (``_name``) that another module defines.

A *wing* is a part of the code base that may keep names to itself: each first-level package
of core (``ackwise.worker``, ``ackwise.app``, ``ackwise.contract``, ...), each first-level
module of core (``ackwise.errors``, ``ackwise.spi``, ``ackwise.testing``, ...), each adapter
package (``ackwise_redis``, ..., the example's ``ackwise_dirq``) and ``ackwise_conformance``.
Wings talk through modules: importing another wing's private *module*
(``from ackwise.contract import _envelope``, ``from ackwise.app._app import App``) is how they
do it. Using a private *name* that another module defines is not (an attribute even within
its wing: it belongs to the module that defines it):

- (a) ``from X import _name`` where ``X`` is in another wing and ``_name`` is not a module;
- (b) ``something._name`` (not ``self._x`` nor ``cls._x``, not a dunder) where no statement
  of the module itself defines ``_name`` (a ``def``, a ``class``, an assignment, an attribute
  assignment, an import ``as _name``, a ``__slots__`` entry) but a module of the code base
  does: the private name of some other module is being used. A private name no module of the
  code base defines (``sys._getframe``, a named tuple's ``_replace``) belongs to a library and
  is not this test's business; :data:`LIBRARY_PRIVATES` lists the library privates that share
  a name with one of ours.

The walk is static (``ast``): nothing is imported.
"""

from __future__ import annotations

import ast
from collections import defaultdict
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

#: Where each top-level package of the code base lives.
SOURCES = [
    ROOT / "core/src/ackwise",
    ROOT / "contrib/conformance/src/ackwise_conformance",
    *sorted(p for p in (ROOT / "adapters").glob("*/src/ackwise_*") if p.is_dir()),
    ROOT / "examples/adapter/src/ackwise_dirq",
]


#: ``(module, name)``: a library's private name that a module of ours also defines, used on the
#: library's object. Each entry must still be needed (a test checks).
LIBRARY_PRIVATES = {
    # pika's transport state; _pika_private is the one module that touches pika's private API
    ("ackwise_rabbitmq._pika_private", "_state"),
}


@dataclass(frozen=True)
class Module:
    name: str  # ackwise.worker._loop
    path: Path
    is_package: bool
    tree: ast.Module

    @property
    def wing(self) -> str:
        return wing_of(self.name)

    @property
    def where(self) -> str:
        return str(self.path.relative_to(ROOT) if self.path.is_relative_to(ROOT) else self.path)


def wing_of(module: str) -> str:
    """``ackwise.worker._loop`` -> ``ackwise.worker``; ``ackwise_redis._adapter`` ->
    ``ackwise_redis``; ``ackwise`` (core's ``__init__``) -> ``ackwise``."""
    parts = module.split(".")
    return ".".join(parts[:2]) if parts[0] == "ackwise" else parts[0]


def modules(sources: list[Path] = SOURCES) -> dict[str, Module]:
    found = {}
    for top in sources:
        assert top.is_dir(), f"no sources under {top}"
        for path in sorted(top.rglob("*.py")):
            parts = [top.name, *path.relative_to(top).with_suffix("").parts]
            is_package = parts[-1] == "__init__"
            if is_package:
                parts.pop()
            name = ".".join(parts)
            found[name] = Module(name, path, is_package, ast.parse(path.read_text(), str(path)))
    return found


def absolute(module: Module, node: ast.ImportFrom) -> str:
    """The module an ``ImportFrom`` imports from, relative imports resolved."""
    if not node.level:
        return node.module or ""
    package = module.name.split(".")
    if not module.is_package:
        package.pop()
    base = package[: len(package) - node.level + 1]
    return ".".join([*base, node.module] if node.module else base)


def is_private(name: str) -> bool:
    return name.startswith("_") and not (name.startswith("__") and name.endswith("__"))


def defined_names(tree: ast.Module) -> set[str]:
    """Every private name a statement of this module defines (as a name or an attribute)."""
    names: set[str] = set()

    def target(node: ast.expr) -> None:
        if isinstance(node, ast.Name):
            names.add(node.id)
        elif isinstance(node, ast.Attribute):
            names.add(node.attr)
        elif isinstance(node, ast.Tuple | ast.List):
            for element in node.elts:
                target(element)
        elif isinstance(node, ast.Starred):
            target(node.value)

    for node in ast.walk(tree):
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            names.add(node.name)
        elif isinstance(node, ast.Assign):
            for t in node.targets:
                target(t)
            if any(isinstance(t, ast.Name) and t.id == "__slots__" for t in node.targets):
                names |= {
                    c.value
                    for c in ast.walk(node.value)
                    if isinstance(c, ast.Constant) and isinstance(c.value, str)
                }
        elif isinstance(
            node, ast.AnnAssign | ast.AugAssign | ast.For | ast.AsyncFor | ast.comprehension
        ):
            target(node.target)
        elif isinstance(node, ast.withitem) and node.optional_vars is not None:
            target(node.optional_vars)
        elif isinstance(node, ast.NamedExpr):
            target(node.target)
        elif isinstance(node, ast.Import | ast.ImportFrom):
            names |= {a.asname or a.name.partition(".")[0] for a in node.names}
        elif isinstance(node, ast.arg):
            names.add(node.arg)
        elif isinstance(node, ast.ExceptHandler) and node.name:
            names.add(node.name)
    return {n for n in names if is_private(n)}


def violations(
    allowed: set[tuple[str, str]] = LIBRARY_PRIVATES, sources: list[Path] = SOURCES
) -> Iterator[tuple[str, int, str]]:
    """``(file, line, what)`` of every use of another module's private name."""
    found = modules(sources)
    defined = {name: defined_names(m.tree) for name, m in found.items()}
    definers: dict[str, set[str]] = defaultdict(set)
    for name, names in defined.items():
        for private in names:
            definers[private].add(name)
    for module in found.values():
        for node in ast.walk(module.tree):
            if isinstance(node, ast.ImportFrom):
                source = absolute(module, node)
                if source not in found or wing_of(source) == module.wing:
                    continue
                for alias in node.names:
                    submodule = f"{source}.{alias.name}"
                    if is_private(alias.name) and submodule not in found:
                        yield (
                            module.where,
                            node.lineno,
                            f"from {source} import {alias.name} (wing {wing_of(source)})",
                        )
            elif isinstance(node, ast.Attribute) and is_private(node.attr):
                obj = node.value
                if isinstance(obj, ast.Name) and obj.id in {"self", "cls"}:
                    continue
                if node.attr in defined[module.name] or (module.name, node.attr) in allowed:
                    continue
                others = sorted(definers.get(node.attr, ()))
                if others:
                    yield (
                        module.where,
                        node.lineno,
                        f"{ast.unparse(node)} ({node.attr} is defined in {', '.join(others)})",
                    )


def test_no_module_uses_a_private_name_of_another_module() -> None:
    found = [f"{where}:{line}: {what}" for where, line, what in sorted(set(violations()))]
    assert found == [], (
        "private names used outside the module that defines them (wings talk through "
        "modules: import the module, use its public names):\n" + "\n".join(found)
    )


def test_each_library_private_allowed_is_still_used() -> None:
    reported = {(where, what) for where, _, what in violations(allowed=set())}
    for module, name in LIBRARY_PRIVATES:
        path = module.replace(".", "/") + ".py"
        assert any(
            where.endswith(path) and f"({name} is defined in" in what for where, what in reported
        ), f"{module} no longer uses {name}: drop it from LIBRARY_PRIVATES"


def test_the_checks_see_what_they_are_for(tmp_path: Path) -> None:
    """A module that imports a private function of another wing and reads a private attribute
    another module defines is reported, once for each; its own privates, a private module it
    imports and a library's private are not."""
    for name, files in {
        "ackwise_probe_one": {
            "__init__.py": "",
            "_tools.py": "class Tool:\n    def __init__(self):\n        self._hidden = 1\n"
            "def _helper():\n    pass\n",
        },
        "ackwise_probe_two": {
            "__init__.py": "",
            "mod.py": "import sys\n"
            "from ackwise_probe_one import _tools\n"
            "from ackwise_probe_one._tools import Tool, _helper\n"
            "class Own:\n"
            "    def __init__(self):\n"
            "        self._mine = 1\n"
            "def use(own, tool):\n"
            "    return own._mine, tool._hidden, sys._getframe, _tools.Tool\n",
        },
    }.items():
        (tmp_path / name).mkdir()
        for file, text in files.items():
            (tmp_path / name / file).write_text(text)
    probes = [tmp_path / "ackwise_probe_one", tmp_path / "ackwise_probe_two"]
    found = sorted(violations(sources=probes))
    assert [(Path(w).name, line, what.split(" (")[0]) for w, line, what in found] == [
        ("mod.py", 3, "from ackwise_probe_one._tools import _helper"),
        ("mod.py", 8, "tool._hidden"),
    ]


def test_the_walk_sees_every_wing() -> None:
    wings = {m.wing for m in modules().values()}
    assert {"ackwise", "ackwise.errors", "ackwise.spi", "ackwise.worker", "ackwise.app"} <= wings
    assert {"ackwise_conformance", "ackwise_redis", "ackwise_dirq"} <= wings
