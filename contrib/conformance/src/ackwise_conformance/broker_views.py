"""The broker under test as a scenario sees it: its URL, its address for a fault proxy, its
restart; and views of it with more URL options, or (embedded brokers) a store of a case's own."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol
from urllib.parse import parse_qsl, quote, urlsplit, urlunsplit

from ackwise import (
    BrokerURL,
    get_plugins,
    open_adapter,
)
from ackwise.errors import ConfigurationError
from ackwise_conformance._urls import address_of, replace_address
from ackwise_conformance.verdicts import NotApplicable

__all__ = [
    "DEFAULT_PREFIX",
    "LEASE",
    "OWN_STORE_SCHEMES",
    "Broker",
    "OwnStore",
    "SimpleBroker",
    "WithOptions",
    "lease_url",
    "own_store",
    "own_store_url",
    "with_lease_options",
    "with_option_values",
    "with_options",
]


class Broker(Protocol):
    """What a scenario needs to know about the broker under test."""

    name: str
    url: str
    host: str | None
    port: int | None

    def url_via(self, host: str, port: int) -> str: ...

    def restart(self) -> None: ...


@dataclass
class SimpleBroker:
    """A broker given by URL only: proxied when the URL names a host and port; no restart."""

    url: str
    name: str = ""
    host: str | None = None
    port: int | None = None
    #: Concurrent cases each get a store of their own (:class:`OwnStore`): ``None`` decides by
    #: the scheme (sqlite, memory); True for another adapter with SQLite's URL form.
    store_per_case: bool | None = None
    #: False where the client reaches more than the URL's address (a Redis Cluster's nodes,
    #: the master the sentinels name): a proxy in front of that one address would cut only
    #: part of its connections, so the connection-cut scenarios are n/a.
    proxied: bool = True

    def __post_init__(self) -> None:
        parsed = BrokerURL.parse(self.url)
        if not self.name:
            self.name = parsed.scheme
        if not self.proxied:
            self.host = self.port = None
        elif self.host is None and parsed.scheme == "sqs":  # the address is its endpoint_url
            self.host, self.port = address_of(self.url)
        elif self.host is None and parsed.host and parsed.port:
            self.host, self.port = parsed.host, parsed.port

    def url_via(self, host: str, port: int) -> str:
        if self.host is None or self.port is None:
            raise NotApplicable(
                f"broker {self.name}: no network address to put a proxy in front of"
                + ("" if self.proxied else " (its client connects to more than the URL's)")
            )
        if BrokerURL.parse(self.url).scheme == "sqs":
            return replace_address(self.url, host, port)
        parts = urlsplit(self.url)
        userinfo, _, _ = parts.netloc.rpartition("@")
        netloc = f"{userinfo}@{host}:{port}" if userinfo else f"{host}:{port}"
        return urlunsplit(parts._replace(netloc=netloc))

    def restart(self) -> None:
        raise NotApplicable(f"broker {self.name}: the suite does not own a broker process")


#: What the names of a run's queues, beat apps and idempotency keys start with by default.
DEFAULT_PREFIX = "conformance-"

#: The workers' lease in the scenarios, before the time scale (see :meth:`Harness.t`).
LEASE = 1.0


def lease_url(url: str, lease: float) -> tuple[str, dict[str, str]]:
    """``url`` with the options its adapter needs for leases of ``lease`` seconds, and the
    options that were added (see :meth:`ackwise.Adapter.lease_options`).

    :raises ConfigurationError: the URL sets one of them to another value.
    """
    wanted = type(open_adapter(url)).lease_options(lease)
    given = dict(parse_qsl(urlsplit(url).query))
    wrong = {k: v for k, v in wanted.items() if k in given and given[k] != v}
    if wrong:
        raise ConfigurationError(
            "the crash scenarios need "
            + ", ".join(f"{k}={v}" for k, v in wrong.items())
            + f" for leases of {lease:g}s, the URL sets "
            + ", ".join(f"{k}={given[k]}" for k in wrong)
            + ": leave them out (the suite sets them) or give those values"
        )
    added = {k: v for k, v in wanted.items() if k not in given}
    return with_options(url, **added), added


def with_options(url: str, **options: object) -> str:
    """``url`` with more query options (appended: the URL's own stay as they are)."""
    extra = "&".join(f"{k}={v}" for k, v in options.items())
    if not extra:
        return url
    return f"{url}{'&' if '?' in url else '?'}{extra}"


def with_option_values(url: str, **options: str) -> str:
    """``url`` with these query options set: one the URL has is replaced, another added."""
    parts = urlsplit(url)
    kept = [p for p in parts.query.split("&") if p and p.partition("=")[0] not in options]
    kept += [f"{k}={quote(v, safe=':')}" for k, v in options.items()]
    return urlunsplit(parts._replace(query="&".join(kept)))


def own_store_url(kind: str, url: str, namespace: str) -> str | None:
    """The URL of the broker's own ``kind`` store (``"worker registry"``, ``"result"``) that
    keeps its records under ``namespace`` where the store has namespaces (its class's
    ``namespace_options``: Redis' key prefix); ``None`` when the broker has no such store."""
    parsed = BrokerURL.parse(url)
    cls = get_plugins().adapters.store_class(kind, parsed.scheme)
    if cls is None:
        return None
    namespaced = getattr(cls, "namespace_options", None)  # a store not built on the ABC
    options: dict[str, str] = namespaced(parsed, namespace) if namespaced is not None else {}
    return with_option_values(url, **options) if options else url


class WithOptions:
    """A broker whose URLs (direct and through a proxy) carry more query options."""

    def __init__(self, broker: Broker, **options: object) -> None:
        self._broker = broker
        self._options = options
        self.url = with_options(broker.url, **options)

    def url_via(self, host: str, port: int) -> str:
        return with_options(self._broker.url_via(host, port), **self._options)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._broker, name)


