"""``redis://``, ``rediss://``, ``unix://``: the Redis adapter.

Every operation is one Lua script (``lua/*.lua``, each with its key schema at the top), called
with ``EVALSHA`` on one connection; a queue's keys share the hash tag ``{<prefix>:<queue>}``:

``ready`` (list)
    seqs of messages ready now, FIFO, as ``"<seq>#<n>"`` (``n``: deliveries so far).
``delayed`` (sorted set, score = due time)
    native delays; due entries are taken (or moved to ``ready``) inside ``receive``.
``inflight`` (sorted set, score = lease deadline)
    members ``"<seq>#<n>#<token>"``: a receipt *is* its member, so a settlement with an old
    receipt matches nothing and raises :class:`~ackwise.errors.StaleReceipt`.  Expired
    members are taken again (or go back to ``ready``) inside ``receive`` (no separate sweeper).
``data`` (hash)
    ``seq -> "<len(id)>:<id><body>"``.
``dead``, ``dead_info``, ``dead_ids``
    the dead-letter store: dead_at order, ``attempt|reason``, and message id → seqs.
``early`` (sorted set, score = the lease deadline it had)
    receipts acked early, so that an early ack asked again after its answer was lost is
    known as done (``lua/ack.lua``).
``seq`` (counter), ``notify`` (list)
    unique seqs; wake-up tokens that idle receivers ``BLPOP`` between two receive scripts.

The server's clock (``TIME``) sets every deadline and due time, so workers on hosts with
skewed clocks still agree on when a lease expires.  ``Delivery.lease_deadline`` is therefore
the Redis host's wall clock.

Corrupt storage.  Redis keeps the writes of a script that fails halfway, so every script reads
and checks all it needs before its first write, and only that first write can still fail (on
the server's state: OOM, MISCONF, or a key of the wrong type).  What a queue's keys hold is
never trusted:

- an entry that is not ``<seq>#<n>`` (in flight: ``<seq>#<n>#<token>``), or whose data record
  is missing, is taken by ``receive`` under a stand-in seq (``<ms>-<where>.<token>.<i>``)
  whose data is ``"0:" + the raw entry``: the empty message id, which ackwise never writes,
  marks it as corrupt, in this delivery and in any redelivery after a crash;
- a data value that is not ``<len>:<id><body>`` with a non-empty UTF-8 id is delivered as it
  is (``body`` = the whole value).

Both are handed to the worker as a :class:`~ackwise.Delivery` with ``corrupt`` set, a stand-in
``message_id`` (``corrupt-<seq>``) and a real receipt; the worker dead-letters them
``corrupt_record``.  Their dead letter is framed under the stand-in id with the record's bytes
as found as its body, so ``ackwise dlq`` lists, replays and deletes it by that id.  A key of the
wrong Redis type (or a ``seq`` counter that holds no count) is renamed aside to
``<key>:quarantined:<server time in µs>`` with one ERROR log line, and the call that met it runs
again: that call wrote nothing, so running it again is safe.

The adapter talks to Redis through one redis-py ``Connection`` (no pool, no retries inside
the driver): the worker calls an adapter from one thread, and a transient error surfaces as
:class:`~ackwise.errors.TransientAdapterError` so the worker's reconnect-with-backoff decides.
"""

from __future__ import annotations

import itertools
import logging
import os
import re
import select
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import redis.exceptions as rx

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
)
from ackwise.errors import MessageTooLarge, PermanentAdapterError, StaleReceipt
from ackwise_redis._connection import Link, Script, load_script
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


_RECEIVE = load_script("receive")
_PUBLISH = load_script("publish", lib=True)
_ACK = load_script("ack")
_EXTEND = load_script("extend")
_NACK = load_script("nack")
_DEAD_LETTER = load_script("dead_letter")
_PUBLISH_DEAD = load_script("publish_dead", lib=True)
_DEAD_LETTERS = load_script("dead_letters")
_REQUEUE_DEAD = load_script("requeue_dead", lib=True)
_DELETE_DEAD = load_script("delete_dead", lib=True)
_PURGE = load_script("purge")
_STATS = load_script("stats")
_QUARANTINE = load_script("quarantine")


# Warn once per broker and process about an eviction policy, not on every reconnect.
_warned: set[str] = set()


#: What each key of a queue holds (``counter``: a string of a decimal count), in field order.
_KEY_TYPES = {
    "ready": "list",
    "delayed": "zset",
    "inflight": "zset",
    "data": "hash",
    "seq": "counter",
    "notify": "list",
    "dead": "zset",
    "dead_info": "hash",
    "dead_ids": "hash",
    "early": "zset",
}


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
    early: bytes
    #: (key, what it must hold) for every key above: what the quarantine checks.
    typed: tuple[tuple[bytes, str], ...]


