"""The adapter's connection to the server, and the limits of one script call.

Opening and closing the connection, checking the server on connect (its version, its eviction
policy), checking a connection that sat idle before a command goes out on it, and running a
script.  The adapter holds one :class:`Server`; see its overview (:mod:`ackwise_redis._adapter`).
"""

from __future__ import annotations

import itertools
import logging
import os
import select
import time
from collections.abc import Iterator, Sequence
from typing import Any

import redis.exceptions as rx

from ackwise.errors import PermanentAdapterError
from ackwise_redis._connection import Link, Script
from ackwise_redis._url import RedisSettings

# The adapter's one logger, named as before it was split into modules.
log = logging.getLogger("ackwise_redis._adapter")

#: Oldest Redis the scripts run on (LPOP with a count, ZMSCORE).
MIN_REDIS = (6, 2)

#: Most messages one receive script takes (the worker asks for its prefetch room).
RECEIVE_LIMIT = 1000
#: Due delayed messages and expired leases one receive moves to ready, at most.
SWEEP_LIMIT = 1000
#: Publish batches are cut into script calls of at most this many messages / bytes, so one
#: call neither exceeds Lua's stack for unpack() nor Redis' client query buffer (1 GiB).
PUBLISH_CHUNK = 1000
PUBLISH_CHUNK_BYTES = 16 * 1024 * 1024
#: Receipts per ack / extend script call.
SETTLE_CHUNK = 1000
PURGE_CHUNK = 1000
#: A connection unused for longer is checked for a close by the server before it is used.
IDLE_CHECK = 0.05

__all__ = [
    "IDLE_CHECK",
    "MIN_REDIS",
    "PUBLISH_CHUNK",
    "PUBLISH_CHUNK_BYTES",
    "PURGE_CHUNK",
    "RECEIVE_LIMIT",
    "SETTLE_CHUNK",
    "SWEEP_LIMIT",
    "Server",
    "chunks",
]

# Warn once per broker and process about an eviction policy, not on every reconnect.
_warned: set[str] = set()


def chunks(items: Sequence[Any], size: int) -> Iterator[Sequence[Any]]:
    for i in range(0, len(items), size):
        yield items[i : i + size]


class Server:
    """One connection to the server, checked on connect and after idling; script calls; the
    receipts' tokens."""

    def __init__(self, settings: RedisSettings) -> None:
        self.settings = settings
        #: The connection(s) of every command but the receives read later.
        self.link = Link(self.settings, on_connect=self._check_server)
        #: The connection(s) of receives whose answer is read later (``receive_later``): no
        #: other command's reply can come before theirs.
        self.ahead = Link(self.settings, on_connect=self._check_server)
        self._token_prefix = ""
        self._tokens = itertools.count(1)

    # -- lifecycle -------------------------------------------------------------------------
    def errors(self) -> Any:
        """The context that maps redis-py errors to :mod:`ackwise.errors` ones."""
        return self.link.errors()

    def open(self) -> None:
        if self.link.is_open:
            return
        self.link.connection()
        self.link.last_used = time.monotonic()
        self._token_prefix = os.urandom(5).hex() + "."
        self._tokens = itertools.count(1)

    def token(self) -> str:
        """A token unique to this opening of the connection (a receipt's last part)."""
        return f"{self._token_prefix}{next(self._tokens):x}"

    def _check_server(self, conn: Any) -> None:
        """Refuse too old a Redis; warn (or refuse, ``strict=true``) about eviction."""
        s = self.settings
        try:
            conn.send_command("INFO", "server")
            info = conn.read_response()
        except rx.ResponseError:  # INFO renamed or denied: skip the check
            info = b""
        for line in bytes(info).splitlines():
            if line.startswith(b"redis_version:"):
                version = tuple(int(p) for p in line.split(b":")[1].split(b".")[:2] if p.isdigit())
                if version and version < MIN_REDIS:
                    raise PermanentAdapterError(
                        f"{s.where}: Redis {line.split(b':')[1].decode()} is too old; "
                        f"ackwise-redis needs Redis >= {'.'.join(map(str, MIN_REDIS))}"
                    )
        try:
            conn.send_command("CONFIG", "GET", "maxmemory-policy")
            reply = conn.read_response()
        except rx.ResponseError as exc:  # CONFIG disabled (managed Redis) or denied by ACL
            log.info("cannot read maxmemory-policy of %s (%s); not checked", s.where, exc)
            return
        if isinstance(reply, dict):
            reply = [x for pair in reply.items() for x in pair]
        policy = reply[1].decode() if len(reply) >= 2 else "noeviction"
        if policy == "noeviction":
            return
        message = (
            f"Redis at {s.where} has maxmemory-policy {policy!r}: under memory pressure it may "
            "evict queue keys, silently losing messages; set 'maxmemory-policy noeviction'"
        )
        if s.strict:
            raise PermanentAdapterError(message + " (refused because of strict=true)")
        if s.where not in _warned:
            _warned.add(s.where)
            log.warning("%s (add ?strict=true to refuse to start instead)", message)

    def close(self) -> None:
        self.link.close()
        self.ahead.close()

    def connection(self, key: bytes | None = None) -> Any:
        """The connection that serves ``key`` (in a cluster: its slot's primary)."""
        self._ready(key)
        return self.link.connection(key)

    def ahead_connection(self, key: bytes) -> Any:
        """The connection for a receive read later (checked as :meth:`_ready` checks)."""
        self._ready(key, self.ahead)
        return self.ahead.connection(key)

    def _ready(self, key: bytes | None, link: Link | None = None) -> None:
        """Open the adapter if it is not, and check the connection of ``key`` on ``link``
        (default: the main one) if it sat idle."""
        if not self.link.is_open:
            self.open()
        link = link or self.link
        now = time.monotonic()
        idle, link.last_used = now - link.last_used, now
        if idle > IDLE_CHECK:
            self._check_idle_connection(link.connection(key), idle)

    def _check_idle_connection(self, conn: Any, idle: float) -> None:
        """Drop a connection that died while idle, before a command is sent on it.

        After a Redis restart (or a proxy reset) an idle connection has an end-of-file
        waiting: seen here, the command goes out on a new connection instead of failing (a
        failed send could not be retried safely: the script may have run).  A connection idle
        longer than ``health_check_interval`` is PINGed too (half-open after a host crash).
        """
        sock = getattr(conn, "_sock", None)
        if sock is None:
            return
        interval = self.settings.health_check_interval
        if self.settings.scheme != "rediss":  # TLS records may be pending: rely on PING
            poller = select.poll()
            poller.register(sock, select.POLLIN | select.POLLERR | select.POLLHUP)
            if poller.poll(0):  # no request is outstanding: readable means closed
                conn.disconnect()
                return
        if interval and idle > interval:
            try:
                conn.send_command("PING")
                conn.read_response()
            except (rx.ConnectionError, rx.TimeoutError, OSError):
                conn.disconnect()  # the next send reconnects

    def eval(self, script: Script, keys: Sequence[bytes], args: Sequence[Any]) -> Any:
        """Run ``script`` (after the idle check of its first key's connection)."""
        self._ready(keys[0] if keys else None)  # the idle check first
        return self.link.eval(script, keys, args)