class OwnStore:
    """An embedded broker on a store of one case's own: the same adapter and URL options, the
    SQLite file in ``directory`` (``memory://``: a name of its own).

    Concurrent cases on one SQLite file would share its write lock: a worker one case freezes
    with SIGSTOP, or thirty processes writing at once, would make another case's processes
    wait past their busy timeout -- contention between cases, not the contract of either.
    """

    def __init__(self, broker: Broker, directory: Path) -> None:
        self._broker = broker
        parts = urlsplit(broker.url)
        query = f"?{parts.query}" if parts.query else ""
        if parts.scheme != "memory":  # SQLite's form: scheme:////absolute/path.db
            directory.mkdir(parents=True, exist_ok=True)
            name = Path(parts.path).name or "broker.db"
            self.url = f"{parts.scheme}:///{directory.resolve() / name}{query}"
        else:
            self.url = f"memory://{parts.netloc}-{directory.name}{query}"

    def url_via(self, host: str, port: int) -> str:
        return self._broker.url_via(host, port)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._broker, name)


#: Embedded brokers whose URL form the suite knows (another embedded adapter's cases share
#: its one store).
OWN_STORE_SCHEMES = ("sqlite", "memory")


def own_store(broker: Broker, directory: Path) -> Broker:
    """:class:`OwnStore` in ``directory`` for a SQLite or memory broker (or one whose
    ``store_per_case`` says so); else ``broker``."""
    wanted = getattr(broker, "store_per_case", None)
    if wanted is None:
        wanted = urlsplit(broker.url).scheme in OWN_STORE_SCHEMES
    return OwnStore(broker, directory) if wanted else broker


def with_lease_options(broker: Broker, lease: float) -> Broker:
    """``broker``, its URLs carrying what :func:`lease_url` adds (raises as it does)."""
    _, added = lease_url(broker.url, lease)
    return WithOptions(broker, **added) if added else broker
