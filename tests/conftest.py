"""Fixtures shared by the cross-package tests."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

import ackwise


@pytest.fixture
def plugins_serving() -> Callable[[str, str], ackwise.Plugins]:
    """``make(scheme, "module:Class")``: plugins (no autoload) under which ``scheme://`` URLs
    open that adapter class, for tests of the worker against an adapter of their own."""

    def make(scheme: str, import_path: str) -> ackwise.Plugins:
        class Plugin:
            @ackwise.hookimpl
            def ackwise_register_adapters(self, registry: Any) -> None:
                registry.add(scheme, import_path, distribution="tests")

        plugins = ackwise.Plugins(autoload=False)
        plugins.register(Plugin(), name=f"{scheme}-plugin")
        return plugins

    return make
