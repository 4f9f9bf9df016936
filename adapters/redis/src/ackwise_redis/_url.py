"""Broker URLs for the Redis adapter: parsed and validated before any I/O.

Accepted forms::

    redis://[[username]:password@]host[:port][/db][?options]
    rediss://[[username]:password@]host[:port][/db][?options]      TLS
    unix://[[username]:password@]/path/to/redis.sock[?db=N&options]
    redis+cluster://[[username]:password@]host[:port][?nodes=host:port,...&options]
    redis+sentinel://[[username]:password@]host[:port]/service[/db][?sentinels=host:port,...]

``rediss+cluster://`` and ``rediss+sentinel://`` are the TLS forms (TLS to every node; to
the sentinels too).  A cluster URL names one node to start from (``nodes`` adds more, so
that the adapter can start while that one is down); the adapter reads the slot map from any
of them and follows the cluster from there.  A sentinel URL names one sentinel (``sentinels``
adds more) and the ``service`` (the master's name in the sentinels' configuration); the
credentials are the Redis nodes', ``sentinel_username`` / ``sentinel_password`` the
sentinels' own when they have any.

Options (query string):

``prefix`` (default ``ackwise``)
    first part of every key's hash tag: ``{<prefix>:<queue>}:ready``.  Lets several
    applications share one database.
``strict`` (``true`` / ``false``, default ``false``)
    refuse to open when Redis' ``maxmemory-policy`` is not ``noeviction`` (otherwise a warning).
``socket_timeout``, ``socket_connect_timeout`` (seconds, defaults 10 and 5)
``health_check_interval`` (seconds, default 10; 0 disables)
    a connection idle for longer is PINGed (and reconnected) before it carries a command, so
    a producer's first publish after a Redis restart does not fail.
``client_name``
    shown by ``CLIENT LIST``.
``db``
    the database number, for ``unix://`` URLs (``redis://`` URLs put it in the path).
``ssl_cert_reqs`` (``required`` / ``optional`` / ``none``), ``ssl_ca_certs``,
``ssl_certfile``, ``ssl_keyfile``, ``ssl_check_hostname`` (``true`` / ``false``)
    ``rediss://`` only.
``wait_replicas`` (default 0), ``wait_timeout`` (seconds, default 1)
    after each publish, ``WAIT`` until that many replicas have the message (Redis' replication
    is asynchronous: a primary that dies before its replica copied a message loses it on
    failover).  Fewer replicas within ``wait_timeout`` raise
    :class:`~ackwise.errors.TransientAdapterError` naming how many had it: the message is
    published (on the primary) but not yet safe from a failover.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

from ackwise.errors import InvalidBrokerURL
from ackwise.spi import BrokerURL

__all__ = ["RedisSettings", "parse_redis_url"]

SCHEMES = ("redis", "rediss", "unix")
CLUSTER_SCHEMES = ("redis+cluster", "rediss+cluster")
SENTINEL_SCHEMES = ("redis+sentinel", "rediss+sentinel")
ALL_SCHEMES = SCHEMES + CLUSTER_SCHEMES + SENTINEL_SCHEMES
DEFAULT_PORT = 6379
SENTINEL_PORT = 26379

_COMMON = (
    "client_name",
    "health_check_interval",
    "prefix",
    "socket_connect_timeout",
    "socket_timeout",
    "strict",
    "wait_replicas",
    "wait_timeout",
)
_CLUSTER = ("nodes",)
_SENTINEL = ("sentinels", "sentinel_password", "sentinel_username")
_TLS = ("ssl_ca_certs", "ssl_cert_reqs", "ssl_certfile", "ssl_check_hostname", "ssl_keyfile")
_CERT_REQS = ("required", "optional", "none")
_BOOL = {"true": True, "1": True, "yes": True, "false": False, "0": False, "no": False}
#: What a key prefix may be (``prefix=``).
PREFIX_FORM = re.compile(r"^[A-Za-z0-9_.:-]{1,64}$")
_SERVICE = re.compile(r"^[A-Za-z0-9_.-]{1,128}$")


@dataclass(frozen=True)
class RedisSettings:
    """Everything a :class:`~ackwise_redis.RedisAdapter` needs to connect (no password shown).

    ``scheme`` is the connection's (``redis``, ``rediss`` or ``unix``); ``topology`` says how
    the nodes are found: ``single`` (host and port), ``cluster`` (``nodes``: where to read the
    slot map) or ``sentinel`` (``nodes``: the sentinels, asked for ``service``'s master).
    """

    scheme: str
    host: str
    port: int
    path: str  # unix socket path
    db: int
    username: str | None
    password: str | None = field(repr=False)
    prefix: str = "ackwise"
    strict: bool = False
    socket_timeout: float = 10.0
    socket_connect_timeout: float = 5.0
    health_check_interval: float = 10.0
    client_name: str | None = None
    tls: dict[str, Any] = field(default_factory=dict)
    topology: str = "single"
    nodes: tuple[tuple[str, int], ...] = ()
    service: str = ""
    sentinel_username: str | None = None
    sentinel_password: str | None = field(default=None, repr=False)
    wait_replicas: int = 0
    wait_timeout: float = 1.0

    @property
    def where(self) -> str:
        """Where the broker is, for messages: never the credentials."""
        if self.scheme == "unix":
            return f"unix:{self.path} db {self.db}"
        nodes = ",".join(f"{h}:{p}" for h, p in self.nodes)
        if self.topology == "cluster":
            return f"{self.scheme}+cluster://{nodes}"
        if self.topology == "sentinel":
            return f"{self.scheme}+sentinel://{nodes}/{self.service}/{self.db}"
        return f"{self.scheme}://{self.host}:{self.port}/{self.db}"

    def connection_kwargs(self) -> dict[str, Any]:
        """Keyword arguments for a redis-py connection class."""
        kwargs: dict[str, Any] = {
            "db": self.db,
            "username": self.username,
            "password": self.password,
            "socket_timeout": self.socket_timeout,
            "socket_connect_timeout": self.socket_connect_timeout,
            "client_name": self.client_name,
        }
        if self.scheme == "unix":
            kwargs["path"] = self.path
        else:
            kwargs["host"] = self.host
            kwargs["port"] = self.port
            kwargs["socket_keepalive"] = True
        if self.scheme == "rediss":
            kwargs.update(self.tls)
        return kwargs


def _bad(url: BrokerURL, what: str) -> InvalidBrokerURL:
    return InvalidBrokerURL(f"broker URL {url}: {what}")


def _seconds(url: BrokerURL, name: str, default: float, *, allow_zero: bool = False) -> float:
    raw = url.query.get(name)
    if raw is None:
        return default
    try:
        value = float(raw)
    except ValueError:
        value = -1.0
    low_ok = value >= 0 if allow_zero else value > 0
    if not (low_ok and value <= 86_400):
        bound = ">= 0" if allow_zero else "> 0"
        raise _bad(url, f"{name}={raw!r} must be a number of seconds {bound} and <= 86400")
    return value


def _flag(url: BrokerURL, name: str, default: bool) -> bool:
    raw = url.query.get(name)
    if raw is None:
        return default
    value = _BOOL.get(raw.lower())
    if value is None:
        raise _bad(url, f"{name}={raw!r} must be true or false")
    return value


def _db(url: BrokerURL, raw: str) -> int:
    if not raw.isdigit() or int(raw) > 65_535:
        raise _bad(url, f"database {raw!r} must be a number >= 0 (e.g. redis://host:6379/0)")
    return int(raw)


def _addresses(url: BrokerURL, name: str, default_port: int) -> tuple[tuple[str, int], ...]:
    """``host:port,host:port`` of option ``name`` (none when it is absent)."""
    found = []
    for item in filter(None, (x.strip() for x in url.query.get(name, "").split(","))):
        host, sep, port = item.rpartition(":")
        if not sep:
            host, port = item, str(default_port)
        host = host.strip("[]")
        if not host or not port.isdigit() or not 0 < int(port) < 65_536:
            raise _bad(
                url, f"{name}: {item!r} is not host:port (e.g. {name}=10.0.0.2:{default_port})"
            )
        found.append((host, int(port)))
    return tuple(found)


def parse_redis_url(url: BrokerURL) -> RedisSettings:
    """Validate ``url`` and return its settings; raise :class:`InvalidBrokerURL` naming why."""
    if url.scheme not in ALL_SCHEMES:
        raise _bad(
            url, f"scheme {url.scheme!r} is not served by ackwise-redis ({', '.join(ALL_SCHEMES)})"
        )
    scheme, _, topology = url.scheme.partition("+")
    topology = topology or "single"
    accepted = (
        _COMMON
        + (_TLS if scheme == "rediss" else ())
        + (("db",) if scheme == "unix" else ())
        + (_CLUSTER if topology == "cluster" else ())
        + (_SENTINEL if topology == "sentinel" else ())
    )
    unknown = sorted(set(url.query) - set(accepted))
    if unknown:
        hint = ""
        if scheme != "rediss" and set(unknown) & set(_TLS):
            hint = " (TLS options need a rediss:// URL)"
        elif set(unknown) & set(_CLUSTER + _SENTINEL):
            hint = " (nodes: a redis+cluster:// URL's; sentinels: a redis+sentinel:// URL's)"
        raise _bad(
            url,
            f"unknown redis option(s) {', '.join(map(repr, unknown))}{hint}; accepted options: "
            f"{', '.join(sorted(accepted))}",
        )
    service = ""
    if scheme == "unix":
        if url.host or url.port is not None:
            raise _bad(
                url, "a unix:// URL names a socket path, not a host: unix:///run/redis.sock?db=0"
            )
        if not url.path or url.path == "/":
            raise _bad(url, "no socket path; use unix:///path/to/redis.sock")
        host, port, path = "", 0, url.path
        db = _db(url, url.query["db"]) if "db" in url.query else 0
    else:
        example = {
            "single": f"{scheme}://host:6379/0",
            "cluster": f"{url.scheme}://host:7000?nodes=host2:7001",
            "sentinel": f"{url.scheme}://host:26379/mymaster/0",
        }[topology]
        if not url.host:
            raise _bad(url, f"no host; use {example}")
        host = url.host
        default_port = SENTINEL_PORT if topology == "sentinel" else DEFAULT_PORT
        port = url.port if url.port is not None else default_port
        path = ""
        db_text = url.path.strip("/")
        if topology == "sentinel":
            service, _, db_text = db_text.partition("/")
            if not _SERVICE.match(service):
                raise _bad(
                    url, f"no master name (service) in the path, or not a valid one; use {example}"
                )
        db = _db(url, db_text) if db_text else 0
        if topology == "cluster" and db != 0:
            raise _bad(url, f"Redis Cluster has database 0 only, not {db}; use {example}")
    nodes: tuple[tuple[str, int], ...] = ()
    if topology == "cluster":
        nodes = ((host, port), *_addresses(url, "nodes", DEFAULT_PORT))
    elif topology == "sentinel":
        nodes = ((host, port), *_addresses(url, "sentinels", SENTINEL_PORT))
    wait_replicas = url.query.get("wait_replicas", "0")
    if not wait_replicas.isdigit() or int(wait_replicas) > 100:
        raise _bad(url, f"wait_replicas={wait_replicas!r} must be a number of replicas, 0-100")
    prefix = url.query.get("prefix", "ackwise")
    if not PREFIX_FORM.match(prefix):
        raise _bad(
            url,
            f"prefix={prefix!r} must be 1-64 letters, digits, '_', '.', ':' or '-' (it becomes "
            "part of every key's {hash tag})",
        )
    tls: dict[str, Any] = {}
    if scheme == "rediss":
        reqs = url.query.get("ssl_cert_reqs", "required").lower()
        if reqs not in _CERT_REQS:
            raise _bad(url, f"ssl_cert_reqs={reqs!r} must be one of {', '.join(_CERT_REQS)}")
        tls["ssl_cert_reqs"] = reqs
        for name in ("ssl_ca_certs", "ssl_certfile", "ssl_keyfile"):
            if url.query.get(name):
                tls[name] = url.query[name]
        tls["ssl_check_hostname"] = _flag(url, "ssl_check_hostname", reqs == "required")
    return RedisSettings(
        scheme=scheme,
        host=host,
        port=port,
        path=path,
        db=db,
        username=url.username,
        password=url.password,
        prefix=prefix,
        strict=_flag(url, "strict", False),
        socket_timeout=_seconds(url, "socket_timeout", 10.0),
        socket_connect_timeout=_seconds(url, "socket_connect_timeout", 5.0),
        health_check_interval=_seconds(url, "health_check_interval", 10.0, allow_zero=True),
        client_name=url.query.get("client_name") or None,
        tls=tls,
        topology=topology,
        nodes=nodes,
        service=service,
        sentinel_username=url.query.get("sentinel_username") or None,
        sentinel_password=url.query.get("sentinel_password") or None,
        wait_replicas=int(wait_replicas),
        wait_timeout=_seconds(url, "wait_timeout", 1.0),
    )
