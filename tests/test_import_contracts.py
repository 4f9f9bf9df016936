"""The import-linter layers name every core module, so a new one cannot slip past them."""

from __future__ import annotations

import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_every_core_module_stands_in_a_layer() -> None:
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["importlinter"]
    (layers,) = [
        c["layers"]
        for c in config["contracts"]
        if c["type"] == "layers" and c["containers"] == ["ackwise"]
    ]
    layered = {m.strip() for layer in layers for m in layer.split("|")}
    core = ROOT / "core/src/ackwise"
    modules = {p.stem for p in core.glob("*.py")} - {"__init__"}
    modules |= {p.parent.name for p in core.glob("*/__init__.py")}  # packages: contrib
    assert modules - layered == set(), "core modules in no layer of pyproject.toml"
    assert layered - modules == set(), "layers name modules that do not exist"


def test_every_app_module_stands_in_a_layer_of_the_app_wing() -> None:
    """The app wing's own layers (its imports run one way: no cycle, typing imports included)."""
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["importlinter"]
    (layers,) = [
        c["layers"]
        for c in config["contracts"]
        if c["type"] == "layers" and c["containers"] == ["ackwise.app"]
    ]
    layered = {m.strip() for layer in layers for m in layer.split("|")}
    modules = {p.stem for p in (ROOT / "core/src/ackwise/app").glob("*.py")} - {"__init__"}
    assert modules - layered == set(), "app modules in no layer of pyproject.toml"
    assert layered - modules == set(), "layers name app modules that do not exist"


def test_adapters_are_forbidden_every_private_core_module() -> None:
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["importlinter"]
    (forbidden,) = [
        c["forbidden_modules"]
        for c in config["contracts"]
        if c["type"] == "forbidden"
        and "ackwise_redis" in c["source_modules"]
        and "ackwise.contract._spi" in c["forbidden_modules"]
    ]
    private = {
        f"ackwise.{p.stem}"
        for p in (ROOT / "core/src/ackwise").glob("_*.py")
        if not p.stem.startswith("__")
    }
    assert private - set(forbidden) == set()
