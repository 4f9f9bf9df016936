"""Plugin loading and the adapter registry.

Plugins are found through the entry-point group ``ackwise``; built-in adapters come through the
same hook (``ackwise.plugin``).  No other module touches ``pm.hook``: they use :class:`Plugins`.

Environment switches:

``ACKWISE_DISABLE_PLUGIN_AUTOLOAD=1``
    load no entry points (the built-in adapters stay registered).
``ACKWISE_PLUGINS_BLOCK=name1,name2``
    never load these entry-point names.
``ACKWISE_PLUGINS_TRACE=1``
    print every hook call to standard error.
``ACKWISE_PLUGINS=module1,module2``
    also register these importable modules as plugins (loaded even without autoload; handy
    for worker processes of a test suite, like ``PYTEST_PLUGINS``).
"""

from __future__ import annotations

import importlib
import logging
import os
import sys
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import pluggy

from ackwise import _hookspecs
from ackwise.errors import ConfigurationError, UnknownBrokerScheme

if TYPE_CHECKING:
    from ackwise._locks import LockRegistry
    from ackwise._spi import Adapter

log = logging.getLogger(__name__)

ENTRY_POINT_GROUP = "ackwise"

# Where a scheme that is not installed usually comes from, for the error message.
_KNOWN_DISTRIBUTIONS = {
    "redis": "ackwise-redis",
    "rediss": "ackwise-redis",
    "unix": "ackwise-redis",
    "amqp": "ackwise-rabbitmq",
    "amqps": "ackwise-rabbitmq",
    "sqs": "ackwise-sqs",
}
_EXTRAS = {"ackwise-redis": "redis", "ackwise-rabbitmq": "rabbitmq", "ackwise-sqs": "sqs"}


@dataclass(frozen=True)
class AdapterEntry:
    """One registered adapter: a scheme and where its class lives."""

    scheme: str
    import_path: str
    distribution: str
    plugin: str

    def load(self) -> type[Adapter]:
        """Import the adapter class."""
        from ackwise._spi import Adapter

        module_name, _, attr = self.import_path.partition(":")
        try:
            module = importlib.import_module(module_name)
            cls = getattr(module, attr)
        except (ImportError, AttributeError) as exc:
            raise ConfigurationError(
                f"adapter for scheme {self.scheme!r} ({self.import_path}, from "
                f"{self.distribution}) cannot be imported: {exc}"
            ) from exc
        if not (isinstance(cls, type) and issubclass(cls, Adapter)):
            raise ConfigurationError(
                f"{self.import_path} (scheme {self.scheme!r}) is not an ackwise.Adapter subclass"
            )
        return cls


class AdapterRegistry:
    """What ``ackwise_register_adapters`` hooks fill in."""

    def __init__(self) -> None:
        self._entries: dict[str, AdapterEntry] = {}
        self._stores: dict[str, tuple[str, str]] = {}  # scheme -> (import path, plugin)
        self._current_plugin = "?"

    def add_idempotency_store(self, scheme: str, import_path: str) -> None:
        """Register an :class:`ackwise.IdempotencyStore` class for ``scheme://`` URLs (lazy)."""
        scheme = scheme.lower()
        if scheme in self._stores:
            raise ConfigurationError(
                f"idempotency store scheme {scheme!r} is registered twice: by "
                f"{self._stores[scheme][1]} and by {self._current_plugin}"
            )
        self._stores[scheme] = (import_path, self._current_plugin)

    def idempotency_store(self, scheme: str) -> type[Any] | None:
        """The store class for ``scheme``, or ``None`` when no plugin provides one."""
        entry = self._stores.get(scheme.lower())
        if entry is None:
            return None
        module_name, _, attr = entry[0].partition(":")
        try:
            cls: type[Any] = getattr(importlib.import_module(module_name), attr)
        except (ImportError, AttributeError) as exc:
            raise ConfigurationError(
                f"idempotency store for {scheme!r} ({entry[0]}) cannot be imported: {exc}"
            ) from exc
        return cls

    def idempotency_schemes(self) -> list[str]:
        return sorted(self._stores)

    def add(self, scheme: str, import_path: str, *, distribution: str = "?") -> None:
        """Register ``import_path`` (``"module:Class"``) for URLs starting ``scheme://``.

        :raises ConfigurationError: another plugin registered the same scheme.
        """
        scheme = scheme.lower()
        if ":" not in import_path:
            raise ConfigurationError(
                f"adapter import path {import_path!r} for scheme {scheme!r} must look like "
                "'package.module:ClassName'"
            )
        if scheme in self._entries:
            other = self._entries[scheme]
            raise ConfigurationError(
                f"broker scheme {scheme!r} is registered twice: by {other.plugin} "
                f"({other.import_path}) and by {self._current_plugin} ({import_path}); "
                "uninstall one, or block one with ACKWISE_PLUGINS_BLOCK"
            )
        self._entries[scheme] = AdapterEntry(
            scheme, import_path, distribution, self._current_plugin
        )

    def schemes(self) -> list[str]:
        return sorted(self._entries)

    def entries(self) -> list[AdapterEntry]:
        return [self._entries[s] for s in self.schemes()]

    def get(self, scheme: str) -> AdapterEntry:
        """Return the entry for ``scheme``; raise :class:`UnknownBrokerScheme` naming the fix."""
        try:
            return self._entries[scheme.lower()]
        except KeyError:
            dist = _KNOWN_DISTRIBUTIONS.get(scheme.lower())
            hint = None
            if dist:
                hint = f"install {dist} (pip install 'ackwise[{_EXTRAS[dist]}]')"
            raise UnknownBrokerScheme(scheme, self.schemes(), hint) from None


