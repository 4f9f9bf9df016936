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
from typing import TYPE_CHECKING, Any, ClassVar, Generic, TypeVar

from ackwise.errors import ConfigurationError, UnknownBrokerScheme

if TYPE_CHECKING:
    from ackwise.contract._spi import Adapter
    from ackwise.stores._locks import LeaderLock

__all__ = ["AdapterEntry", "AdapterRegistry", "LockEntry", "LockRegistry"]


# Where a scheme that is not installed usually comes from, for the error message.
_KNOWN_DISTRIBUTIONS = {
    "redis": "ackwise-redis",
    "rediss": "ackwise-redis",
    "unix": "ackwise-redis",
    "redis+cluster": "ackwise-redis",
    "rediss+cluster": "ackwise-redis",
    "redis+sentinel": "ackwise-redis",
    "rediss+sentinel": "ackwise-redis",
    "amqp": "ackwise-rabbitmq",
    "amqps": "ackwise-rabbitmq",
    "sqs": "ackwise-sqs",
    "postgresql": "ackwise-postgresql",
    "postgres": "ackwise-postgresql",
    "nats": "ackwise-nats",
    "nats+tls": "ackwise-nats",
}
# The extra of ackwise that installs each (core/pyproject.toml; tests/test_packaging.py checks).
_EXTRAS = {
    "ackwise-redis": "redis",
    "ackwise-rabbitmq": "rabbitmq",
    "ackwise-sqs": "sqs",
    "ackwise-postgresql": "postgresql",
    "ackwise-nats": "nats",
}


@dataclass(frozen=True)
class _Entry:
    """One registered class: a URL scheme and where the class lives (``"module:Class"``)."""

    #: What the class is, for messages.
    what: ClassVar[str] = ""

    scheme: str
    import_path: str
    distribution: str
    plugin: str

    def _load(self, base: type) -> Any:
        """Import the class, which must subclass ``base``; errors name the plugin's part."""
        module_name, _, attr = self.import_path.partition(":")
        try:
            cls = getattr(importlib.import_module(module_name), attr)
        except (ImportError, AttributeError) as exc:
            raise ConfigurationError(
                f"{self.what} for scheme {self.scheme!r} ({self.import_path}, from "
                f"{self.distribution}) cannot be imported: {exc}"
            ) from exc
        if not (isinstance(cls, type) and issubclass(cls, base)):
            raise ConfigurationError(
                f"{self.import_path} ({self.what} for scheme {self.scheme!r}) is not an "
                f"ackwise.{base.__name__} subclass"
            )
        return cls


@dataclass(frozen=True)
class AdapterEntry(_Entry):
    """One registered adapter."""

    what: ClassVar[str] = "adapter"

    def load(self) -> type[Adapter]:
        """Import the adapter class."""
        from ackwise.contract._spi import Adapter

        cls: type[Adapter] = self._load(Adapter)
        return cls


@dataclass(frozen=True)
class LockEntry(_Entry):
    """One registered lock backend."""

    what: ClassVar[str] = "lock backend"

    def load(self) -> type[LeaderLock]:
        """Import the backend class."""
        from ackwise.stores._locks import LeaderLock

        cls: type[LeaderLock] = self._load(LeaderLock)
        return cls


E = TypeVar("E", bound=_Entry)


class _Registry(Generic[E]):
    """Scheme -> entry, filled by plugins; knows which plugin is registering."""

    entry_type: type[E]
    #: Appended to the error for a scheme registered twice.
    twice_hint = ""

    def __init__(self) -> None:
        self._current_plugin = "?"
        self._entries: dict[str, E] = {}

    @contextmanager
    def registering(self, plugin: str) -> Iterator[None]:
        """What is added inside is recorded as registered by ``plugin``."""
        self._current_plugin = plugin
        try:
            yield
        finally:
            self._current_plugin = "?"

    def add(self, scheme: str, import_path: str, *, distribution: str = "?") -> None:
        """Register ``import_path`` (``"module:Class"``) for URLs starting ``scheme://``.

        :raises ConfigurationError: the path is malformed, or another plugin registered the
            same scheme.
        """
        what = self.entry_type.what
        scheme = scheme.lower()
        if ":" not in import_path:
            raise ConfigurationError(
                f"{what} import path {import_path!r} for scheme {scheme!r} must look like "
                "'package.module:ClassName'"
            )
        if scheme in self._entries:
            other = self._entries[scheme]
            raise ConfigurationError(
                f"{what} scheme {scheme!r} is registered twice: by {other.plugin} "
                f"({other.import_path}) and by {self._current_plugin} ({import_path})"
                + self.twice_hint
            )
        self._entries[scheme] = self.entry_type(
            scheme, import_path, distribution, self._current_plugin
        )

    def schemes(self) -> list[str]:
        return sorted(self._entries)

    def entries(self) -> list[E]:
        return [self._entries[s] for s in self.schemes()]


