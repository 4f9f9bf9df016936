"""``amqp://`` and ``amqps://`` URLs: credentials, vhost, heartbeat, TLS and ackwise's options.

``amqp[s]://user:password@host:port/vhost?option=value&…`` — the vhost is the URL-encoded path
(``/%2F`` or an empty path is the default vhost ``/``).  Options:

``heartbeat`` (seconds, default 60)
    AMQP heartbeat interval.  The adapter's I/O thread answers heartbeats while tasks run; a
    consumer whose process is frozen (SIGSTOP, a long GC) loses its connection, and so its
    deliveries, after about two intervals.
``connection_timeout`` (seconds, default 10), ``confirm_timeout`` (seconds, default 30)
``queue_type`` (``quorum``, default, or ``classic``)
``priorities`` (``true`` or ``false``, default ``false``)
    declare queues with ``x-max-priority`` 9, so that messages of a higher priority are
    delivered first (docs/priorities.md).  Classic queues only: a quorum queue has no
    priorities before RabbitMQ 4.0.  A queue that exists without ``x-max-priority`` is refused
    (RabbitMQ cannot add it to an existing queue).
``consumer_timeout`` (seconds, default 1800)
    the broker's ``consumer_timeout`` (RabbitMQ's default is 30 minutes).  AMQP cannot read it,
    so say it here when the broker's is different; a task whose ``time_limit`` is longer is
    refused at worker start.
``management`` (an ``http[s]://host:port`` URL)
    RabbitMQ's management API, used by ``stats()`` for the exact in-flight count of every
    consumer (AMQP only tells the number of ready messages).
``management_lag`` (seconds, default 0)
    how stale the management API's queue totals may be: quorum queues refresh them once per
    ``quorum_tick_interval`` (5 s by default).  ``stats()`` waits this long before reading them,
    so that a message that left ``ready`` before the call is seen in flight.
``prefix`` (default ``ackwise``)
    names the exchanges and auxiliary queues (``<prefix>.<queue>.dlx``, …).
``aux_queue_type`` (``classic``, default, or ``quorum``)
    the queue type of each queue's dead-letter queue and delay tiers.  ``quorum`` replicates
    them, so a cluster that loses a node keeps dead letters and delayed messages; it costs 33
    more quorum queues (Raft groups) per queue, and a quorum queue counts deliveries of its
    own, so the attempt of a message RabbitMQ dead-lettered by itself (past
    ``x-delivery-limit``: the worker never got to dead-letter it) reads as 1 there.
``hosts`` (``host:port,host:port``)
    more nodes of the same cluster (same credentials, vhost and TLS settings), tried in
    order after the URL's own host whenever the adapter connects: when the node it used
    dies, the adapter's next connection goes to a surviving one.
TLS (``amqps`` only): ``ca_certs``, ``certfile``, ``keyfile``, ``verify`` (``true``/``false``),
``server_hostname``.
"""

from __future__ import annotations

import ssl
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import quote

import pika

from ackwise.errors import InvalidBrokerURL
from ackwise.spi import BrokerURL

__all__ = ["RabbitMQSettings", "parse_rabbitmq_url"]

_KNOWN = {
    "heartbeat",
    "connection_timeout",
    "confirm_timeout",
    "queue_type",
    "priorities",
    "consumer_timeout",
    "management",
    "management_lag",
    "prefix",
    "ca_certs",
    "certfile",
    "keyfile",
    "verify",
    "server_hostname",
    "hosts",
    "aux_queue_type",
}


@dataclass(frozen=True)
class RabbitMQSettings:
    scheme: str
    host: str
    port: int
    vhost: str
    username: str
    password: str = field(repr=False)
    heartbeat: float = 60.0
    connection_timeout: float = 10.0
    confirm_timeout: float = 30.0
    queue_type: str = "quorum"
    priorities: bool = False
    consumer_timeout: float = 1800.0
    management: str | None = None
    management_lag: float = 0.0
    prefix: str = "ackwise"
    ca_certs: str | None = None
    certfile: str | None = None
    keyfile: str | None = None
    verify: bool = True
    server_hostname: str | None = None
    aux_queue_type: str = "classic"
    #: More nodes (``hosts``), tried after ``host:port`` in this order.
    more_hosts: tuple[tuple[str, int], ...] = ()

    @property
    def where(self) -> str:
        """The broker, for messages: never with credentials."""
        nodes = ",".join(f"{h}:{p}" for h, p in ((self.host, self.port), *self.more_hosts))
        return f"{self.scheme}://{nodes}/{quote(self.vhost, safe='')}"

    def connection_parameters(self) -> list[pika.ConnectionParameters]:
        """One set of parameters per node, the URL's own first (pika tries them in order)."""
        return [
            self._parameters(host, port)
            for host, port in ((self.host, self.port), *self.more_hosts)
        ]

    def _parameters(self, host: str, port: int) -> pika.ConnectionParameters:
        ssl_options = None
        if self.scheme == "amqps":
            context = ssl.create_default_context(cafile=self.ca_certs)
            if self.certfile:
                context.load_cert_chain(self.certfile, self.keyfile)
            if not self.verify:
                context.check_hostname = False
                context.verify_mode = ssl.CERT_NONE
            ssl_options = pika.SSLOptions(context, self.server_hostname or host)
        kwargs: dict[str, Any] = {
            "host": host,
            "port": port,
            "virtual_host": self.vhost,
            "credentials": pika.PlainCredentials(self.username, self.password),
            "heartbeat": max(1, round(self.heartbeat)),
            "blocked_connection_timeout": 300,
            "socket_timeout": self.connection_timeout,
            "stack_timeout": self.connection_timeout + 5,
            "connection_attempts": 1,
            "client_properties": {"connection_name": "ackwise"},
        }
        if ssl_options is not None:
            kwargs["ssl_options"] = ssl_options
        return pika.ConnectionParameters(**kwargs)