def _keys(prefix: str, queue: str) -> _Keys:
    tag = f"{{{prefix}:{queue}}}"
    k = {name: f"{tag}:{name.replace('_', '-')}".encode() for name in _KEY_TYPES}
    return _Keys(**k, typed=tuple((k[name], kind) for name, kind in _KEY_TYPES.items()))


def _pack(m: Outgoing) -> bytes:
    mid = m.id.encode()
    return b"%d:%s%s" % (len(mid), mid, m.body)


# -- records ackwise did not write ---------------------------------------------------------
#: Digits a data value's id length may have (ids are far shorter than a billion bytes).
_LEN_DIGITS = 9
#: Where receive.lua found an entry it could not read, by the ``<where>`` of its stand-in seq.
_STAND_IN = re.compile(rb"[0-9a-f]+-(ready|delayed|inflight|nodata)\.")
_ENTRY_PROBLEMS = {
    b"ready": "ready entry %s is not <seq>#<n>",
    b"delayed": "delayed entry %s is not <seq>#<n>",
    b"inflight": "in-flight entry %s is not <seq>#<n>#<token>",
    b"nodata": "entry %s has no data record",
}


def _framed(data: object) -> tuple[str, bytes] | None:
    """(id, body) of a data value ``<len(id)>:<id><body>``, or None when it is not one."""
    if type(data) is not bytes:
        return None
    colon = data.find(b":", 0, _LEN_DIGITS + 1)
    if colon < 1 or not data[:colon].isdigit():
        return None
    end = colon + 1 + int(data[:colon])
    if end == colon + 1 or end > len(data):
        return None
    try:
        return data[colon + 1 : end].decode(), data[end:]
    except UnicodeDecodeError:
        return None


def _framing_problem(data: bytes) -> str:
    colon = data.find(b":", 0, _LEN_DIGITS + 1)
    if colon < 1 or not data[:colon].isdigit():
        return "no <len>: prefix"
    length = int(data[:colon])
    if length == 0:
        return "the message id is empty"
    if colon + 1 + length > len(data):
        return f"an id of {length} bytes runs past the end of its {len(data)} bytes"
    return "the message id is not UTF-8"


def _show(raw: bytes) -> str:
    return repr(raw[:60]) + ("..." if len(raw) > 60 else "")


def _stand_in_id(seq: bytes) -> str:
    return "corrupt-" + seq.decode("utf-8", "backslashreplace")


def _unreadable(seq: bytes, data: object) -> tuple[str, bytes]:
    """What is wrong with a data record that is not framed, and the bytes its dead letter keeps.

    A stand-in record of receive.lua (``"0:" + raw entry``) keeps the raw entry; any other
    keeps the whole data value.
    """
    if type(data) is not bytes:
        return f"data record {_show(seq)} is missing", b""
    stand_in = _STAND_IN.match(seq)
    if stand_in is not None and data.startswith(b"0:"):
        return _ENTRY_PROBLEMS[stand_in.group(1)] % _show(data[2:]), data[2:]
    return f"data record {_show(seq)} is not <len>:<id><body>: {_framing_problem(data)}", data


def _delivery(queue: str, member: bytes, data: object, deadline: float) -> Delivery:
    """One delivery of a receive reply; a record that cannot be read becomes a corrupt one."""
    seq, _, rest = member.partition(b"#")
    count = rest.partition(b"#")[0]
    attempt = int(count) if count.isdigit() and len(count) <= _LEN_DIGITS + 1 else 1
    record = _framed(data)
    if record is not None:
        return Delivery(queue, record[0], record[1], member, attempt, deadline)
    problem, raw = _unreadable(seq, data)
    return Delivery(queue, _stand_in_id(seq), raw, member, attempt, deadline, corrupt=problem)


def _dead_letter_of(
    queue: str, seq: bytes, dead_at: object, data: object, info: object
) -> DeadLetter:
    """A dead letter as stored, whatever its data and info hold."""
    record = _framed(data)
    if record is None:
        mid, body = _stand_in_id(seq), data if type(data) is bytes else b""
    else:
        mid, body = record
    attempt, reason = 0, "unknown"
    if type(info) is bytes:
        count, _, text = info.partition(b"|")
        attempt = int(count) if count.isdigit() and len(count) <= 18 else 0
        reason = text.decode("utf-8", "replace") or "unknown"
    return DeadLetter(queue, mid, body, reason, _number(dead_at), attempt)


def _number(value: object) -> float:
    try:
        return float(value)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        return 0.0


def _seq_time(entry: bytes) -> float | None:
    """Enqueue time (server clock, seconds) carried by a seq or an entry that starts with one."""
    head = entry.split(b"-", 1)[0]
    if not 0 < len(head) <= 12:  # 12 hex digits of milliseconds: beyond the year 10000
        return None
    try:
        return int(head, 16) / 1000.0
    except ValueError:
        return None


