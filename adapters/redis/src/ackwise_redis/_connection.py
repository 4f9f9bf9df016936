"""How the adapter, the leader lock and the idempotency store reach Redis: one rule for all.

- One plain connection per object and process, no pool: a connection inherited through
  ``fork()`` is never touched by the child (it opens its own).
- No retries inside the driver: a retried script may have run already (a receive would lease
  twice, an ack report a false stale receipt, a claim refuse its own holder).  The caller
  reconnects on the next call.
- RESP2: the replies the scripts are written for, on every Redis >= 6.2 (redis-py 8 would
  negotiate RESP3 with HELLO).
- Scripts run by ``EVALSHA``; on ``NOSCRIPT`` (first use on this server, or it restarted) the
  script is loaded and run again, which cannot run it twice: NOSCRIPT means it did not run.
- Sentinel: the master's address comes from the sentinels (redis-py's ``Sentinel``) whenever
  a connection is opened, and a node that does not say ``ROLE`` master is refused; a lost
  connection is reopened to whatever master the sentinels name then.
- Cluster: one connection per primary, chosen by the slot of the command's key (every key of
  a queue shares one hash tag: one slot).  The slot map (``CLUSTER SLOTS``) is read on first
  use and again after a lost connection; a ``MOVED`` reply updates it and the command goes
  to the named node, an ``ASK`` reply sends it there once after ``ASKING``: both mean the
  command did not run, so sending it again cannot run it twice.
"""

from __future__ import annotations

import dataclasses
import hashlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from importlib import resources
from typing import Any

import redis
import redis.exceptions as rx
from redis.backoff import NoBackoff
from redis.crc import key_slot
from redis.retry import Retry
from redis.sentinel import Sentinel

from ackwise.spi import fork_generation
from ackwise_redis._errors import map_redis_errors
from ackwise_redis._url import RedisSettings

__all__ = ["Link", "Script", "load_script"]


@dataclass(frozen=True)
class Script:
    name: str
    source: bytes
    sha: str


def load_script(name: str, *, lib: bool = False) -> Script:
    """``lua/<name>.lua``, after ``lua/lib.lua`` (its helpers) when ``lib``."""
    files = resources.files("ackwise_redis")
    source = files.joinpath(f"lua/{name}.lua").read_bytes()
    if lib:
        source = files.joinpath("lua/lib.lua").read_bytes() + source
    return Script(name, source, hashlib.sha1(source).hexdigest())


Address = tuple[str, int]
#: Redirections followed for one command before giving up (a cluster resharding in a loop).
MAX_REDIRECTS = 5
_LOST = (rx.ConnectionError, rx.TimeoutError, OSError)


