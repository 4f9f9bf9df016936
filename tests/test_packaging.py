"""The distributions as a stranger gets them: one license, one version, the extras, the metadata
and a README of its own for each.

These tests read the sources every wheel and sdist is built from; scripts/check-dist builds
them, checks the built files (``twine check --strict``, LICENSE in every wheel) and installs
them into a fresh virtualenv.
"""

from __future__ import annotations

import re
import tomllib
from importlib import metadata
from pathlib import Path
from typing import Any

import pytest
from packaging.requirements import Requirement
from pymdownx.slugs import slugify

import ackwise
from ackwise import Plugins, get_plugins
from ackwise.errors import ConfigurationError, UnknownBrokerScheme
from ackwise.plugins._registries import _EXTRAS, _KNOWN_DISTRIBUTIONS

ROOT = Path(__file__).resolve().parent.parent
VERSION_FILE = ROOT / "core/src/ackwise/_version.py"
BROKER_EXTRAS = {
    "redis": "ackwise-redis",
    "rabbitmq": "ackwise-rabbitmq",
    "sqs": "ackwise-sqs",
    "postgresql": "ackwise-postgresql",
    "nats": "ackwise-nats",
}


def _toml(path: Path) -> dict[str, Any]:
    return tomllib.loads(path.read_text(encoding="utf-8"))


#: The workspace's distributions (the root pyproject.toml, not published, is not one of them).
MEMBERS = [ROOT / m for m in _toml(ROOT / "pyproject.toml")["tool"]["uv"]["workspace"]["members"]]
PROJECTS = {m.relative_to(ROOT).as_posix(): _toml(m / "pyproject.toml") for m in MEMBERS}
CORE = PROJECTS["core"]["project"]


def _mkdocs_setting(name: str) -> str:
    match = re.search(rf"^{name}: (\S+)$", (ROOT / "mkdocs.yml").read_text(), re.M)
    assert match, f"mkdocs.yml has no {name}"
    return match.group(1)


SITE = _mkdocs_setting("site_url")
REPO = _mkdocs_setting("repo_url")


def _expand(extra: str, seen: frozenset[str] = frozenset()) -> set[str]:
    """The distributions ``ackwise[extra]`` installs, following ``ackwise[...]`` self-references."""
    names: set[str] = set()
    for spec in CORE["optional-dependencies"][extra]:
        req = Requirement(spec)
        if req.name == "ackwise":
            assert extra not in seen, f"extra {extra!r} refers to itself"
            for inner in req.extras:
                names |= _expand(inner, seen | {extra})
        else:
            names.add(req.name)
    return names


# -- license ------------------------------------------------------------------------------------


@pytest.mark.parametrize("member", sorted(PROJECTS))
def test_every_distribution_ships_the_root_license_text(member: str) -> None:
    project = PROJECTS[member]["project"]
    assert project["license"] == "MIT"
    assert project["license-files"] == ["LICENSE"]
    # hatchling takes license files from the distribution's own folder only: each has a copy
    copy = ROOT / member / "LICENSE"
    assert copy.is_file(), f"{member}/LICENSE is missing"
    assert copy.read_bytes() == (ROOT / "LICENSE").read_bytes(), f"{member}/LICENSE differs"
    assert "Copyright (c) 2026 The ackwise authors" in copy.read_text()


# -- one version --------------------------------------------------------------------------------


@pytest.mark.parametrize("member", sorted(PROJECTS))
def test_every_distribution_reads_its_version_from_the_one_version_file(member: str) -> None:
    config = PROJECTS[member]
    assert "version" not in config["project"], f"{member} writes a version of its own"
    assert config["project"]["dynamic"] == ["version"]
    path = (ROOT / member / config["tool"]["hatch"]["version"]["path"]).resolve()
    assert path == VERSION_FILE
    # uv reinstalls the editable distribution when the version changes
    cache_files = {
        (ROOT / member / k["file"]).resolve() for k in config["tool"]["uv"]["cache-keys"]
    }
    assert VERSION_FILE in cache_files


def test_the_version_file_holds_ackwise_version_once() -> None:
    found = re.findall(r'^__version__ = "([^"]+)"$', VERSION_FILE.read_text(), re.M)
    assert found == [ackwise.__version__]


