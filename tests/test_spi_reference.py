"""docs/reference/spi.md reads as plain Markdown: its prose and tables (before the generated
reference) name every public name of the SPI (``ackwise.spi``) and every public method, field
and member of the classes it renders, so that an adapter author who reads the page on GitHub
misses nothing of the contract, and a name the SPI gains cannot go unmentioned.  The store
interfaces, ``ackwise``'s too, are rendered on the stores page (the results on the app's)."""

from __future__ import annotations

import dataclasses
import enum
import importlib
import inspect
import re
from pathlib import Path

import ackwise.spi

REFERENCE = Path(__file__).resolve().parent.parent / "docs/reference"
PAGE = REFERENCE / "spi.md"
GENERATED = "## Generated reference"


def _prose() -> str:
    text = PAGE.read_text()
    assert GENERATED in text, f"{PAGE.name} has no '{GENERATED}' section"
    prose = text.partition(GENERATED)[0]
    assert "::: " not in prose, f"the directives go after the prose, under {GENERATED!r}"
    return prose


def _rendered(page: Path = PAGE) -> list[str]:
    """The names a page renders (its ``:::`` directives), e.g. ``ackwise.spi.Adapter``."""
    return re.findall(r"^::: (\S+)$", page.read_text(), re.M)


def _resolve(path: str) -> object:
    """The object a directive renders: ``ackwise.spi.Adapter`` -> the class."""
    module, _, name = path.rpartition(".")
    return getattr(importlib.import_module(module), name)


def _members(obj: object) -> set[str]:
    """The public methods, properties, fields and enum members of class ``obj``."""
    assert inspect.isclass(obj)
    names = {n for n in vars(obj) if not n.startswith("_")}
    for base in obj.__mro__[1:]:  # inherited from another ackwise class (the registries' base)
        if base.__module__.startswith("ackwise"):
            names |= {n for n in vars(base) if not n.startswith("_")}
    if dataclasses.is_dataclass(obj):
        names |= {f.name for f in dataclasses.fields(obj)}
    names |= set(getattr(obj, "__struct_fields__", ()))  # msgspec structs (the envelope)
    if issubclass(obj, enum.Enum):
        names = {m.name for m in obj}
    return names


def _mentioned(prose: str, name: str) -> bool:
    """``name`` in code: `name`, `name(…)`, `name=…`, `Class.name(…)`."""
    return re.search(rf"`(?:[\w.]*\.)?{re.escape(name)}(?![\w])", prose) is not None


def test_every_name_of_the_spi_is_rendered_and_described_in_prose() -> None:
    prose = _prose()
    rendered = {r.rpartition(".")[2] for r in _rendered()}
    others = {
        r.rpartition(".")[2]
        for page in REFERENCE.glob("*.md")
        if page != PAGE
        for r in _rendered(page)
    }
    spi = set(ackwise.spi.__all__)
    assert spi - rendered - others == set(), "SPI names no generated reference renders"
    assert {r for r in _rendered() if r.rpartition(".")[2] in spi} == {
        f"ackwise.spi.{n}" for n in spi & rendered
    }, "spi.md renders the SPI's names as ackwise.spi's"
    wanted = spi | rendered
    missing = sorted(n for n in wanted if not _mentioned(prose, n))
    assert missing == [], f"names {PAGE.name} renders but its prose does not describe"


def test_every_method_field_and_member_of_the_spi_classes_is_described_in_prose() -> None:
    prose = _prose()
    missing = []
    for path in sorted(_rendered()):
        obj = _resolve(path)
        if not inspect.isclass(obj):
            continue
        name = path.rpartition(".")[2]
        missing += [f"{name}.{m}" for m in sorted(_members(obj)) if not _mentioned(prose, m)]
    assert missing == [], f"members of the SPI's classes {PAGE.name}'s prose does not mention"


def test_every_abstract_adapter_method_is_marked_abstract_in_its_row() -> None:
    prose = _prose()
    for name in sorted(ackwise.spi.Adapter.__abstractmethods__):
        row = re.search(rf"^\| `{name}\(.*$", prose, re.M)
        assert row is not None, f"no table row for Adapter.{name}"
        assert "(abstract)" in row.group(0), f"Adapter.{name}'s row does not say it is abstract"
    for row in re.findall(r"^\| `(\w+)\(.*\(abstract\).*$", prose, re.M):
        assert row in ackwise.spi.Adapter.__abstractmethods__, f"Adapter.{row} is not abstract"


def test_the_check_sees_a_name_the_page_does_not_mention() -> None:
    # The checks above would pass on anything if _mentioned matched too much.
    prose = _prose()
    assert not _mentioned(prose, "receive_sometime")
    assert not _mentioned(prose, "ack_befor")
    assert _mentioned(prose, "ack_before_start")
