"""Plugin loading: registrar hooks, duplicate schemes, environment switches, lifecycle hooks."""

from __future__ import annotations

import ast
import json
import subprocess
import sys
import uuid
from pathlib import Path

import pytest

import ackwise
from ackwise import App, Plugins, hookimpl
from ackwise.errors import ConfigurationError
from ackwise.testing import run_worker

ROOT = Path(__file__).resolve().parents[1]


def test_builtin_adapters_register_through_the_hook():
    plugins = Plugins(autoload=False)
    assert plugins.adapters.schemes() == ["memory", "sqlite"]
    entry = plugins.adapters.get("sqlite")
    assert (
        entry.plugin == "ackwise"
        and entry.import_path == "ackwise.backends.sqlite._adapter:SQLiteAdapter"
    )


def test_adapter_import_is_lazy():
    code = (
        "import sys, ackwise; ackwise.get_plugins().adapters.schemes(); "
        "print('ackwise.backends.sqlite._adapter' in sys.modules)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


def test_duplicate_scheme_is_an_error_naming_both_plugins():
    class Dup:
        @hookimpl
        def ackwise_register_adapters(self, registry):
            registry.add("sqlite", "elsewhere:Other", distribution="ackwise-dup")

    plugins = Plugins(autoload=False)
    plugins.register(Dup(), name="dup-plugin")
    with pytest.raises(ConfigurationError, match="registered twice") as info:
        plugins.adapters  # noqa: B018
    assert "by ackwise" in str(info.value) and "by dup-plugin" in str(info.value)


def test_third_party_adapter_is_usable_by_url():
    class Third:
        @hookimpl
        def ackwise_register_adapters(self, registry):
            registry.add(
                "mem2", "ackwise.backends.memory._adapter:MemoryAdapter", distribution="third"
            )

    plugins = Plugins(autoload=False)
    plugins.register(Third(), name="third")
    app = App("x", broker="mem2://shared", plugins=plugins)
    assert app.adapter_class.__name__ == "MemoryAdapter"


def test_bad_import_path_is_a_clear_error():
    class Bad:
        @hookimpl
        def ackwise_register_adapters(self, registry):
            registry.add("nope", "no_such_module_xyz:Adapter", distribution="ackwise-nope")

    plugins = Plugins(autoload=False)
    plugins.register(Bad(), name="bad")
    with pytest.raises(ConfigurationError, match=r"from ackwise-nope.*cannot be imported"):
        App("x", broker="nope://", plugins=plugins)


def test_environment_switches(monkeypatch):
    monkeypatch.setenv("ACKWISE_PLUGINS_BLOCK", "ackwise")
    assert Plugins(autoload=False).adapters.schemes() == []
    monkeypatch.delenv("ACKWISE_PLUGINS_BLOCK")
    monkeypatch.setenv("ACKWISE_DISABLE_PLUGIN_AUTOLOAD", "1")
    plugins = Plugins()
    assert plugins.names() == ["ackwise"]
    code = "import ackwise; ackwise.Plugins().adapters.schemes()"
    out = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        check=True,
        env={**__import__("os").environ, "ACKWISE_PLUGINS_TRACE": "1"},
    )
    assert "ackwise_register_adapters" in out.stderr


def test_plugins_named_in_the_environment_are_registered(monkeypatch, tmp_path):
    (tmp_path / "extra_plugin_xyz.py").write_text(
        "from ackwise import hookimpl\n"
        "@hookimpl\n"
        "def ackwise_register_adapters(registry):\n"
        "    registry.add('extra', 'ackwise.backends.memory._adapter:MemoryAdapter', distribution='extra')\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setenv("ACKWISE_PLUGINS", "extra_plugin_xyz")
    assert "extra" in Plugins(autoload=False).adapters.schemes()
    monkeypatch.setenv("ACKWISE_PLUGINS", "no_such_plugin_xyz")
    with pytest.raises(ConfigurationError, match="ACKWISE_PLUGINS names 'no_such_plugin_xyz'"):
        Plugins(autoload=False)


def test_lifecycle_hooks_reach_plugins_and_cost_nothing_when_absent():
    events = []

    class Observer:
        @hookimpl
        def ackwise_task_started(self, task, message_id, attempt, queue):
            events.append(("started", task))

        @hookimpl
        def ackwise_task_succeeded(self, task, message_id, attempt, duration):
            events.append(("succeeded", task))

        @hookimpl
        def ackwise_task_dead_lettered(self, task, message_id, queue, reason):
            events.append(("dead_lettered", reason))

    plugins = Plugins(autoload=False)
    assert plugins.emitter("ackwise_task_started") is None
    plugins.register(Observer(), name="observer")
    app = App("hooks", broker=f"memory://{uuid.uuid4().hex}", plugins=plugins)

    @app.task(name="ok")
    def ok():
        pass

    @app.task(name="bad")
    def bad():
        raise RuntimeError("x")

    ok.delay()
    bad.delay()
    with run_worker(app) as w:
        w.join()
    assert ("started", "ok") in events and ("succeeded", "ok") in events
    assert ("dead_lettered", "failed") in events


def test_every_hookspec_is_documented():
    from ackwise.plugins import _hookspecs

    doc = (ROOT / "docs" / "hooks.md").read_text()
    names = [n for n in dir(_hookspecs) if n.startswith("ackwise_")]
    assert names
    for name in names:
        assert f"`{name}`" in doc, f"hook {name} is not documented in docs/hooks.md"


def test_cli_lists_adapters_with_capabilities():
    out = subprocess.run(
        [sys.executable, "-m", "ackwise", "adapters", "--json"],
        capture_output=True,
        text=True,
        check=True,
    )
    data = {item["scheme"]: item for item in json.loads(out.stdout)}
    assert set(data) >= {"memory", "sqlite"}
    assert data["sqlite"]["capabilities"]["native_delay"] is True
    assert data["memory"]["capabilities"]["multi_process"] is False


def _private_ackwise_imports(path: Path) -> list[str]:
    tree = ast.parse(path.read_text())
    bad = []
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module:
            mod = node.module
            if mod.startswith("ackwise.") and mod.split(".")[1].startswith("_"):
                bad.append(f"{path}:{node.lineno} from {mod}")
        elif isinstance(node, ast.Import):
            for alias in node.names:
                parts = alias.name.split(".")
                if parts[0] == "ackwise" and len(parts) > 1 and parts[1].startswith("_"):
                    bad.append(f"{path}:{node.lineno} import {alias.name}")
    return bad


def test_adapters_and_contrib_import_only_public_ackwise_names():
    roots = [ROOT / "contrib", ROOT / "adapters"]
    files = [p for r in roots if r.exists() for p in r.rglob("*.py")]
    assert files, "expected at least the conformance package"
    bad = [b for p in files for b in _private_ackwise_imports(p)]
    assert not bad, "private ackwise modules imported outside core:\n" + "\n".join(bad)


def test_public_api_is_curated():
    assert "Worker" in ackwise.__all__ and "settle" in ackwise.__all__
    for name in ackwise.__all__:
        assert hasattr(ackwise, name)