@pytest.mark.parametrize("member", sorted(PROJECTS))
def test_every_installed_distribution_of_the_workspace_has_ackwise_version(member: str) -> None:
    name = PROJECTS[member]["project"]["name"]
    assert metadata.version(name) == ackwise.__version__


@pytest.mark.parametrize("member", sorted(m for m in PROJECTS if m != "core"))
def test_each_distribution_requires_an_ackwise_that_admits_its_own_version(member: str) -> None:
    (req,) = [
        Requirement(d)
        for d in PROJECTS[member]["project"]["dependencies"]
        if Requirement(d).name == "ackwise"
    ]
    assert req.specifier.contains(ackwise.__version__), (member, str(req))
    # the same minor series, the range docs/versioning.md promises compatible
    major, minor, *_ = ackwise.__version__.split(".")
    assert str(req.specifier) == f"~={major}.{minor}.0", (member, str(req))


# -- extras -------------------------------------------------------------------------------------


@pytest.mark.parametrize("extra", sorted(BROKER_EXTRAS))
def test_each_broker_extra_installs_its_adapter(extra: str) -> None:
    assert _expand(extra) == {BROKER_EXTRAS[extra]}


def test_the_postgresql_adapter_brings_psycopg_for_the_postgresql_stores() -> None:
    deps = PROJECTS["adapters/postgresql"]["project"]["dependencies"]
    assert any(Requirement(d).name == "psycopg" for d in deps)


def test_postgres_is_an_alias_of_postgresql() -> None:
    assert CORE["optional-dependencies"]["postgres"] == ["ackwise[postgresql]"]


def test_all_is_every_broker_the_dashboard_and_both_observability_extras() -> None:
    expected = set()
    for extra in [*BROKER_EXTRAS, "dashboard", "otel", "prometheus"]:
        expected |= _expand(extra)
    assert _expand("all") == expected
    assert "django" not in _expand("all") and "ackwise-conformance" not in _expand("all")


def test_every_extra_is_listed_in_the_versioning_page() -> None:
    page = (ROOT / "docs/versioning.md").read_text()
    missing = [e for e in CORE["optional-dependencies"] if f"`ackwise[{e}]`" not in page]
    assert missing == []


def test_no_message_nor_page_asks_for_the_deprecated_postgres_extra() -> None:
    # only the pages that announce the deprecation may name it
    allowed = {ROOT / "CHANGELOG.md", ROOT / "docs/versioning.md"}
    paths = [ROOT / "README.md", *ROOT.glob("docs/**/*.md")]
    for folder in ("core", "contrib", "adapters", "examples"):
        paths += ROOT.joinpath(folder).glob("**/*.py")
        paths += ROOT.joinpath(folder).glob("**/*.md")
    offenders = [
        p.relative_to(ROOT).as_posix()
        for p in paths
        if p not in allowed and "ackwise[postgres]" in p.read_text(encoding="utf-8")
    ]
    assert offenders == []


def test_the_missing_adapter_error_names_an_extra_that_installs_it() -> None:
    # every scheme an adapter of the workspace registers is known, with its distribution
    registered = {
        e.scheme: e.distribution
        for e in get_plugins().adapters.entries()
        if e.distribution in BROKER_EXTRAS.values()
    }
    assert set(registered.values()) == set(BROKER_EXTRAS.values())
    assert {s: _KNOWN_DISTRIBUTIONS.get(s) for s in registered} == registered
    core_only = Plugins(autoload=False)
    for scheme, dist in _KNOWN_DISTRIBUTIONS.items():
        extra = _EXTRAS[dist]
        assert _expand(extra) == {dist}, (scheme, extra)
        with pytest.raises(UnknownBrokerScheme) as info:
            core_only.adapters.get(scheme)
        assert f"pip install 'ackwise[{extra}]'" in str(info.value), scheme


@pytest.mark.parametrize("scheme", ["postgresql", "postgres"])
def test_a_postgresql_store_or_lock_without_the_adapter_names_the_extra_in_one_line(
    scheme: str,
) -> None:
    # PostgreSQL's stores and lock are ackwise-postgresql's: with core alone, every way to ask
    # for one says what to install.
    core_only = Plugins(autoload=False)
    url = f"{scheme}://app:s3cret@db.internal/shop"
    fix = "pip install 'ackwise[postgresql]'"
    for opener in (
        ackwise.open_result_store,
        ackwise.open_idempotency_store,
        ackwise.open_worker_registry,
        ackwise.open_lock,
    ):
        with pytest.raises(ConfigurationError) as info:
            opener(url, core_only)
        message = str(info.value)
        assert fix in message and "\n" not in message and "s3cret" not in message, opener
    for option in ("result_store", "idempotency_store", "worker_registry"):
        with pytest.raises(ConfigurationError) as info:
            ackwise.App("shop", broker="memory://", plugins=core_only, **{option: url})
        message = str(info.value)
        assert fix in message and "\n" not in message and "s3cret" not in message, option


