"""``redis://``, ``rediss://``, ``unix://``: the Redis adapter.

Every operation is one Lua script (``lua/*.lua``, each with its key schema at the top), called
with ``EVALSHA`` on one connection; a queue's keys share the hash tag ``{<prefix>:<queue>}``:

``ready`` (list)
    seqs of messages ready now, FIFO, as ``"<seq>#<n>"`` (``n``: deliveries so far).
``delayed`` (sorted set, score = due time)
    native delays; due entries move to ``ready`` atomically inside ``receive``.
``inflight`` (sorted set, score = lease deadline)
    members ``"<seq>#<n>#<token>"``: a receipt *is* its member, so a settlement with an old
    receipt matches nothing and raises :class:`~ackwise.errors.StaleReceipt`.  Expired
    members go back to ``ready`` inside ``receive`` (no separate sweeper).
``data`` (hash)
    ``seq -> "<len(id)>:<id><body>"``.
``dead``, ``dead_info``, ``dead_ids``
    the dead-letter store: dead_at order, ``attempt|reason``, and message id → seqs.
``seq`` (counter), ``notify`` (list)
    unique seqs; wake-up tokens that idle receivers ``BLPOP`` between two receive scripts.

The server's clock (``TIME``) sets every deadline and due time, so workers on hosts with
skewed clocks still agree on when a lease expires.  ``Delivery.lease_deadline`` is therefore
the Redis host's wall clock.

The adapter talks to Redis through one redis-py ``Connection`` (no pool, no retries inside
the driver): the worker calls an adapter from one thread, and a transient error surfaces as
:class:`~ackwise.errors.TransientAdapterError` so the worker's reconnect-with-backoff decides.
"""

from __future__ import annotations

import hashlib
import itertools
import logging
import os
import select
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from importlib import resources
from typing import Any

import redis
import redis.exceptions as rx
from redis.backoff import NoBackoff
from redis.retry import Retry

from ackwise import (
    Adapter,
    AttemptCount,
    BrokerURL,
    Capabilities,
    DeadLetter,
    Delivery,
    LeaseExtension,
    Outgoing,
    QueueSpec,
    QueueStats,
    fork_generation,
)
from ackwise.errors import MessageTooLarge, PermanentAdapterError, StaleReceipt
from ackwise_redis._errors import map_redis_errors
from ackwise_redis._url import RedisSettings, parse_redis_url

__all__ = ["MAX_MESSAGE_SIZE", "RedisAdapter"]

log = logging.getLogger(__name__)

#: Largest encoded envelope accepted.  Redis takes strings up to 512 MiB, but every message
#: passes through Redis' single thread (and a receive returns a batch of them in one reply): a
#: 64 MiB message already stalls every other client for tens of milliseconds.  Keep payloads
#: small and pass references to large data.
MAX_MESSAGE_SIZE = 64 * 1024 * 1024

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

# -- scripts -------------------------------------------------------------------------------


@dataclass(frozen=True)
class _Script:
    name: str
    source: bytes
    sha: str


def _load_script(name: str) -> _Script:
    source = resources.files("ackwise_redis").joinpath(f"lua/{name}.lua").read_bytes()
    return _Script(name, source, hashlib.sha1(source).hexdigest())


_RECEIVE = _load_script("receive")
_PUBLISH = _load_script("publish")
_ACK = _load_script("ack")
_EXTEND = _load_script("extend")
_NACK = _load_script("nack")
_DEAD_LETTER = _load_script("dead_letter")
_PUBLISH_DEAD = _load_script("publish_dead")
_DEAD_LETTERS = _load_script("dead_letters")
_REQUEUE_DEAD = _load_script("requeue_dead")
_DELETE_DEAD = _load_script("delete_dead")
_PURGE = _load_script("purge")
_STATS = _load_script("stats")


# Warn once per broker and process about an eviction policy, not on every reconnect.
_warned: set[str] = set()