def _is_wrong_storage(exc: rx.ResponseError) -> bool:
    """Did a script meet a key of the wrong type, or a seq counter that holds no count?"""
    text = str(exc)
    return "WRONGTYPE" in text or "ACKWISE_CORRUPT" in text


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
        self._link = Link(self.settings, on_connect=self._check_server)
        self._last_used = 0.0
        self._keys: dict[str, _Keys] = {}
        self._queues_key = f"{{{self.settings.prefix}}}:queues".encode()
        self._token_prefix = ""
        self._tokens = itertools.count(1)

    def __repr__(self) -> str:
        return f"<RedisAdapter {self.settings.where} prefix={self.settings.prefix!r}>"

    # -- lifecycle -------------------------------------------------------------------------
    def _errors(self) -> Any:
        return self._link.errors()

    def open(self) -> None:
        if self._link.is_open:
            return
        self._link.connection()
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
        self._link.close()

    def _connection(self) -> Any:
        if not self._link.is_open:
            self.open()
        conn = self._link.connection()
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

    def _eval(self, script: Script, keys: Sequence[bytes], args: Sequence[Any]) -> Any:
        self._connection()  # the idle check first
        return self._link.eval(script, keys, args)

    def _run(self, script: Script, k: _Keys, keys: Sequence[bytes], args: Sequence[Any]) -> Any:
        """Run a script of the queue whose keys are ``k``, past a wrong-typed key of it.

        The failed call wrote nothing (no script writes before its checks), so it runs once more
        after the quarantine, also when another client set the key aside first.
        """
        try:
            return self._eval(script, keys, args)
        except rx.ResponseError as exc:
            if not _is_wrong_storage(exc):
                raise
            self._quarantine(k.typed)
        return self._eval(script, keys, args)

    def _quarantine(self, typed: Sequence[tuple[bytes, str]]) -> None:
        """Rename aside the keys that hold what ackwise never writes there, one ERROR each."""
        wants = dict(typed)
        moved = self._eval(_QUARANTINE, list(wants), list(wants.values()))
        for i in range(0, len(moved) - 2, 3):
            key, held, aside = moved[i : i + 3]
            want = wants.get(key, "?")
            log.error(
                "Redis key %s held a %s where ackwise keeps a %s: renamed it to %s (kept for "
                "inspection; delete it when done) and went on",
                key.decode("utf-8", "backslashreplace"),
                held.decode(),
                "count" if want == "counter" else want,
                aside.decode("utf-8", "backslashreplace"),
            )

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
            self._registry("SADD", self._queues_key, queue.name)

    def queues(self) -> Sequence[str]:
        with self._errors():
            names = self._registry("SMEMBERS", self._queues_key)
        return sorted(n.decode("utf-8", "backslashreplace") for n in names)

    def _registry(self, *command: Any) -> Any:
        """A command on the set of queue names, past a wrong-typed key (set aside, as queues')."""
        conn = self._connection()
        try:
            conn.send_command(*command)
            return conn.read_response()
        except rx.ResponseError as exc:
            if not _is_wrong_storage(exc):
                raise
            self._quarantine(((self._queues_key, "set"),))
        conn.send_command(*command)
        return conn.read_response()

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
                self._run(_PUBLISH, k, keys, (b"0", _pack(messages[0])))
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
                self._run(_PUBLISH, k, keys, args)

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
                self._run(_PUBLISH_DEAD, k, keys, args)

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
            reply = self._run(_RECEIVE, k, keys, (n, lease_arg, self._token(), SWEEP_LIMIT))
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
                    self._wait_for_wakeup(k, remaining)
                reply = self._run(_RECEIVE, k, keys, (n, lease_arg, self._token(), SWEEP_LIMIT))
                if reply[0]:
                    return self._deliveries(queue, reply)

    def _wait_for_wakeup(self, k: _Keys, timeout: float) -> None:
        """Block until a publisher (or a receiver with more ready) pushes a token, or timeout."""
        conn = self._connection()
        # BLPOP treats 0 as "forever"; the socket must outwait the server-side timeout.
        timeout = min(max(timeout, 0.001), max(self.settings.socket_timeout - 1.0, 0.5))
        try:
            conn.send_command("BLPOP", k.notify, f"{timeout:.3f}")
            conn.read_response(timeout=timeout + self.settings.socket_timeout)
        except rx.ResponseError as exc:  # a wrong-typed notify key: set it aside, look again
            if not _is_wrong_storage(exc):
                raise
            self._quarantine(k.typed)

    @staticmethod
    def _deliveries(queue: str, reply: list[Any]) -> list[Delivery]:
        """The deliveries of a receive reply; never raises on what the records hold."""
        if not reply or not reply[0]:
            return []
        deadline = _number(reply[0])
        return [
            _delivery(queue, reply[i], reply[i + 1], deadline) for i in range(1, len(reply) - 1, 2)
        ]

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
        self._ack(deliveries, b"late")

    def ack_before_start(self, deliveries: Sequence[Delivery]) -> None:
        """Ack, and remember each receipt until its lease would have ended (lua/ack.lua).

        When a cut connection swallows the answer, the worker asks again after reconnecting:
        a receipt this call did ack is then no stale one, so its task runs instead of being
        lost unrun; one it did not ack is acked now, or is stale if its lease moved on.
        """
        self._ack(deliveries, b"early")

    def _ack(self, deliveries: Sequence[Delivery], mode: bytes) -> None:
        if not deliveries:
            return
        stale: list[Delivery] = []
        with self._errors():
            for queue, group in self._by_queue(deliveries):
                k = self.keys(queue)
                keys = (k.inflight, k.data, k.early)
                for chunk in _chunks(group, SETTLE_CHUNK):
                    positions = self._run(_ACK, k, keys, [mode, *(d.receipt for d in chunk)])
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
                k = self.keys(queue)
                keys = (k.inflight, k.early)
                for chunk in _chunks(group, SETTLE_CHUNK):
                    args = [lease_arg, *(d.receipt for d in chunk)]
                    positions = self._run(_EXTEND, k, keys, args)
                    stale.extend(chunk[p - 1] for p in positions)
        if stale:
            raise StaleReceipt(stale, "extend")

    def nack(self, delivery: Delivery, *, delay: float = 0.0) -> None:
        delay = delay if delay > 0 else 0.0
        if delay:
            self.check_delay(delay)
        k = self.keys(delivery.queue)
        with self._errors():
            done = self._run(
                _NACK,
                k,
                (k.inflight, k.ready, k.delayed, k.notify),
                (delivery.receipt, repr(delay)),
            )
        if not done:
            raise StaleReceipt([delivery], "nack")

    def dead_letter(self, delivery: Delivery, *, reason: str, body: bytes | None = None) -> None:
        k = self.keys(delivery.queue)
        if body is not None:
            replacement = _pack(Outgoing(delivery.message_id, body))
        elif delivery.corrupt is not None:
            # Framed under its stand-in id, the bytes as found: listed, replayed and deleted by
            # that id; a replay is then a well-framed message (a decode_error if it is none).
            replacement = _pack(Outgoing(delivery.message_id, delivery.body))
        else:
            replacement = b""
        with self._errors():
            done = self._run(
                _DEAD_LETTER,
                k,
                (k.inflight, k.data, k.dead, k.dead_info, k.dead_ids),
                (delivery.receipt, delivery.message_id, reason, replacement),
            )
        if not done:
            raise StaleReceipt([delivery], "dead_letter")

    # -- inspection ------------------------------------------------------------------------
    def stats(self, queue: str) -> QueueStats:
        k = self.keys(queue)
        with self._errors():
            reply = self._run(_STATS, k, (k.ready, k.delayed, k.inflight, k.dead), ())
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
            reply = self._run(_DEAD_LETTERS, k, (k.dead, k.data, k.dead_info), (limit,))
        return [_dead_letter_of(queue, *reply[i : i + 4]) for i in range(0, len(reply) - 3, 4)]

    def requeue_dead(self, queue: str, message_ids: Sequence[str]) -> int:
        if not message_ids:
            return 0
        k = self.keys(queue)
        keys = (k.dead, k.dead_info, k.dead_ids, k.data, k.ready, k.seq, k.notify)
        moved = 0
        with self._errors():
            for chunk in _chunks(list(message_ids), PUBLISH_CHUNK):
                moved += int(self._run(_REQUEUE_DEAD, k, keys, chunk))
        return moved

    def delete_dead(self, queue: str, message_ids: Sequence[str] | None = None) -> int:
        k = self.keys(queue)
        keys = (k.dead, k.dead_info, k.dead_ids, k.data)
        with self._errors():
            if message_ids is None:
                return int(self._run(_DELETE_DEAD, k, keys, ("*",)))
            deleted = 0
            for chunk in _chunks(list(message_ids), PUBLISH_CHUNK):
                deleted += int(self._run(_DELETE_DEAD, k, keys, ("=", *chunk)))
            return deleted

    def purge(self, queue: str) -> int:
        k = self.keys(queue)
        keys = (k.ready, k.delayed, k.data)
        total = 0
        with self._errors():
            while True:
                ready, delayed = self._run(_PURGE, k, keys, (PURGE_CHUNK,))
                total += int(ready) + int(delayed)
                if ready < PURGE_CHUNK and delayed < PURGE_CHUNK:
                    return total