def _seconds(url: BrokerURL, name: str, value: str, *, positive: bool = True) -> float:
    try:
        seconds = float(value)
    except ValueError:
        raise InvalidBrokerURL(f"broker URL {url}: {name}={value!r} is not a number") from None
    if positive and not seconds > 0:
        raise InvalidBrokerURL(f"broker URL {url}: {name} must be > 0, got {value!r}")
    return seconds


def parse_rabbitmq_url(url: BrokerURL) -> RabbitMQSettings:
    """Check ``url`` and return its settings; raise :class:`InvalidBrokerURL` naming the fault."""
    if url.scheme not in ("amqp", "amqps"):
        raise InvalidBrokerURL(f"broker URL {url}: scheme must be amqp or amqps")
    unknown = sorted(set(url.query) - _KNOWN)
    if unknown:
        raise InvalidBrokerURL(
            f"broker URL {url}: unknown option(s) {', '.join(unknown)}; known: "
            f"{', '.join(sorted(_KNOWN))}"
        )
    q = url.query
    tls = {
        k: q[k] for k in ("ca_certs", "certfile", "keyfile", "verify", "server_hostname") if k in q
    }
    if tls and url.scheme != "amqps":
        raise InvalidBrokerURL(
            f"broker URL {url}: TLS options ({', '.join(tls)}) need the amqps:// scheme"
        )
    queue_type = q.get("queue_type", "quorum")
    aux_queue_type = q.get("aux_queue_type", "classic")
    if aux_queue_type not in ("quorum", "classic"):
        raise InvalidBrokerURL(
            f"broker URL {url}: aux_queue_type must be 'quorum' or 'classic', got "
            f"{aux_queue_type!r}"
        )
    if queue_type not in ("quorum", "classic"):
        raise InvalidBrokerURL(
            f"broker URL {url}: queue_type must be 'quorum' or 'classic', got {queue_type!r}"
        )
    priorities = q.get("priorities", "false").lower()
    if priorities not in ("true", "false", "1", "0", "yes", "no"):
        raise InvalidBrokerURL(f"broker URL {url}: priorities must be true or false")
    if priorities in ("true", "1", "yes") and queue_type != "classic":
        raise InvalidBrokerURL(
            f"broker URL {url}: priorities=true needs queue_type=classic (a quorum queue has "
            "no priorities before RabbitMQ 4.0)"
        )
    verify = q.get("verify", "true").lower()
    if verify not in ("true", "false", "1", "0", "yes", "no"):
        raise InvalidBrokerURL(f"broker URL {url}: verify must be true or false")
    path = url.path[1:] if url.path.startswith("/") else url.path
    prefix = q.get("prefix", "ackwise")
    if not prefix or len(prefix) > 64:
        raise InvalidBrokerURL(f"broker URL {url}: prefix must be 1-64 characters")
    default_port = 5671 if url.scheme == "amqps" else 5672
    more_hosts = []
    for item in filter(None, (x.strip() for x in q.get("hosts", "").split(","))):
        host, sep, port = item.rpartition(":")
        if not sep:
            host, port = item, str(default_port)
        if not host or not port.isdigit() or not 0 < int(port) < 65_536:
            raise InvalidBrokerURL(
                f"broker URL {url}: hosts: {item!r} is not host:port (e.g. "
                f"hosts=rabbit-2:{default_port},rabbit-3:{default_port})"
            )
        more_hosts.append((host, int(port)))
    return RabbitMQSettings(
        scheme=url.scheme,
        host=url.host or "localhost",
        port=url.port or default_port,
        vhost=path or "/",
        username=url.username or "guest",
        password=url.password or "guest",
        heartbeat=_seconds(url, "heartbeat", q.get("heartbeat", "60")),
        connection_timeout=_seconds(url, "connection_timeout", q.get("connection_timeout", "10")),
        confirm_timeout=_seconds(url, "confirm_timeout", q.get("confirm_timeout", "30")),
        queue_type=queue_type,
        aux_queue_type=aux_queue_type,
        priorities=priorities in ("true", "1", "yes"),
        consumer_timeout=_seconds(url, "consumer_timeout", q.get("consumer_timeout", "1800")),
        management=q.get("management") or None,
        management_lag=_seconds(
            url, "management_lag", q.get("management_lag", "0"), positive=False
        ),
        prefix=prefix,
        ca_certs=q.get("ca_certs"),
        certfile=q.get("certfile"),
        keyfile=q.get("keyfile"),
        verify=verify in ("true", "1", "yes"),
        server_hostname=q.get("server_hostname"),
        more_hosts=tuple(more_hosts),
    )