@dataclass(frozen=True, slots=True)
class _Keys:
    ready: bytes
    delayed: bytes
    inflight: bytes
    data: bytes
    seq: bytes
    notify: bytes
    dead: bytes
    dead_info: bytes
    dead_ids: bytes


def _keys(prefix: str, queue: str) -> _Keys:
    tag = f"{{{prefix}:{queue}}}"
    k = {
        name: f"{tag}:{name.replace('_', '-')}".encode()
        for name in (
            "ready",
            "delayed",
            "inflight",
            "data",
            "seq",
            "notify",
            "dead",
            "dead_info",
            "dead_ids",
        )
    }
    return _Keys(**k)


def _pack(m: Outgoing) -> bytes:
    mid = m.id.encode()
    return b"%d:%s%s" % (len(mid), mid, m.body)


def _unpack(data: bytes) -> tuple[str, bytes]:
    colon = data.index(b":")
    start = colon + 1
    end = start + int(data[:colon])
    return data[start:end].decode(), data[end:]


def _seq_time(entry: bytes) -> float | None:
    """Enqueue time (server clock, seconds) carried by a seq or an entry that starts with one."""
    head = entry.split(b"-", 1)[0]
    try:
        return int(head, 16) / 1000.0
    except ValueError:
        return None


def _chunks(items: Sequence[Any], size: int) -> Iterator[Sequence[Any]]:
    for i in range(0, len(items), size):
        yield items[i : i + size]