class Plugins:
    """The one facade over the plugin manager."""

    def __init__(self, *, autoload: bool | None = None) -> None:
        self.pm = pluggy.PluginManager("ackwise")
        self.pm.add_hookspecs(_hookspecs)
        if autoload is None:
            autoload = os.environ.get("ACKWISE_DISABLE_PLUGIN_AUTOLOAD", "") in ("", "0")
        for name in filter(None, os.environ.get("ACKWISE_PLUGINS_BLOCK", "").split(",")):
            self.pm.set_blocked(name.strip())
        self._tracing = os.environ.get("ACKWISE_PLUGINS_TRACE", "") not in ("", "0")
        if self._tracing:
            self.pm.trace.root.setwriter(sys.stderr.write)
            self.pm.enable_tracing()
        from ackwise import plugin as builtin

        # Registered under its entry-point name, so the entry point itself is skipped.
        if not self.pm.is_blocked("ackwise"):
            self.pm.register(builtin, name="ackwise")
        if autoload:
            self.pm.load_setuptools_entrypoints(ENTRY_POINT_GROUP)
        for module_name in filter(None, os.environ.get("ACKWISE_PLUGINS", "").split(",")):
            module_name = module_name.strip()
            if self.pm.get_plugin(module_name) is not None or self.pm.is_blocked(module_name):
                continue
            try:
                module = importlib.import_module(module_name)
            except ImportError as exc:
                raise ConfigurationError(
                    f"ACKWISE_PLUGINS names {module_name!r}, which cannot be imported: {exc}"
                ) from exc
            self.pm.register(module, name=module_name)
        self.pm.check_pending()
        self._registry: AdapterRegistry | None = None
        self._locks: LockRegistry | None = None

    def register(self, plugin: object, name: str | None = None) -> None:
        """Register a plugin object (module or instance) by hand."""
        self.pm.register(plugin, name=name)
        self.pm.check_pending()
        self._registry = None
        self._locks = None

    @property
    def adapters(self) -> AdapterRegistry:
        if self._registry is None:
            registry = AdapterRegistry()
            # Called one implementation at a time so a duplicate names both plugins.
            for impl in reversed(self.pm.hook.ackwise_register_adapters.get_hookimpls()):
                if self._tracing:
                    sys.stderr.write(f"ackwise_register_adapters [{impl.plugin_name}]\n")
                registry._current_plugin = impl.plugin_name
                impl.function(registry=registry)
            registry._current_plugin = "?"
            self._registry = registry
        return self._registry

    @property
    def lock_backends(self) -> LockRegistry:
        """The leader-lock backends of ``ackwise beat``, by URL scheme."""
        if self._locks is None:
            from ackwise._locks import LockRegistry

            registry = LockRegistry()
            for impl in reversed(self.pm.hook.ackwise_register_lock_backends.get_hookimpls()):
                registry._current_plugin = impl.plugin_name
                impl.function(registry=registry)
            registry._current_plugin = "?"
            self._locks = registry
        return self._locks

    def add_commands(self, subparsers: Any) -> None:
        self.pm.hook.ackwise_add_commands(subparsers=subparsers)

    def emitter(self, hook: str) -> Callable[..., Any] | None:
        """Return a caller for lifecycle ``hook``, or ``None`` when no plugin implements it.

        The worker asks once at start, so no per-message call goes through pluggy unless a
        plugin wants it.
        """
        caller = getattr(self.pm.hook, hook)
        if not caller.get_hookimpls():
            return None
        return caller  # type: ignore[no-any-return]

    def names(self) -> list[str]:
        return sorted(name for name, _ in self.pm.list_name_plugin())


_default: Plugins | None = None
_lock = threading.RLock()  # re-entered only to report a nested call as an error
_loading = False


def get_plugins() -> Plugins:
    """Return the process-wide plugin manager, loading plugins on first use."""
    global _default, _loading
    if _default is None:
        with _lock:
            if _default is None:
                if _loading:
                    raise ConfigurationError(
                        "get_plugins() was called while plugins are being loaded (by a plugin "
                        "module at import time?): call it lazily, inside a function"
                    )
                _loading = True
                try:
                    _default = Plugins()
                finally:
                    _loading = False
    return _default


def reset_plugins() -> None:
    """Forget the process-wide plugin manager (tests; after changing the environment)."""
    global _default
    with _lock:
        _default = None


def open_adapter(url: str, plugins: Plugins | None = None) -> Adapter:
    """Build (not open) the adapter for ``url``."""
    from ackwise._spi import BrokerURL

    parsed = BrokerURL.parse(url)
    entry = (plugins or get_plugins()).adapters.get(parsed.scheme)
    cls = entry.load()
    log.debug("broker %s served by %s", parsed, entry.import_path)
    return cls(parsed)