class AdapterRegistry(_Registry[AdapterEntry]):
    """What ``ackwise_register_adapters`` hooks fill in (adapters, idempotency and result
    stores)."""

    entry_type = AdapterEntry
    twice_hint = "; uninstall one, or block one with ACKWISE_PLUGINS_BLOCK"

    def __init__(self) -> None:
        super().__init__()
        #: Store classes by kind, then scheme: (import path, plugin).
        self._stores: dict[str, dict[str, tuple[str, str]]] = {
            "idempotency": {},
            "result": {},
            "rate limit": {},
            "worker registry": {},
        }

    def add_idempotency_store(self, scheme: str, import_path: str) -> None:
        """Register an :class:`ackwise.IdempotencyStore` class for ``scheme://`` URLs (lazy)."""
        self._add_store("idempotency", scheme, import_path)

    def idempotency_store(self, scheme: str) -> type[Any] | None:
        """The store class for ``scheme``, or ``None`` when no plugin provides one."""
        return self.store_class("idempotency", scheme)

    def idempotency_schemes(self) -> list[str]:
        """The URL schemes some plugin provides an idempotency store for, sorted."""
        return sorted(self._stores["idempotency"])

    def add_result_store(self, scheme: str, import_path: str) -> None:
        """Register an :class:`ackwise.ResultStore` class for ``scheme://`` URLs (lazy)."""
        self._add_store("result", scheme, import_path)

    def result_store(self, scheme: str) -> type[Any] | None:
        """The result store class for ``scheme``, or ``None`` when no plugin provides one."""
        return self.store_class("result", scheme)

    def result_schemes(self) -> list[str]:
        """The URL schemes some plugin provides a result store for, sorted."""
        return sorted(self._stores["result"])

    def add_rate_limiter(self, scheme: str, import_path: str) -> None:
        """Register an :class:`ackwise.RateLimiter` class for ``scheme://`` URLs (lazy)."""
        self._add_store("rate limit", scheme, import_path)

    def rate_limiter(self, scheme: str) -> type[Any] | None:
        """The rate limiter class for ``scheme``, or ``None`` when no plugin provides one."""
        return self.store_class("rate limit", scheme)

    def add_worker_registry(self, scheme: str, import_path: str) -> None:
        """Register an :class:`ackwise.WorkerRegistry` class for ``scheme://`` URLs (lazy)."""
        self._add_store("worker registry", scheme, import_path)

    def worker_registry(self, scheme: str) -> type[Any] | None:
        """The worker registry class for ``scheme``, or ``None`` when no plugin provides one."""
        return self.store_class("worker registry", scheme)

    def store_schemes(self, kind: str) -> list[str]:
        """The schemes with a ``kind`` (``idempotency``, ``result``, ``rate limit``, ``worker
        registry``) store."""
        return sorted(self._stores[kind])

    def _add_store(self, kind: str, scheme: str, import_path: str) -> None:
        stores, scheme = self._stores[kind], scheme.lower()
        if scheme in stores:
            raise ConfigurationError(
                f"{kind} store scheme {scheme!r} is registered twice: by "
                f"{stores[scheme][1]} and by {self._current_plugin}"
            )
        stores[scheme] = (import_path, self._current_plugin)

    def store_class(self, kind: str, scheme: str) -> type[Any] | None:
        """The ``kind`` (``idempotency``, ``result``, ``rate limit``) store class for
        ``scheme``, or ``None``."""
        entry = self._stores[kind].get(scheme.lower())
        if entry is None:
            return None
        module_name, _, attr = entry[0].partition(":")
        try:
            cls: type[Any] = getattr(importlib.import_module(module_name), attr)
        except (ImportError, AttributeError) as exc:
            raise ConfigurationError(
                f"{kind} store for {scheme!r} ({entry[0]}) cannot be imported: {exc}"
            ) from exc
        return cls

    def get(self, scheme: str) -> AdapterEntry:
        """Return the entry for ``scheme``; raise :class:`UnknownBrokerScheme` naming the fix."""
        try:
            return self._entries[scheme.lower()]
        except KeyError:
            raise UnknownBrokerScheme(scheme, self.schemes(), self.install_hint(scheme)) from None

    def install_hint(self, scheme: str) -> str | None:
        """What to install for ``scheme`` when no installed adapter serves it and it is one of
        the adapter distributions' (``install ackwise-postgresql (pip install
        'ackwise[postgresql]')``): the fix named by every error about a store, lock or broker
        of such a scheme.  ``None`` otherwise."""
        if scheme.lower() in self._entries:
            return None
        dist = _KNOWN_DISTRIBUTIONS.get(scheme.lower())
        return f"install {dist} (pip install 'ackwise[{_EXTRAS[dist]}]')" if dist else None


class LockRegistry(_Registry[LockEntry]):
    """What ``ackwise_register_lock_backends`` hooks fill in."""

    entry_type = LockEntry

    def get(self, scheme: str, install: str | None = None) -> LockEntry:
        """The entry for ``scheme``; an error naming the installed schemes when there is none
        (and ``install``, what to install for it: :meth:`AdapterRegistry.install_hint`)."""
        try:
            return self._entries[scheme.lower()]
        except KeyError:
            fix = "pass --lock with a URL of one of those schemes"
            if install is None:
                hint = f"no installed plugin provides a leader lock for it; {fix}"
            else:
                hint = f"{install}, or {fix}"
            raise UnknownBrokerScheme(scheme, self.schemes(), hint) from None