class RedisAdapter(Adapter):
    """Adapter for one Redis server (standalone, or a primary behind a proxy / DNS failover).

    Durability is Redis': with ``appendonly yes`` and ``appendfsync everysec`` a Redis crash
    may lose up to a second of acknowledged writes (published messages, acks, dead letters);
    ``appendfsync always`` loses none at a cost per write; with no persistence a restart loses
    everything.  See the package README.
    """

    name = "redis"
    capabilities = Capabilities(
        native_delay=True,
        max_delay=None,
        lease_extension=LeaseExtension.PER_MESSAGE,
        max_lease=None,
        attempt_count=AttemptCount.EXACT,
        native_dead_letter=True,
        max_message_size=MAX_MESSAGE_SIZE,
        multi_process=True,
    )

    def __init__(self, url: BrokerURL) -> None:
        super().__init__(url)
        self.settings: RedisSettings = parse_redis_url(url)
        self._conn: Any = None  # a redis-py Connection
        self._generation = -1
        self._last_used = 0.0
        self._keys: dict[str, _Keys] = {}
        self._queues_key = f"{{{self.settings.prefix}}}:queues".encode()
        self._token_prefix = ""
        self._tokens = itertools.count(1)

    def __repr__(self) -> str:
        return f"<RedisAdapter {self.settings.where} prefix={self.settings.prefix!r}>"

    # -- lifecycle -------------------------------------------------------------------------
    def _errors(self) -> Any:
        return map_redis_errors(self.settings.where, self.settings.password)

    def open(self) -> None:
        if self._conn is not None and self._generation == fork_generation():
            return
        self._conn = None  # inherited through fork(): never touch the parent's socket
        s = self.settings
        kwargs = s.connection_kwargs()
        # No retries inside the driver: a retried script may have run already (a receive
        # would lease twice, an ack report a false stale receipt).  The worker reconnects.
        kwargs["retry"] = Retry(NoBackoff(), 0)
        # RESP2: the replies the scripts are written for, on every Redis >= 6.2 (redis-py 8
        # would negotiate RESP3 with HELLO).
        kwargs["protocol"] = 2
        cls: Any
        if s.scheme == "unix":
            cls = redis.UnixDomainSocketConnection
        elif s.scheme == "rediss":
            cls = redis.SSLConnection
        else:
            cls = redis.Connection
        conn = cls(**kwargs)
        try:
            with self._errors():
                conn.connect()
                self._check_server(conn)
        except BaseException:
            conn.disconnect()
            raise
        self._conn = conn
        self._generation = fork_generation()
        self._last_used = time.monotonic()
        self._token_prefix = os.urandom(5).hex() + "."
        self._tokens = itertools.count(1)

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
        conn, self._conn = self._conn, None
        if conn is not None:
            try:
                conn.disconnect()
            except Exception:  # closing a broken socket
                log.debug("disconnect failed", exc_info=True)

    def _connection(self) -> Any:
        conn = self._conn
        if conn is None or self._generation != fork_generation():
            self.open()
            conn = self._conn
        now = time.monotonic()
        idle = now - self._last_used
        self._last_used = now
        if idle > IDLE_CHECK:
            self._check_idle_connection(conn, idle)
        return conn

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

    def _eval(self, script: _Script, keys: Sequence[bytes], args: Sequence[Any]) -> Any:
        conn = self._connection()
        try:
            conn.send_command("EVALSHA", script.sha, len(keys), *keys, *args)
            return conn.read_response()
        except rx.NoScriptError:
            # First use on this server (or it restarted): load and run again.  NOSCRIPT means
            # the script did not run, so running it now cannot run it twice.
            conn.send_command("SCRIPT", "LOAD", script.source)
            conn.read_response()
            conn.send_command("EVALSHA", script.sha, len(keys), *keys, *args)
            return conn.read_response()

    def keys(self, queue: str) -> _Keys:
        """The Redis keys of ``queue``."""
        k = self._keys.get(queue)
        if k is None:
            if not queue or "{" in queue or "}" in queue:
                raise PermanentAdapterError(
                    f"queue name {queue!r} cannot be used with Redis: it must be non-empty and "
                    "contain no braces (they delimit the keys' hash tag)"
                )
            k = self._keys[queue] = _keys(self.settings.prefix, queue)
        return k

    # -- topology --------------------------------------------------------------------------
    def declare(self, queue: QueueSpec) -> None:
        self.keys(queue.name)
        with self._errors():
            conn = self._connection()
            conn.send_command("SADD", self._queues_key, queue.name)
            conn.read_response()

    def queues(self) -> Sequence[str]:
        with self._errors():
            conn = self._connection()
            conn.send_command("SMEMBERS", self._queues_key)
            names = conn.read_response()
        return sorted(n.decode() for n in names)

    # -- producing -------------------------------------------------------------------------
    def _check_sizes(self, messages: Sequence[Outgoing]) -> bool:
        delayed = False
        for m in messages:
            if len(m.body) > MAX_MESSAGE_SIZE:
                raise MessageTooLarge(
                    f"message {m.id}: {len(m.body)} bytes exceeds the Redis broker's limit of "
                    f"{MAX_MESSAGE_SIZE}; nothing was published"
                )
            if m.delay > 0:
                self.check_delay(m.delay)
                delayed = True
        return delayed

    def _publish_chunks(self, messages: Sequence[Outgoing]) -> Iterator[Sequence[Outgoing]]:
        start, size = 0, 0
        for i, m in enumerate(messages):
            size += len(m.body)
            if i > start and (i - start >= PUBLISH_CHUNK or size > PUBLISH_CHUNK_BYTES):
                yield messages[start:i]
                start, size = i, len(m.body)
        yield messages[start:]

    def publish(self, queue: str, messages: Sequence[Outgoing]) -> None:
        if not messages:
            return
        k = self.keys(queue)
        keys = (k.ready, k.delayed, k.data, k.seq, k.notify)
        delayed = self._check_sizes(messages)
        with self._errors():
            if len(messages) == 1 and not delayed:  # the one-call-per-task hot path
                self._eval(_PUBLISH, keys, (b"0", _pack(messages[0])))
                return
            for chunk in self._publish_chunks(messages):
                args: list[Any]
                if delayed:
                    args = [b"1"]
                    for m in chunk:
                        args.append(_pack(m))
                        args.append(repr(max(m.delay, 0.0)))
                else:
                    args = [b"0", *map(_pack, chunk)]
                self._eval(_PUBLISH, keys, args)

    def publish_dead(self, queue: str, messages: Sequence[Outgoing], *, reason: str) -> None:
        if not messages:
            return
        k = self.keys(queue)
        keys = (k.data, k.dead, k.dead_info, k.dead_ids, k.seq)
        with self._errors():
            for chunk in self._publish_chunks(messages):
                args: list[Any] = [reason]
                for m in chunk:
                    args.append(m.id)
                    args.append(_pack(m))
                self._eval(_PUBLISH_DEAD, keys, args)

    # -- consuming -------------------------------------------------------------------------
    def _token(self) -> str:
        return f"{self._token_prefix}{next(self._tokens):x}"

    def receive(
        self, queue: str, *, max_messages: int, wait: float, lease: float
    ) -> Sequence[Delivery]:
        if max_messages < 1:
            return []
        k = self.keys(queue)
        keys = (k.ready, k.delayed, k.inflight, k.data, k.notify)
        n = min(max_messages, RECEIVE_LIMIT)
        lease_arg = repr(float(lease))
        with self._errors():
            reply = self._eval(_RECEIVE, keys, (n, lease_arg, self._token(), SWEEP_LIMIT))
            if reply[0] or wait <= 0:
                return self._deliveries(queue, reply)
            end = time.monotonic() + wait
            while True:
                remaining = end - time.monotonic()
                if remaining <= 0:
                    return []
                if reply[1]:
                    remaining = min(remaining, max(float(reply[1]), 0.0))
                if remaining > 0.0005:
                    self._wait_for_wakeup(k.notify, remaining)
                reply = self._eval(_RECEIVE, keys, (n, lease_arg, self._token(), SWEEP_LIMIT))
                if reply[0]:
                    return self._deliveries(queue, reply)

    def _wait_for_wakeup(self, notify: bytes, timeout: float) -> None:
        """Block until a publisher (or a receiver with more ready) pushes a token, or timeout."""
        conn = self._connection()
        # BLPOP treats 0 as "forever"; the socket must outwait the server-side timeout.
        timeout = min(max(timeout, 0.001), max(self.settings.socket_timeout - 1.0, 0.5))
        conn.send_command("BLPOP", notify, f"{timeout:.3f}")
        conn.read_response(timeout=timeout + self.settings.socket_timeout)

    @staticmethod
    def _deliveries(queue: str, reply: list[bytes]) -> list[Delivery]:
        if not reply[0]:
            return []
        deadline = float(reply[0])
        out = []
        for i in range(1, len(reply), 2):
            member = reply[i]
            data = reply[i + 1]
            colon = data.index(b":")
            start = colon + 1
            end = start + int(data[:colon])
            out.append(
                Delivery(
                    queue,
                    data[start:end].decode(),
                    data[end:],
                    member,
                    int(member.split(b"#", 2)[1]),
                    deadline,
                )
            )
        return out

    @staticmethod
    def _by_queue(deliveries: Sequence[Delivery]) -> Iterator[tuple[str, Sequence[Delivery]]]:
        first = deliveries[0].queue
        if all(d.queue == first for d in deliveries):
            yield first, deliveries
            return
        groups: dict[str, list[Delivery]] = {}
        for d in deliveries:
            groups.setdefault(d.queue, []).append(d)
        yield from groups.items()

    def ack(self, deliveries: Sequence[Delivery]) -> None:
        if not deliveries:
            return
        stale: list[Delivery] = []
        with self._errors():
            for queue, group in self._by_queue(deliveries):
                k = self.keys(queue)
                keys = (k.inflight, k.data)
                for chunk in _chunks(group, SETTLE_CHUNK):
                    positions = self._eval(_ACK, keys, [d.receipt for d in chunk])
                    stale.extend(chunk[p - 1] for p in positions)
        if stale:
            raise StaleReceipt(stale, "ack")

    def extend(self, deliveries: Sequence[Delivery], *, lease: float) -> None:
        if not deliveries:
            return
        stale: list[Delivery] = []
        lease_arg = repr(float(lease))
        with self._errors():
            for queue, group in self._by_queue(deliveries):
                keys = (self.keys(queue).inflight,)
                for chunk in _chunks(group, SETTLE_CHUNK):
                    positions = self._eval(_EXTEND, keys, [lease_arg, *(d.receipt for d in chunk)])
                    stale.extend(chunk[p - 1] for p in positions)
        if stale:
            raise StaleReceipt(stale, "extend")

    def nack(self, delivery: Delivery, *, delay: float = 0.0) -> None:
        delay = delay if delay > 0 else 0.0
        if delay:
            self.check_delay(delay)
        k = self.keys(delivery.queue)
        with self._errors():
            done = self._eval(
                _NACK, (k.inflight, k.ready, k.delayed, k.notify), (delivery.receipt, repr(delay))
            )
        if not done:
            raise StaleReceipt([delivery], "nack")

    def dead_letter(self, delivery: Delivery, *, reason: str, body: bytes | None = None) -> None:
        k = self.keys(delivery.queue)
        replacement = b"" if body is None else _pack(Outgoing(delivery.message_id, body))
        with self._errors():
            done = self._eval(
                _DEAD_LETTER,
                (k.inflight, k.data, k.dead, k.dead_info, k.dead_ids),
                (delivery.receipt, delivery.message_id, reason, replacement),
            )
        if not done:
            raise StaleReceipt([delivery], "dead_letter")

    # -- inspection ------------------------------------------------------------------------
    def stats(self, queue: str) -> QueueStats:
        k = self.keys(queue)
        with self._errors():
            reply = self._eval(_STATS, (k.ready, k.delayed, k.inflight, k.dead), ())
        ready, delayed, in_flight, dead = (int(x) for x in reply[:4])
        now = float(reply[4])
        times = [t for t in map(_seq_time, reply[5:8]) if t is not None]
        oldest = min(times) if times and ready else None
        return QueueStats(
            queue,
            ready=ready,
            delayed=delayed,
            in_flight=in_flight,
            dead=dead,
            oldest_age=max(0.0, now - oldest) if oldest is not None else 0.0,
        )

    def dead_letters(self, queue: str, *, limit: int = 100) -> Sequence[DeadLetter]:
        if limit < 1:
            return []
        k = self.keys(queue)
        with self._errors():
            reply = self._eval(_DEAD_LETTERS, (k.dead, k.data, k.dead_info), (limit,))
        out = []
        for i in range(0, len(reply), 3):
            dead_at, data, info = reply[i : i + 3]
            mid, body = _unpack(data) if data else ("?", b"")
            attempt, _, reason = info.decode().partition("|")
            out.append(DeadLetter(queue, mid, body, reason, float(dead_at), int(attempt)))
        return out

    def requeue_dead(self, queue: str, message_ids: Sequence[str]) -> int:
        if not message_ids:
            return 0
        k = self.keys(queue)
        keys = (k.dead, k.dead_info, k.dead_ids, k.data, k.ready, k.seq, k.notify)
        moved = 0
        with self._errors():
            for chunk in _chunks(list(message_ids), PUBLISH_CHUNK):
                moved += int(self._eval(_REQUEUE_DEAD, keys, chunk))
        return moved

    def delete_dead(self, queue: str, message_ids: Sequence[str] | None = None) -> int:
        k = self.keys(queue)
        keys = (k.dead, k.dead_info, k.dead_ids, k.data)
        with self._errors():
            if message_ids is None:
                return int(self._eval(_DELETE_DEAD, keys, ("*",)))
            deleted = 0
            for chunk in _chunks(list(message_ids), PUBLISH_CHUNK):
                deleted += int(self._eval(_DELETE_DEAD, keys, ("=", *chunk)))
            return deleted

    def purge(self, queue: str) -> int:
        k = self.keys(queue)
        keys = (k.ready, k.delayed, k.data)
        total = 0
        with self._errors():
            while True:
                ready, delayed = self._eval(_PURGE, keys, (PURGE_CHUNK,))
                total += int(ready) + int(delayed)
                if ready < PURGE_CHUNK and delayed < PURGE_CHUNK:
                    return total
