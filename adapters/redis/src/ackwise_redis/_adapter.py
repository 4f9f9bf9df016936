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
``early`` (sorted set, score = when it is forgotten)
    receipts acked early, so that an early ack asked again after its answer was lost is
    known as done (``lua/ack.lua``); kept until the adapter had the answer, at most
    ``EARLY_MEMORY`` seconds past the lease.
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

The adapter holds one object per concern, each in its own module and using those before it by
their methods only: the server (:class:`~ackwise_redis._server.Server`: the connection, the
server's checks on connect, running a script, the limits of one call), the queues' keys
(:class:`~ackwise_redis._keys.QueueKeys`: a queue's keys and the quarantine of wrong-typed
ones) and the browser (:class:`~ackwise_redis._browse.Browser`: stats, dead letters,
purging); :mod:`~ackwise_redis._records` reads and writes what data records and replies hold.
This module keeps declaring, producing, consuming and settling.
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import redis.exceptions as rx

from ackwise.errors import AdapterError, MessageTooLarge, StaleReceipt, TransientAdapterError
from ackwise.spi import (
    Adapter,
    BrokerURL,
    Capabilities,
    DeadLetter,
    Delivery,
    Outgoing,
    QueueSpec,
    QueueStats,
)
from ackwise_redis._browse import _DEAD_LETTERS as _DEAD_LETTERS
from ackwise_redis._browse import _DELETE_DEAD as _DELETE_DEAD
from ackwise_redis._browse import _PURGE as _PURGE
from ackwise_redis._browse import _REQUEUE_DEAD as _REQUEUE_DEAD
from ackwise_redis._browse import _STATS as _STATS
from ackwise_redis._browse import Browser
from ackwise_redis._connection import _LOST, load_script
from ackwise_redis._keys import _KEY_TYPES as _KEY_TYPES
from ackwise_redis._keys import _QUARANTINE as _QUARANTINE
from ackwise_redis._keys import QueueKeys, is_wrong_storage
from ackwise_redis._keys import _Keys as _Keys
from ackwise_redis._keys import _keys as _keys
from ackwise_redis._records import _delivery, _number, _pack
from ackwise_redis._server import (
    PUBLISH_CHUNK,
    PUBLISH_CHUNK_BYTES,
    RECEIVE_LIMIT,
    SETTLE_CHUNK,
    SWEEP_LIMIT,
    Server,
    chunks,
)
from ackwise_redis._url import RedisSettings, parse_redis_url

# The ``X as X`` imports above re-export names that moved to the part modules and are
# imported from here (every script by its name, the key schema, message framing).

__all__ = ["MAX_MESSAGE_SIZE", "RedisAdapter"]

log = logging.getLogger(__name__)

#: Largest encoded envelope accepted.  Redis takes strings up to 512 MiB, but every message
#: passes through Redis' single thread (and a receive returns a batch of them in one reply): a
#: 64 MiB message already stalls every other client for tens of milliseconds.  Keep payloads
#: small and pass references to large data.
MAX_MESSAGE_SIZE = 64 * 1024 * 1024
#: Seconds past its lease that an early ack whose answer never came back is remembered: a
#: worker cut off from Redis (or waiting out a restart) that long still learns, when it asks
#: again, that its delivery was acked, and runs the task.  Twice the worker's default
#: --broker-timeout, after which it gives up.  Answered acks are forgotten at once.
EARLY_MEMORY = 120

# -- scripts -------------------------------------------------------------------------------


_RECEIVE = load_script("receive", lib=True)
_PUBLISH = load_script("publish", lib=True)
_ACK = load_script("ack", lib=True)
_EXTEND = load_script("extend")
_NACK = load_script("nack", lib=True)
_DEAD_LETTER = load_script("dead_letter")
_PUBLISH_DEAD = load_script("publish_dead", lib=True)


class RedisAdapter(Adapter):
    """Adapter for one Redis server (standalone, or a primary behind a proxy / DNS failover).

    Durability is Redis': with ``appendonly yes`` and ``appendfsync everysec`` a Redis crash
    may lose up to a second of acknowledged writes (published messages, acks, dead letters);
    ``appendfsync always`` loses none at a cost per write; with no persistence a restart loses
    everything.  See the package README.
    """

    name = "redis"
    # Everything natively (the defaults: unbounded delays, per-message leases, exact counts),
    # but messages larger than MAX_MESSAGE_SIZE; priorities in the urgent set (lua/lib.lua).
    capabilities = Capabilities(
        max_message_size=MAX_MESSAGE_SIZE, priorities=True, deep_prefetch=True
    )

    def __init__(self, url: BrokerURL) -> None:
        super().__init__(url)
        self.settings: RedisSettings = parse_redis_url(url)
        self._server = Server(self.settings)
        self._queue_keys = QueueKeys(self.settings, self._server)
        self._browser = Browser(self._server, self._queue_keys)
        #: The last receive_later's reply, until it is read (:class:`_Asked`).
        self._unread: _Asked | None = None
        #: Receipts whose early ack was answered, by queue: forgotten by the next early ack.
        self._answered: dict[str, list[Any]] = {}

    def __repr__(self) -> str:
        return f"<RedisAdapter {self.settings.where} prefix={self.settings.prefix!r}>"

    # -- lifecycle -------------------------------------------------------------------------
    def _errors(self) -> Any:
        return self._server.errors()

    def open(self) -> None:
        self._server.open()

    def close(self) -> None:
        self._server.close()
        self._unread = None

    # -- topology --------------------------------------------------------------------------
    def keys(self, queue: str) -> _Keys:
        """The Redis keys of ``queue``."""
        return self._queue_keys.keys(queue)

    def declare(self, queue: QueueSpec) -> None:
        keys = self._queue_keys
        keys.keys(queue.name)
        with self._errors():
            keys.registry("SADD", keys.queues_key, queue.name)

    def queues(self) -> Sequence[str]:
        keys = self._queue_keys
        with self._errors():
            names = keys.registry("SMEMBERS", keys.queues_key)
        return sorted(n.decode("utf-8", "backslashreplace") for n in names)

    def delete_queue(self, queue: str) -> None:
        """Delete the queue's keys, any of them set aside by the quarantine, and its name."""
        self._browser.delete_queue(queue)

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
        k = self._queue_keys.keys(queue)
        keys = (k.ready, k.delayed, k.data, k.seq, k.notify, k.urgent)
        delayed = self._check_sizes(messages)
        self.check_priorities(messages)
        prioritised = any(m.priority for m in messages)
        with self._errors():
            if len(messages) == 1 and not (delayed or prioritised):  # the hot path
                self._queue_keys.run(_PUBLISH, k, keys, (b"0", _pack(messages[0])))
                self._wait_for_replicas(k, len(messages))
                return
            for chunk in self._publish_chunks(messages):
                args: list[Any]
                if prioritised:
                    args = [b"2"]
                    for m in chunk:
                        args += (_pack(m), repr(max(m.delay, 0.0)), b"%d" % m.priority)
                elif delayed:
                    args = [b"1"]
                    for m in chunk:
                        args.append(_pack(m))
                        args.append(repr(max(m.delay, 0.0)))
                else:
                    args = [b"0", *map(_pack, chunk)]
                self._queue_keys.run(_PUBLISH, k, keys, args)
            self._wait_for_replicas(k, len(messages))

    def _wait_for_replicas(self, k: _Keys, count: int) -> None:
        """``WAIT`` for ``wait_replicas`` replicas to hold what this connection wrote."""
        want = self.settings.wait_replicas
        if not want:
            return
        timeout_ms = max(1, int(self.settings.wait_timeout * 1000))
        have = int(self._server.link.command("WAIT", want, timeout_ms, key=k.ready))
        if have < want:
            raise TransientAdapterError(
                f"{self.settings.where}: {count} message(s) published to the primary, but only "
                f"{have} of the {want} replicas asked for (wait_replicas) had them within "
                f"{self.settings.wait_timeout:g} s; a failover now could lose them"
            )

    def publish_dead(self, queue: str, messages: Sequence[Outgoing], *, reason: str) -> None:
        if not messages:
            return
        k = self._queue_keys.keys(queue)
        keys = (k.data, k.dead, k.dead_info, k.dead_ids, k.seq)
        self.check_priorities(messages)
        with self._errors():
            for chunk in self._publish_chunks(messages):
                args: list[Any] = [reason]
                for m in chunk:
                    args += (m.id, _pack(m), b"%d" % m.priority)
                self._queue_keys.run(_PUBLISH_DEAD, k, keys, args)

    # -- consuming -------------------------------------------------------------------------
    def receive(
        self, queue: str, *, max_messages: int, wait: float, lease: float
    ) -> Sequence[Delivery]:
        if max_messages < 1:
            return []
        k = self._queue_keys.keys(queue)
        keys = (k.ready, k.delayed, k.inflight, k.data, k.notify, k.urgent)
        n = min(max_messages, RECEIVE_LIMIT)
        lease_arg = repr(float(lease))
        with self._errors():
            reply = self._queue_keys.run(
                _RECEIVE, k, keys, (n, lease_arg, self._server.token(), SWEEP_LIMIT)
            )
            if reply[0] or wait <= 0:
                return _deliveries(queue, reply)
            end = time.monotonic() + wait
            while True:
                remaining = end - time.monotonic()
                if remaining <= 0:
                    return []
                if reply[1]:
                    remaining = min(remaining, max(float(reply[1]), 0.0))
                args = (n, lease_arg, self._server.token(), SWEEP_LIMIT)
                if remaining > 0.0005:
                    reply = self._wait_then_receive(k, remaining, keys, args)
                else:
                    reply = self._queue_keys.run(_RECEIVE, k, keys, args)
                if reply[0]:
                    return _deliveries(queue, reply)

    def receive_later(
        self, queue: str, *, max_messages: int, lease: float
    ) -> Callable[[], Sequence[Delivery]]:
        # The script goes out now on a connection of its own, and its reply is read when
        # the worker asks for it: Redis runs the script while the worker runs its loop.
        k = self._queue_keys.keys(queue)
        keys = (k.ready, k.delayed, k.inflight, k.data, k.notify, k.urgent)
        n = max(1, min(max_messages, RECEIVE_LIMIT))
        args = (n, repr(float(lease)), self._server.token(), SWEEP_LIMIT)
        unread, self._unread = self._unread, None
        if unread is not None:  # asked again before reading: that answer's leases run out
            with contextlib.suppress(AdapterError), self._errors():
                unread.reply()
        with self._errors():
            conn = self._server.ahead_connection(k.ready)
            try:
                conn.send_command("EVALSHA", _RECEIVE.sha, len(keys), *keys, *args)
            except _LOST:
                conn.disconnect()  # a late reply must never answer the next command
                raise
        asked = self._unread = _Asked(
            self._server, conn, queue, n, lease, self.receive, self._forget_unread
        )
        return asked

    def _forget_unread(self, asked: _Asked) -> None:
        """``asked`` is being read: it is unread no more."""
        if self._unread is asked:
            self._unread = None

    def _wait_then_receive(
        self, k: _Keys, timeout: float, keys: Sequence[bytes], args: Sequence[Any]
    ) -> Any:
        """Block until a publisher (or a receiver with more ready) pushes a token, or timeout,
        then receive: both commands go out together, so Redis runs the receive script the
        moment the wait ends, without a round trip in between."""
        conn = self._server.connection(k.notify)
        # BLPOP treats 0 as "forever"; the socket must outwait the server-side timeout.
        timeout = min(max(timeout, 0.001), max(self.settings.socket_timeout - 1.0, 0.5))
        try:
            conn.send_packed_command(
                conn.pack_commands(
                    [
                        ("BLPOP", k.notify, f"{timeout:.3f}"),
                        ("EVALSHA", _RECEIVE.sha, len(keys), *keys, *args),
                    ]
                )
            )
            replies: list[Any] = []
            for read_timeout in (timeout + self.settings.socket_timeout, None):
                try:  # an error reply is read too: the connection stays in step
                    replies.append(conn.read_response(timeout=read_timeout))
                except rx.ResponseError as exc:
                    replies.append(exc)
        except (rx.ConnectionError, rx.TimeoutError, OSError):
            conn.disconnect()  # a late reply must never answer the next command
            raise
        waited, received = replies
        if isinstance(waited, rx.AskError):  # MOVED too: the slot is elsewhere (the script
            self._server.link.redirected(waited)  # failed the same way): the one-command path
            return self._queue_keys.run(_RECEIVE, k, keys, args)
        if isinstance(waited, rx.ResponseError):
            if not is_wrong_storage(waited):
                raise waited
            self._queue_keys.quarantine(
                k.typed
            )  # a wrong-typed notify key: set it aside, look again
        if isinstance(received, rx.ResponseError):
            # The script not loaded yet, or a wrong-typed key: the one-command path deals
            # with either (the failed call wrote nothing).
            return self._queue_keys.run(_RECEIVE, k, keys, args)
        return received

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
        """Ack, and remember each receipt until the answer reached this adapter (lua/ack.lua).

        When a cut connection or a broker restart swallows the answer, the worker asks again
        after reconnecting: a receipt this call did ack is then no stale one, so its task
        runs instead of being lost unrun; one it did not ack is acked now, or is stale if its
        lease moved on.  The memory of an answered ack is dropped by this adapter's next early
        ack on the queue; an unanswered one lasts EARLY_MEMORY past its lease.
        """
        self._ack(deliveries, b"early")

    def _ack(self, deliveries: Sequence[Delivery], mode: bytes) -> None:
        if not deliveries:
            return
        stale: list[Delivery] = []
        answered: dict[str, list[bytes]] = {}
        with self._errors():
            for queue, group in self._by_queue(deliveries):
                k = self._queue_keys.keys(queue)
                keys = (k.inflight, k.data, k.early)
                for chunk in chunks(group, SETTLE_CHUNK):
                    receipts = [d.receipt for d in chunk]
                    args: list[Any] = [mode, *receipts]
                    if mode == b"early":
                        forget = self._answered.pop(queue, [])[:SETTLE_CHUNK]
                        args = [mode, EARLY_MEMORY, len(forget), *forget, *receipts]
                    positions = self._queue_keys.run(_ACK, k, keys, args)
                    stale.extend(chunk[p - 1] for p in positions)
                    if mode == b"early":
                        refused = set(positions)
                        answered.setdefault(queue, []).extend(
                            r for i, r in enumerate(receipts, 1) if i not in refused
                        )
        # Only a call that returned had all its answers (a retry of a failed one asks again).
        for queue, receipts in answered.items():
            self._answered.setdefault(queue, []).extend(receipts)
        if stale:
            raise StaleReceipt(stale, "ack")

    def extend(self, deliveries: Sequence[Delivery], *, lease: float) -> None:
        if not deliveries:
            return
        stale: list[Delivery] = []
        lease_arg = repr(float(lease))
        with self._errors():
            for queue, group in self._by_queue(deliveries):
                k = self._queue_keys.keys(queue)
                keys = (k.inflight, k.early)
                for chunk in chunks(group, SETTLE_CHUNK):
                    args = [lease_arg, *(d.receipt for d in chunk)]
                    positions = self._queue_keys.run(_EXTEND, k, keys, args)
                    stale.extend(chunk[p - 1] for p in positions)
        if stale:
            raise StaleReceipt(stale, "extend")

    def nack(self, delivery: Delivery, *, delay: float = 0.0) -> None:
        delay = delay if delay > 0 else 0.0
        if delay:
            self.check_delay(delay)
        k = self._queue_keys.keys(delivery.queue)
        with self._errors():
            done = self._queue_keys.run(
                _NACK,
                k,
                (k.inflight, k.ready, k.delayed, k.notify, k.urgent),
                (delivery.receipt, repr(delay)),
            )
        if not done:
            raise StaleReceipt([delivery], "nack")

    def dead_letter(self, delivery: Delivery, *, reason: str, body: bytes | None = None) -> None:
        k = self._queue_keys.keys(delivery.queue)
        if body is not None:
            replacement = _pack(Outgoing(delivery.message_id, body))
        elif delivery.corrupt is not None:
            # Framed under its stand-in id, the bytes as found: listed, replayed and deleted by
            # that id; a replay is then a well-framed message (a decode_error if it is none).
            replacement = _pack(Outgoing(delivery.message_id, delivery.body))
        else:
            replacement = b""
        with self._errors():
            done = self._queue_keys.run(
                _DEAD_LETTER,
                k,
                (k.inflight, k.data, k.dead, k.dead_info, k.dead_ids),
                (delivery.receipt, delivery.message_id, reason, replacement),
            )
        if not done:
            raise StaleReceipt([delivery], "dead_letter")

    # -- inspection ------------------------------------------------------------------------
    def stats(self, queue: str) -> QueueStats:
        """Exact counts and the oldest ready message's age, from one script call."""
        return self._browser.stats(queue)

    def dead_letters(self, queue: str, *, limit: int = 100) -> Sequence[DeadLetter]:
        """Oldest first, from one script call."""
        return self._browser.dead_letters(queue, limit=limit)

    def requeue_dead(self, queue: str, message_ids: Sequence[str]) -> int:
        """Ready again as new deliveries, a script call per chunk of ids; each message moves
        atomically."""
        return self._browser.requeue_dead(queue, message_ids)

    def delete_dead(self, queue: str, message_ids: Sequence[str] | None = None) -> int:
        return self._browser.delete_dead(queue, message_ids)

    def purge(self, queue: str) -> int:
        """Ready and delayed messages, a script call per chunk until a short one."""
        return self._browser.purge(queue)


def _deliveries(queue: str, reply: list[Any]) -> list[Delivery]:
    """The deliveries of a receive reply; never raises on what the records hold."""
    if not reply or not reply[0]:
        return []
    deadline = _number(reply[0])
    return [_delivery(queue, reply[i], reply[i + 1], deadline) for i in range(1, len(reply) - 1, 2)]


class _Asked:
    """A receive script that :meth:`RedisAdapter.receive_later` sent: its reply, read once.

    ``receive``: the adapter's, for when the script did not run; ``taken(self)`` tells the
    adapter it is being read."""

    __slots__ = ("_conn", "_lease", "_n", "_queue", "_read", "_receive", "_server", "_taken")

    def __init__(
        self,
        server: Server,
        conn: Any,
        queue: str,
        n: int,
        lease: float,
        receive: Callable[..., Sequence[Delivery]],
        taken: Callable[[_Asked], None],
    ) -> None:
        self._server, self._conn, self._queue, self._n, self._lease = (
            server,
            conn,
            queue,
            n,
            lease,
        )
        self._receive, self._taken = receive, taken
        self._read = False

    def __call__(self) -> Sequence[Delivery]:
        self._taken(self)
        if self._read:
            return []  # read and dropped when the adapter was asked again first
        with self._server.errors():
            reply = self.reply()
        if reply is None:  # the one-call path loads the script, follows, sets aside
            return self._receive(self._queue, max_messages=self._n, wait=0, lease=self._lease)
        return _deliveries(self._queue, reply)

    def reply(self) -> Any:
        """The script's reply (redis-py errors), or None when the script did not run: it
        writes nothing before its checks (NOSCRIPT, a cluster redirection, a wrong-typed key)."""
        self._read = True
        conn = self._conn
        try:
            return conn.read_response()
        except rx.ResponseError as exc:
            if isinstance(exc, rx.AskError):  # MOVED too: note where the slot is
                self._server.ahead.redirected(exc)
            elif not isinstance(exc, rx.NoScriptError):
                conn.disconnect()  # a demoted master, a wrong-typed key: start anew
            return None
        except _LOST:
            conn.disconnect()
            raise
