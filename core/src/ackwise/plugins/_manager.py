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
from typing import TYPE_CHECKING, Any

import pluggy

from ackwise.errors import ConfigurationError
from ackwise.plugins import _hookspecs
from ackwise.plugins._registries import AdapterRegistry, LockRegistry

if TYPE_CHECKING:
    from ackwise.contract._spi import Adapter
    from ackwise.stores._idempotency import IdempotencyStore
    from ackwise.stores._locks import LeaderLock
    from ackwise.stores._presence import WorkerRegistry
    from ackwise.stores._ratelimit import RateLimiter
    from ackwise.stores._results import ResultStore

log = logging.getLogger(__name__)

ENTRY_POINT_GROUP = "ackwise"


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
        from ackwise.plugins import _builtin as builtin

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
            self._fill(self.pm.hook.ackwise_register_adapters, registry)
            self._registry = registry
        return self._registry

    @property
    def lock_backends(self) -> LockRegistry:
        """The leader-lock backends of ``ackwise beat``, by URL scheme."""
        if self._locks is None:
            registry = LockRegistry()
            self._fill(self.pm.hook.ackwise_register_lock_backends, registry)
            self._locks = registry
        return self._locks

    def _fill(self, hook: Any, registry: AdapterRegistry | LockRegistry) -> None:
        """Call ``hook`` one plugin at a time, so that a duplicate names both plugins."""
        plugins = [impl.plugin_name for impl in reversed(hook.get_hookimpls())]
        for name in plugins:
            others = [self.pm.get_plugin(p) for p in plugins if p != name]
            caller = self.pm.subset_hook_caller(hook.name, remove_plugins=others)
            with registry.registering(name):
                caller(registry=registry)

    def add_commands(self, subparsers: Any) -> None:
        """Let every plugin add its subcommands to the ``ackwise`` command line."""
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
        """The names of the registered plugins, sorted."""
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
    from ackwise.contract._spi import BrokerURL

    parsed = BrokerURL.parse(url)
    entry = (plugins or get_plugins()).adapters.get(parsed.scheme)
    cls = entry.load()
    log.debug("broker %s served by %s", parsed, entry.import_path)
    return cls(parsed)


def open_lock(url: str, plugins: object | None = None) -> LeaderLock:
    """Build (not open) the lock backend for ``url``."""
    from ackwise.contract._spi import BrokerURL

    parsed = BrokerURL.parse(url)
    found = plugins if isinstance(plugins, Plugins) else get_plugins()
    entry = found.lock_backends.get(parsed.scheme, found.adapters.install_hint(parsed.scheme))
    return entry.load()(parsed)


def open_store(url: str, plugins: Plugins | None = None) -> IdempotencyStore:
    """Build and open the idempotency store for ``url`` (schemes come from plugins)."""
    from ackwise.contract._spi import BrokerURL

    store: IdempotencyStore = _store_class("idempotency", url, plugins, "idempotency_store")(
        BrokerURL.parse(url)
    )
    store.open()
    return store


def open_result_store(
    url: str, plugins: Plugins | None = None, *, ttl: float | None = None
) -> ResultStore:
    """Build and open the result store for ``url`` (schemes come from plugins)."""
    from ackwise.contract._spi import BrokerURL

    cls = _store_class("result", url, plugins, "result_store")
    parsed = BrokerURL.parse(url)
    store: ResultStore = cls(parsed) if ttl is None else cls(parsed, ttl=ttl)
    store.open()
    return store


def open_rate_limiter(url: str, plugins: Plugins | None = None) -> RateLimiter:
    """Build and open the rate limiter for ``url`` (schemes come from plugins)."""
    from ackwise.contract._spi import BrokerURL

    cls = _store_class("rate limit", url, plugins, "rate_limit_store")
    limiter: RateLimiter = cls(BrokerURL.parse(url))
    limiter.open()
    return limiter


def open_worker_registry(url: str, plugins: Plugins | None = None) -> WorkerRegistry:
    """Build and open the worker registry for ``url`` (schemes come from plugins)."""
    from ackwise.contract._spi import BrokerURL

    cls = _store_class("worker registry", url, plugins, "worker_registry")
    registry: WorkerRegistry = cls(BrokerURL.parse(url))
    registry.open()
    return registry


def _store_class(kind: str, url: str, plugins: Plugins | None, setting: str) -> type[Any]:
    from ackwise.contract._spi import BrokerURL

    registry = (plugins or get_plugins()).adapters
    scheme = BrokerURL.parse(url).scheme
    cls = registry.store_class(kind, scheme)
    if cls is None:
        known = registry.store_schemes(kind)
        install = registry.install_hint(scheme)
        raise ConfigurationError(
            f"no {kind} store for {scheme!r} URLs; known: {', '.join(known)}; "
            + (f"{install}, or " if install else "")
            + f"set App({setting}=URL)"
        )
    return cls
