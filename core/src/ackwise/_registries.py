"""The registries that plugins fill in: adapters and idempotency stores, lock backends.

Each entry names its class by import path; the class is imported only when a URL of its
scheme is opened.  A registry knows which plugin is registering (see
:meth:`Plugins <ackwise.Plugins>`), so a scheme registered twice names both plugins.
"""

from __future__ import annotations

import importlib
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from ackwise.errors import ConfigurationError, UnknownBrokerScheme

if TYPE_CHECKING:
    from ackwise._locks import LeaderLock
    from ackwise._spi import Adapter

__all__ = ["AdapterEntry", "AdapterRegistry", "LockEntry", "LockRegistry"]


class _Registry:
    def __init__(self) -> None:
        self._current_plugin = "?"

    @contextmanager
    def registering(self, plugin: str) -> Iterator[None]:
        """What is added inside is recorded as registered by ``plugin``."""
        self._current_plugin = plugin
        try:
            yield
        finally:
            self._current_plugin = "?"


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

        cls: type[Adapter] = _import_class(self, Adapter, "adapter", "scheme")
        return cls


class AdapterRegistry(_Registry):
    """What ``ackwise_register_adapters`` hooks fill in."""

    def __init__(self) -> None:
        super().__init__()
        self._entries: dict[str, AdapterEntry] = {}
        self._stores: dict[str, tuple[str, str]] = {}  # scheme -> (import path, plugin)

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


@dataclass(frozen=True)
class LockEntry:
    """One registered lock backend: a URL scheme and where its class lives."""

    scheme: str
    import_path: str
    distribution: str
    plugin: str

    def load(self) -> type[LeaderLock]:
        """Import the backend class."""
        from ackwise._locks import LeaderLock

        cls: type[LeaderLock] = _import_class(self, LeaderLock, "lock backend", "lock scheme")
        return cls


class LockRegistry(_Registry):
    """What ``ackwise_register_lock_backends`` hooks fill in."""

    def __init__(self) -> None:
        super().__init__()
        self._entries: dict[str, LockEntry] = {}

    def add(self, scheme: str, import_path: str, *, distribution: str = "?") -> None:
        """Register ``import_path`` (``"module:Class"``) as the lock backend for ``scheme://``.

        :raises ConfigurationError: the path is malformed or the scheme is registered twice.
        """
        scheme = scheme.lower()
        if ":" not in import_path:
            raise ConfigurationError(
                f"lock backend import path {import_path!r} for scheme {scheme!r} must look "
                "like 'package.module:ClassName'"
            )
        if scheme in self._entries:
            other = self._entries[scheme]
            raise ConfigurationError(
                f"lock scheme {scheme!r} is registered twice: by {other.plugin} "
                f"({other.import_path}) and by {self._current_plugin} ({import_path})"
            )
        self._entries[scheme] = LockEntry(scheme, import_path, distribution, self._current_plugin)

    def schemes(self) -> list[str]:
        return sorted(self._entries)

    def get(self, scheme: str) -> LockEntry:
        """The entry for ``scheme``; an error naming the installed schemes when there is none."""
        try:
            return self._entries[scheme.lower()]
        except KeyError:
            raise UnknownBrokerScheme(
                scheme,
                self.schemes(),
                "no installed plugin provides a leader lock for it; pass --lock with a "
                "URL of one of those schemes",
            ) from None


def _import_class(entry: AdapterEntry | LockEntry, base: type, what: str, scheme: str) -> Any:
    """Import ``entry``'s class, which must subclass ``base``; errors name the plugin's part."""
    module_name, _, attr = entry.import_path.partition(":")
    try:
        cls = getattr(importlib.import_module(module_name), attr)
    except (ImportError, AttributeError) as exc:
        raise ConfigurationError(
            f"{what} for scheme {entry.scheme!r} ({entry.import_path}, from "
            f"{entry.distribution}) cannot be imported: {exc}"
        ) from exc
    if not (isinstance(cls, type) and issubclass(cls, base)):
        raise ConfigurationError(
            f"{entry.import_path} ({scheme} {entry.scheme!r}) is not an "
            f"ackwise.{base.__name__} subclass"
        )
    return cls