# -- metadata -----------------------------------------------------------------------------------


@pytest.mark.parametrize("member", sorted(PROJECTS))
def test_classifiers_name_the_python_versions_and_no_license(member: str) -> None:
    project = PROJECTS[member]["project"]
    classifiers = project["classifiers"]
    # PyPI refuses a License classifier beside a license expression (PEP 639)
    assert not [c for c in classifiers if c.startswith("License ::")]
    assert project["requires-python"] == ">=3.11"
    pythons = [c.rsplit(" ", 1)[1] for c in classifiers if re.search(r":: 3\.\d+$", c)]
    assert pythons == ["3.11", "3.12", "3.13"]
    assert any(c.startswith("Development Status ::") for c in classifiers)
    assert "Typing :: Typed" in classifiers
    for package in PROJECTS[member]["tool"]["hatch"]["build"]["targets"]["wheel"]["packages"]:
        assert (ROOT / member / package / "py.typed").is_file(), package


@pytest.mark.parametrize("member", sorted(PROJECTS))
def test_project_urls_are_the_sites_and_the_documentation_page_exists(member: str) -> None:
    urls = PROJECTS[member]["project"]["urls"]
    assert urls["Homepage"] == SITE
    assert urls["Repository"] == REPO
    assert urls["Issues"] == f"{REPO}/issues"
    assert urls["Changelog"] == f"{REPO}/blob/main/CHANGELOG.md"
    assert (ROOT / "CHANGELOG.md").is_file()
    assert urls["Documentation"].startswith(SITE)
    assert _docs_page(urls["Documentation"]) is not None, urls["Documentation"]


# -- READMEs ------------------------------------------------------------------------------------

_LINK = re.compile(r"(?<!!)\[[^\]]*\]\(([^)\s]+)\)")
_FENCE = re.compile(r"^```.*?^```", re.M | re.S)


def _docs_page(url: str) -> Path | None:
    """The docs/ page a URL of the documentation site shows, or None."""
    path = url.removeprefix(SITE).split("#", 1)[0].strip("/")
    for candidate in (f"{path}.md", f"{path}/index.md") if path else ("index.md",):
        if (ROOT / "docs" / candidate).is_file():
            return ROOT / "docs" / candidate
    return None


def _anchors(page: Path) -> set[str]:
    slug = slugify(case="lower")
    text = _FENCE.sub("", page.read_text(encoding="utf-8"))
    headings = re.findall(r"^#{1,6} (.+)$", text, re.M)
    return {slug(re.sub(r"[`*]|\[([^\]]*)\]\([^)]*\)", r"\1", h).strip(), "-") for h in headings}


@pytest.mark.parametrize("member", sorted(PROJECTS))
def test_each_distribution_has_a_readme_of_its_own_whose_links_work_on_pypi(member: str) -> None:
    project = PROJECTS[member]["project"]
    assert project["readme"] == "README.md"
    text = (ROOT / member / "README.md").read_text(encoding="utf-8")
    assert text.startswith(f"# {project['name']}")
    assert "See the project README" not in text
    prose = _FENCE.sub("", text)
    assert "pip install" in text, "an install line"
    assert "```python" in text, "a minimal example"
    links = _LINK.findall(prose)
    assert links, "links to the documentation"
    for target in links:
        # PyPI shows the README without the repository around it: relative links break there
        assert target.startswith("https://"), f"{member}/README.md: relative link {target}"
        if target.startswith(SITE):
            page = _docs_page(target)
            assert page is not None, f"{member}/README.md: no page for {target}"
            if "#" in target:
                assert target.split("#", 1)[1] in _anchors(page), target
        elif target.startswith(f"{REPO}/blob/main/") or target.startswith(f"{REPO}/tree/main/"):
            path = target.split("/main/", 1)[1]
            assert (ROOT / path).exists(), f"{member}/README.md: {path} does not exist"
