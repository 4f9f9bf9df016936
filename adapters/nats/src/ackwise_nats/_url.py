"""Broker URLs for the NATS adapter: parsed and validated before any I/O.

Accepted forms::

    nats://[user:password@]host[:port][?options]      plain TCP (port 4222 by default)
    nats+tls://[user:password@]host[:port][?options]  TLS (the system's trusted CAs)

Options (query string):

``prefix`` (default ``ackwise``)
    first part of every stream, consumer and subject name (letters, digits, ``-``): lets
    several applications share one NATS account.
``ack_wait`` (seconds, default 30)
    the consumers' AckWait: a delivery's lease when a receive asks for exactly this lease
    (then renewed with ``+WPI``); other leases are set per message (see ``_receive``).  It
    also bounds how long a message stays taken when a consumer dies between a pull and the
    lease it sets.
``timeout`` (seconds, default 5)
    how long one request to the server may take.
``connect_timeout`` (seconds, default 2)
``replicas`` (default 1)
    the streams' replicas (a clustered JetStream).
``tls_ca`` (a CA bundle's path)
    ``nats+tls://`` only.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from ackwise.errors import InvalidBrokerURL
from ackwise.spi import BrokerURL

__all__ = ["NatsSettings", "parse_nats_url"]

SCHEMES = ("nats", "nats+tls")
DEFAULT_PORT = 4222
_OPTIONS = ("ack_wait", "connect_timeout", "prefix", "replicas", "timeout", "tls_ca")
_PREFIX = re.compile(r"^[A-Za-z0-9-]{1,32}$")


@dataclass(frozen=True)
class NatsSettings:
    """What the adapter needs from its URL."""

    server: str  # nats://host:port or tls://host:port (nats-py's forms), without credentials
    user: str | None
    password: str | None
    prefix: str
    ack_wait: float
    timeout: float
    connect_timeout: float
    replicas: int
    tls: bool
    tls_ca: str | None

    @property
    def where(self) -> str:
        """The broker for messages: scheme, host and port, never credentials."""
        return f"NATS {self.server}"


def _seconds(url: BrokerURL, key: str, default: float, low: float = 0.001) -> float:
    raw = url.query.get(key)
    if raw is None:
        return default
    try:
        value = float(raw)
    except ValueError:
        value = float("nan")
    if not value >= low or value == float("inf"):
        raise InvalidBrokerURL(
            f"broker URL {url}: option {key}={raw!r} must be a number of seconds >= {low:g}"
        )
    return value


def parse_nats_url(url: BrokerURL) -> NatsSettings:
    """Check ``url`` and return its settings; :class:`InvalidBrokerURL` names what is wrong."""
    if url.scheme not in SCHEMES:
        raise InvalidBrokerURL(f"broker URL {url}: scheme must be nats:// or nats+tls://")
    if not url.host:
        raise InvalidBrokerURL(f"broker URL {url}: no host (expected nats://host:port)")
    if url.path not in ("", "/"):
        raise InvalidBrokerURL(
            f"broker URL {url}: unexpected path {url.path!r} (NATS URLs have none; the "
            "stream names' prefix is the 'prefix' option)"
        )
    unknown = sorted(set(url.query) - set(_OPTIONS))
    if unknown:
        raise InvalidBrokerURL(
            f"broker URL {url}: unknown option(s) {', '.join(unknown)} "
            f"(known: {', '.join(_OPTIONS)})"
        )
    prefix = url.query.get("prefix", "ackwise")
    if not _PREFIX.match(prefix):
        raise InvalidBrokerURL(
            f"broker URL {url}: prefix {prefix!r} must be 1-32 letters, digits or '-'"
        )
    replicas_raw = url.query.get("replicas", "1")
    if not replicas_raw.isdigit() or not 1 <= int(replicas_raw) <= 5:
        raise InvalidBrokerURL(f"broker URL {url}: replicas={replicas_raw!r} must be 1 to 5")
    tls = url.scheme == "nats+tls"
    if "tls_ca" in url.query and not tls:
        raise InvalidBrokerURL(f"broker URL {url}: tls_ca is for nats+tls:// URLs only")
    host = f"[{url.host}]" if ":" in url.host else url.host
    return NatsSettings(
        server=f"{'tls' if tls else 'nats'}://{host}:{url.port or DEFAULT_PORT}",
        user=url.username,
        password=url.password,
        prefix=prefix,
        ack_wait=_seconds(url, "ack_wait", 30.0, low=1.0),
        timeout=_seconds(url, "timeout", 5.0, low=0.1),
        connect_timeout=_seconds(url, "connect_timeout", 2.0, low=0.1),
        replicas=int(replicas_raw),
        tls=tls,
        tls_ca=url.query.get("tls_ca"),
    )
