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
from redis.retry import Retry

from ackwise import fork_generation
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


class Link:
    """This process's one connection to the Redis of ``settings``.

    :param on_connect: run on each new connection before it is used (e.g. a server check).
    """

    def __init__(
        self, settings: RedisSettings, *, on_connect: Callable[[Any], None] | None = None
    ) -> None:
        self.settings = settings
        #: Caps the socket timeouts of the next connection (the beat's lock sets it).
        self.timeout: float | None = None
        self._on_connect = on_connect
        self._conn: Any = None  # a redis-py Connection
        self._generation = -1

    def errors(self) -> Any:
        """The context that maps redis-py errors to :mod:`ackwise.errors` ones."""
        return map_redis_errors(self.settings.where, self.settings.password)

    @property
    def is_open(self) -> bool:
        return self._conn is not None and self._generation == fork_generation()

    def connection(self) -> Any:
        """The connection of this process, connected when it has none yet."""
        if self.is_open:
            return self._conn
        self._conn = None  # inherited through fork(): never touch the parent's socket
        s = self.settings
        if self.timeout is not None:
            s = dataclasses.replace(
                s,
                socket_timeout=min(s.socket_timeout, self.timeout),
                socket_connect_timeout=min(s.socket_connect_timeout, self.timeout),
            )
        conn = _connection_class(s)(**_connection_kwargs(s))
        try:
            with self.errors():
                conn.connect()
                if self._on_connect is not None:
                    self._on_connect(conn)
        except BaseException:
            conn.disconnect()
            raise
        self._conn, self._generation = conn, fork_generation()
        return conn

    def client(self) -> Any:
        """A redis-py client of its own (a pool of one connection class, as this link's),
        for what cannot share the link's one connection: a pub/sub subscription."""
        s = self.settings
        pool = redis.ConnectionPool(connection_class=_connection_class(s), **_connection_kwargs(s))
        return redis.Redis(connection_pool=pool)

    def close(self) -> None:
        conn, self._conn = self._conn, None
        if conn is not None and self._generation == fork_generation():
            try:
                conn.disconnect()
            except Exception:  # closing a broken socket
                pass

    def command(self, *args: Any) -> Any:
        """Send one command and read its reply; errors are redis-py's (see :meth:`errors`)."""
        conn = self.connection()
        conn.send_command(*args)
        return conn.read_response()

    def eval(self, script: Script, keys: Sequence[Any], args: Sequence[Any]) -> Any:
        """Run ``script``; errors are redis-py's (callers map them, see :meth:`errors`)."""
        conn = self.connection()
        try:
            try:
                conn.send_command("EVALSHA", script.sha, len(keys), *keys, *args)
                return conn.read_response()
            except rx.NoScriptError:
                conn.send_command("SCRIPT", "LOAD", script.source)
                conn.read_response()
                conn.send_command("EVALSHA", script.sha, len(keys), *keys, *args)
                return conn.read_response()
        except (rx.ConnectionError, rx.TimeoutError, OSError):
            # A late reply must never be read as the answer to the next command.
            conn.disconnect()
            raise


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