class Link:
    """This process's connections to the Redis of ``settings``: one, or one per cluster primary.

    :param on_connect: run on each new connection before it is used (e.g. a server check).
    """

    def __init__(
        self, settings: RedisSettings, *, on_connect: Callable[[Any], None] | None = None
    ) -> None:
        self.settings = settings
        #: Caps the socket timeouts of the next connection (the beat's lock sets it).
        self.timeout: float | None = None
        self._on_connect = on_connect
        self._conns: dict[Address, Any] = {}  # redis-py Connections, by node
        #: ``time.monotonic()`` of its last use (the adapter checks a connection that idled).
        self.last_used = 0.0
        self._generation = -1
        self._master: Address | None = None  # sentinel: the master last named
        self._slots: list[Address | None] = []  # cluster: the primary of each slot

    def errors(self) -> Any:
        """The context that maps redis-py errors to :mod:`ackwise.errors` ones."""
        return map_redis_errors(self.settings.where, self.settings.password)

    @property
    def is_open(self) -> bool:
        return bool(self._conns) and self._generation == fork_generation()

    def connection(self, key: bytes | str | None = None) -> Any:
        """The connection that serves ``key`` (any, without one), connected when needed."""
        with self.errors():
            return self._connection(key)

    def _connection(self, key: bytes | str | None) -> Any:
        if self._generation != fork_generation():
            # Inherited through fork(): never touch the parent's sockets.
            self._conns, self._master, self._slots = {}, None, []
            self._generation = fork_generation()
        topology = self.settings.topology
        address = self._address(key)
        conn = self._conns.get(address)
        if conn is not None:
            if topology == "single" or getattr(conn, "_sock", None) is not None:
                return conn  # (a single node's lost connection reconnects on the next send)
            # Lost (the caller disconnected it): the master or the slot map may have moved.
            del self._conns[address]
            self._master, self._slots = None, []
            address = self._address(key)
        return self._node(address)

    def _node(self, address: Address) -> Any:
        """The connection to the node at ``address``, opened when there is none."""
        conn = self._conns.get(address)
        if conn is None:
            conn = self._conns[address] = self._open(address)
        return conn

    def _open(self, address: Address) -> Any:
        s = self.settings
        if self.timeout is not None:
            s = dataclasses.replace(
                s,
                socket_timeout=min(s.socket_timeout, self.timeout),
                socket_connect_timeout=min(s.socket_connect_timeout, self.timeout),
            )
        kwargs = _connection_kwargs(s)
        if s.scheme != "unix":
            kwargs["host"], kwargs["port"] = address
        conn = _connection_class(s)(**kwargs)
        try:
            conn.connect()
            if s.topology == "sentinel":
                _check_master(conn, address, s.service)
            if self._on_connect is not None:
                self._on_connect(conn)
        except BaseException:
            conn.disconnect()
            # A node that cannot be reached may have failed over: ask again next time.
            self._master, self._slots = None, []
            raise
        return conn

    # -- where a key lives -----------------------------------------------------------------
    def _address(self, key: bytes | str | None) -> Address:
        s = self.settings
        if s.topology == "sentinel":
            if self._master is None:
                self._master = self._discover_master()
            return self._master
        if s.topology == "cluster":
            if not self._slots:
                self._slots = self._read_slots()
            if key is None:
                return next(iter(self._conns), None) or next(a for a in self._slots if a)
            node = self._slots[key_slot(key.encode() if isinstance(key, str) else key)]
            if node is None:
                raise rx.SlotNotCoveredError(f"no primary serves the slot of key {key!r}")
            return node
        return (s.host, s.port)

    def _discover_master(self) -> Address:
        s = self.settings
        kwargs: dict[str, Any] = {
            "socket_timeout": min(s.socket_connect_timeout, 2.0),
            "socket_connect_timeout": min(s.socket_connect_timeout, 2.0),
            "username": s.sentinel_username,
            "password": s.sentinel_password,
            "protocol": 2,
            "retry": Retry(NoBackoff(), 0),
        }
        if s.scheme == "rediss":
            kwargs["ssl"] = True
            kwargs.update(s.tls)
        sentinel = Sentinel(list(s.nodes), sentinel_kwargs=kwargs)  # type: ignore[no-untyped-call]
        try:
            host, port = sentinel.discover_master(s.service)  # type: ignore[no-untyped-call]
        finally:
            for client in sentinel.sentinels:
                client.close()
        return (str(host), int(port))

    def _read_slots(self) -> list[Address | None]:
        """The primary of every slot, from the first node (known or configured) that answers."""
        tried: list[str] = []
        candidates = list(dict.fromkeys([*self._conns, *self.settings.nodes]))
        for address in candidates:
            conn = self._conns.get(address)
            try:
                if conn is None:
                    conn = self._conns[address] = self._open(address)
                conn.send_command("CLUSTER", "SLOTS")
                reply = conn.read_response()
            except _LOST as exc:
                self._conns.pop(address, None)
                if conn is not None:
                    conn.disconnect()
                tried.append(f"{address[0]}:{address[1]} ({exc})")
                continue
            slots: list[Address | None] = [None] * 16384
            for first, last, primary, *_replicas in reply:
                host = primary[0].decode() if primary[0] else address[0]
                for slot in range(int(first), int(last) + 1):
                    slots[slot] = (host, int(primary[1]))
            return slots
        raise rx.ConnectionError("no Redis Cluster node answered: " + "; ".join(tried))

    def redirected(self, exc: rx.AskError) -> None:
        """Note a ``MOVED`` reply (``ASK`` changes nothing: it is for one command)."""
        if isinstance(exc, rx.MovedError) and self._slots:
            self._slots[exc.slot_id] = (exc.host, int(exc.port))

    # -- commands --------------------------------------------------------------------------
    def client(self) -> Any:
        """A redis-py client of its own (a pool of one connection class, as this link's),
        for what cannot share the link's connections: a pub/sub subscription (heard on every
        node of a cluster)."""
        s = self.settings
        kwargs = _connection_kwargs(s)
        if s.topology != "single":
            kwargs["host"], kwargs["port"] = self._address(None)
        pool = redis.ConnectionPool(connection_class=_connection_class(s), **kwargs)
        return redis.Redis(connection_pool=pool)

    def close(self) -> None:
        conns, self._conns = self._conns, {}
        self._master, self._slots = None, []
        if self._generation != fork_generation():
            return
        for conn in conns.values():
            try:
                conn.disconnect()
            except Exception:  # closing a broken socket
                pass

    def command(self, *args: Any, key: bytes | str | None = None) -> Any:
        """Send one command (to the node of ``key`` in a cluster) and read its reply; errors
        are redis-py's (see :meth:`errors`)."""
        return self._send(key, args)

    def delete(self, keys: Sequence[bytes | str]) -> None:
        """``DEL`` the keys: one command, or one per slot in a cluster."""
        if self.settings.topology != "cluster":
            self._send(None, ("DEL", *keys))
            return
        by_slot: dict[int, list[bytes | str]] = {}
        for k in keys:
            by_slot.setdefault(key_slot(k.encode() if isinstance(k, str) else k), []).append(k)
        for group in by_slot.values():
            self._send(group[0], ("DEL", *group))

    def eval(self, script: Script, keys: Sequence[Any], args: Sequence[Any]) -> Any:
        """Run ``script``; errors are redis-py's (callers map them, see :meth:`errors`)."""
        command = ("EVALSHA", script.sha, len(keys), *keys, *args)
        key = keys[0] if keys else None
        try:
            return self._send(key, command)
        except rx.NoScriptError:
            self._send(key, ("SCRIPT", "LOAD", script.source))
            return self._send(key, command)

    def _send(self, key: bytes | str | None, command: Sequence[Any]) -> Any:
        conn = self.connection(key)
        asking = False
        for _ in range(MAX_REDIRECTS):
            try:
                if asking:
                    conn.send_command("ASKING")
                    conn.read_response()
                conn.send_command(*command)
                return conn.read_response()
            except rx.AskError as exc:  # MOVED too: the command did not run, send it there
                self.redirected(exc)
                address = (exc.host, int(exc.port))
                conn = self._node(address)
                asking = not isinstance(exc, rx.MovedError)
            except _LOST:
                # A late reply must never be read as the answer to the next command.
                conn.disconnect()
                raise
            except rx.ReadOnlyError:
                conn.disconnect()  # a demoted master: the next call asks for the new one
                raise
        raise rx.ClusterError(f"more than {MAX_REDIRECTS} cluster redirections for one command")


def _check_master(conn: Any, address: Address, service: str) -> None:
    """Refuse a node that the sentinels named but that is no master (a failover under way)."""
    conn.send_command("ROLE")
    role = conn.read_response()
    if not role or role[0] != b"master":
        raise rx.ConnectionError(
            f"sentinels named {address[0]}:{address[1]} the master of {service!r}, but it is a "
            f"{role[0].decode() if role else 'node of no role'} (a failover under way?)"
        )


def _connection_class(s: RedisSettings) -> Any:
    if s.scheme == "unix":
        return redis.UnixDomainSocketConnection
    if s.scheme == "rediss":
        return redis.SSLConnection
    return redis.Connection


def _connection_kwargs(s: RedisSettings) -> dict[str, Any]:
    kwargs = s.connection_kwargs()
    kwargs["retry"] = Retry(NoBackoff(), 0)
    kwargs["protocol"] = 2
    return kwargs
