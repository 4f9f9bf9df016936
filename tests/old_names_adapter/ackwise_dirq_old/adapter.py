"""``dirq:///path``: a broker that is a directory of files, shared by processes on one host.

Each queue is a directory under the root; each message is one file, and where the file sits
(and its name) is the message's state::

    <root>/<queue>/ready/<due_us>-<seq>-<n>     ready, or delayed until due_us
    <root>/<queue>/leased/<seq>-<n>-<token>     in flight; the file's mtime is the lease deadline
    <root>/<queue>/dead/<seq>                   a dead letter
    <root>/<queue>/tmp/                         files being written, renamed into place whole
    <root>/<queue>/lock                         flock()ed by every operation on the queue
    <root>/<queue>/seq                          the last sequence number handed out

``due_us`` is wall-clock microseconds (``time.time()``), ``seq`` the publication order, ``n``
the deliveries so far (so ``attempt`` is exact), ``token`` random per delivery.  A file holds
one JSON header line (``{"id": ..., "enqueued_at": ...}``, plus ``reason``, ``dead_at`` and
``attempt`` for a dead letter) and then the body's bytes.

Every state change is one ``os.rename`` (atomic: the file is in the old place or the new one,
whatever process dies when), taken while holding the queue's ``flock`` so that no two
processes decide about the same file at once.  The kernel drops the lock of a process that
dies.  A receipt is the leased file's name: a redelivery renames the file to a new token, so
an old receipt names no file and every settlement with it raises ``StaleReceipt``.

Durability: nothing is fsync'ed, so the queue survives any process crash but not a power
loss.  Needs a local file system with sub-second mtimes (ext4, xfs, btrfs, tmpfs, APFS).

Options (query string): ``busy_timeout=SECONDS`` (default 10), how long an operation waits
for another process's lock before raising ``TransientAdapterError``.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import re
import secrets
import shutil
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import AbstractContextManager
from pathlib import Path
from typing import Any

from ackwise import (
    Adapter,
    BrokerURL,
    Capabilities,
    DeadLetter,
    Delivery,
    Outgoing,
    QueueSpec,
    QueueStats,
)
from ackwise.errors import (
    AdapterError,
    BrokerUnavailable,
    ErrorTable,
    InvalidBrokerURL,
    PermanentAdapterError,
    StaleReceipt,
    TransientAdapterError,
    from_table,
    mapping_errors,
    redact,
)

__all__ = ["DirQueueAdapter", "map_os_errors"]

# -- errors: the "driver" is the operating system, its exceptions are OSErrors --------------
#: The nearest listed base class wins (``from_table``); anything unlisted is permanent.
ERRORS: ErrorTable = {
    PermissionError: (PermanentAdapterError, "permission denied"),
    NotADirectoryError: (PermanentAdapterError, "not a directory"),
    FileNotFoundError: (BrokerUnavailable, "the broker directory is gone"),  # e.g. unmounted
    OSError: (TransientAdapterError, "file system error"),  # disk full, EIO: may pass
}


def _translate(exc: BaseException, where: str, secret: str | None) -> AdapterError:
    return from_table(exc, ERRORS, where, redact(str(exc), secret))


def map_os_errors(where: str) -> AbstractContextManager[None]:
    """Re-raise any ``OSError`` inside as the ackwise error :data:`ERRORS` gives for it."""
    return mapping_errors(_translate, (), where)


# -- names and file contents ------------------------------------------------------------------
_QUEUE_NAME = re.compile(r"[A-Za-z0-9_.:\-]{1,80}")  # ackwise's own rule for queue names
_READY = re.compile(r"(\d+)-(\d+)-(\d+)")  # due_us, seq, n
_LEASED = re.compile(r"(\d+)-(\d+)-([0-9a-f]+)")  # seq, n, token


def _us(t: float) -> int:
    return int(t * 1_000_000)


def _ready_name(due: float, seq: int, n: int) -> str:
    return f"{_us(due):016d}-{seq:020d}-{n}"


def _encode(header: dict[str, Any], body: bytes) -> bytes:
    return json.dumps(header).encode() + b"\n" + body


def _decode(raw: bytes) -> tuple[dict[str, Any] | None, bytes, str | None]:
    """``(header, body, None)``, or ``(None, raw, what is wrong)`` for a file ackwise did
    not write: such a file is delivered as a corrupt record, never raised about."""
    head, newline, body = raw.partition(b"\n")
    try:
        header = json.loads(head) if newline else None
    except ValueError:
        return None, raw, "the header line is not JSON"
    if not isinstance(header, dict) or not isinstance(header.get("id"), str):
        return None, raw, "no header line with a string id"
    return header, body, None


def _names(directory: Path) -> list[str]:
    try:
        return os.listdir(directory)
    except FileNotFoundError:  # a queue nobody declared yet (or deleted meanwhile)
        return []


def _mtime(path: Path) -> float | None:
    try:
        return path.stat().st_mtime_ns / 1e9
    except FileNotFoundError:
        return None


class _Queue:
    """The paths of one queue."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.ready, self.leased, self.dead, self.tmp = (
            path / d for d in ("ready", "leased", "dead", "tmp")
        )
        self.lock, self.seq = path / "lock", path / "seq"


# -- the adapter ------------------------------------------------------------------------------
class DirQueueAdapter(Adapter):
    """A queue broker in a directory: every worker process on the host shares it.

    No connection is held between calls (each operation opens and closes the queue's lock
    file), so there is nothing to reopen after ``fork()`` and ``open``/``close`` are cheap.
    """

    name = "dirq"
    # The defaults: native unbounded delays, per-message leases, exact attempt counts,
    # native dead letters, several processes, oldest_age, purge reaches delayed messages.
    capabilities = Capabilities()

    def __init__(self, url: BrokerURL) -> None:
        super().__init__(url)
        if url.host or not url.path.startswith("/"):
            raise InvalidBrokerURL(
                f"broker URL {url}: expected dirq:///absolute/path (no host), "
                "e.g. dirq:///var/lib/app/queues"
            )
        options = dict(url.query)
        try:
            self.busy_timeout = float(options.pop("busy_timeout", "10"))
        except ValueError:
            raise InvalidBrokerURL(f"broker URL {url}: busy_timeout must be seconds") from None
        if options:
            raise InvalidBrokerURL(f"broker URL {url}: unknown option(s) {sorted(options)}")
        self.root = Path(url.path)

    def __repr__(self) -> str:
        return f"<DirQueueAdapter {self.root}>"

    # -- lifecycle: nothing to connect; open makes the root directory exist -------------------
    def open(self) -> None:
        with map_os_errors(f"dirq {self.root}: open"):
            self.root.mkdir(parents=True, exist_ok=True)

    def close(self) -> None:
        pass  # nothing is held; unsettled deliveries come back when their lease expires

    # -- helpers --------------------------------------------------------------------------
    def _queue(self, queue: str) -> _Queue:
        if not _QUEUE_NAME.fullmatch(queue) or queue in (".", ".."):
            raise PermanentAdapterError(f"dirq: invalid queue name {queue!r}")
        return _Queue(self.root / queue)

    @contextlib.contextmanager
    def _locked(self, queue: str, where: str) -> Iterator[_Queue]:
        """Hold the queue's lock (creating the queue's directories when missing); every
        ``OSError`` inside becomes an ackwise error."""
        q = self._queue(queue)
        with map_os_errors(f"dirq {self.root}: {where} {queue}"):
            try:
                fd = os.open(q.lock, os.O_RDWR | os.O_CREAT, 0o644)
            except FileNotFoundError:  # a new queue (the root must exist: not makedirs)
                q.path.mkdir(exist_ok=True)
                for d in (q.ready, q.leased, q.dead, q.tmp):
                    d.mkdir(exist_ok=True)
                fd = os.open(q.lock, os.O_RDWR | os.O_CREAT, 0o644)
            try:
                self._flock(fd, queue)
                yield q
            finally:
                os.close(fd)  # releases the lock

    def _flock(self, fd: int, queue: str) -> None:
        give_up = time.monotonic() + self.busy_timeout
        pause = 0.0005
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                return
            except BlockingIOError:
                if time.monotonic() >= give_up:
                    raise TransientAdapterError(
                        f"dirq {self.root}: queue {queue} stayed locked by another process "
                        f"for {self.busy_timeout:.0f}s (busy_timeout)"
                    ) from None
                time.sleep(pause)
                pause = min(pause * 2, 0.01)

    def _next_seqs(self, q: _Queue, count: int) -> int:
        """Reserve ``count`` sequence numbers (lock held); return the first."""
        try:
            last = int(q.seq.read_text() or 0)
        except FileNotFoundError:
            last = 0
        self._write(q, q.seq, str(last + count).encode())
        return last + 1

    def _write(self, q: _Queue, dest: Path, content: bytes) -> None:
        """Write ``content`` to ``dest`` whole or not at all: a temporary file, renamed."""
        tmp = q.tmp / secrets.token_hex(8)
        tmp.write_bytes(content)
        os.rename(tmp, dest)

    # -- topology ---------------------------------------------------------------------------
    def declare(self, queue: QueueSpec) -> None:
        with self._locked(queue.name, "declare") as q:
            for leftover in _names(q.tmp):  # written by a process that died mid-write
                (q.tmp / leftover).unlink(missing_ok=True)

    def queues(self) -> Sequence[str]:
        with map_os_errors(f"dirq {self.root}: queues"):
            return sorted(n for n in _names(self.root) if (self.root / n / "ready").is_dir())

    def delete_queue(self, queue: str) -> None:
        """Remove every file of ``queue``: its messages, in flight and dead ones too."""
        with self._locked(queue, "delete_queue") as q:
            shutil.rmtree(q.path)

    # -- producing --------------------------------------------------------------------------
    def publish(self, queue: str, messages: Sequence[Outgoing]) -> None:
        for m in messages:
            if m.delay > 0:
                self.check_delay(m.delay)  # always holds here; an adapter with limits needs it
        self.check_priorities(messages)  # no priorities here: a priority above 0 is refused
        if not messages:
            return
        with self._locked(queue, "publish") as q:
            now = time.time()
            first = self._next_seqs(q, len(messages))
            for seq, m in enumerate(messages, first):
                content = _encode({"id": m.id, "enqueued_at": now}, m.body)
                self._write(q, q.ready / _ready_name(now + max(m.delay, 0.0), seq, 0), content)

    def publish_dead(self, queue: str, messages: Sequence[Outgoing], *, reason: str) -> None:
        self.check_priorities(messages)
        if not messages:
            return
        with self._locked(queue, "publish_dead") as q:
            now = time.time()
            first = self._next_seqs(q, len(messages))
            for seq, m in enumerate(messages, first):
                header = {"id": m.id, "enqueued_at": now, "reason": reason, "dead_at": now}
                self._write(q, q.dead / f"{seq:020d}", _encode({**header, "attempt": 0}, m.body))

    # -- consuming --------------------------------------------------------------------------
    def receive(
        self, queue: str, *, max_messages: int, wait: float, lease: float
    ) -> Sequence[Delivery]:
        end = time.monotonic() + max(wait, 0.0)
        pause = 0.002
        while True:
            got = self._take(queue, max_messages, lease) if max_messages > 0 else []
            remaining = end - time.monotonic()
            if got or remaining <= 0:
                return got
            time.sleep(min(pause, remaining))  # poll: files have no "wake me" call
            pause = min(pause * 2, 0.05)

    def _take(self, queue: str, max_messages: int, lease: float) -> list[Delivery]:
        with self._locked(queue, "receive") as q:
            now = time.time()
            # Receivable: ready files that are due, and leased files whose lease expired
            # (a dead or stuck consumer's): that is how its messages come back.
            due: list[tuple[float, int, int, Path]] = []  # (since, seq, n, path)
            for name in _names(q.ready):
                if not (m := _READY.fullmatch(name)):  # not named by ackwise: due now
                    due.append((0.0, 0, 0, q.ready / name))
                elif int(m[1]) <= _us(now):
                    due.append((int(m[1]) / 1e6, int(m[2]), int(m[3]), q.ready / name))
            dead = set(_names(q.dead))
            for name in _names(q.leased):
                m = _LEASED.fullmatch(name)
                deadline = _mtime(q.leased / name)
                if not m:
                    due.append((0.0, 0, 0, q.leased / name))
                elif deadline is not None and deadline <= now:
                    if m[1] in dead:  # dead_letter() died before its unlink: finish it
                        (q.leased / name).unlink()
                        continue
                    due.append((deadline, int(m[1]), int(m[2]), q.leased / name))
            due.sort()
            deadline = now + lease
            out = []
            for _, seq, n, path in due[:max_messages]:
                seq = seq or self._next_seqs(q, 1)  # a foreign file gets a seq of its own
                receipt = f"{seq:020d}-{n + 1}-{secrets.token_hex(8)}"
                leased = q.leased / receipt
                os.rename(path, leased)  # taken and in flight in one step
                # A crash before this utime leaves an old mtime: the lease just ends early.
                os.utime(leased, ns=(_us(deadline) * 1000, _us(deadline) * 1000))
                out.append(self._delivery(queue, leased, receipt, seq, n + 1, deadline))
            return out

    def _delivery(
        self, queue: str, path: Path, receipt: str, seq: int, n: int, deadline: float
    ) -> Delivery:
        header, body, problem = _decode(path.read_bytes())
        if header is None:  # the worker dead-letters it `corrupt_record` and goes on
            return Delivery(
                queue, f"corrupt-{seq}", body, receipt, n, deadline, corrupt=f"{path}: {problem}"
            )
        return Delivery(queue, header["id"], body, receipt, n, deadline)

    # -- settling: a receipt that names no leased file is stale ------------------------------
    def _each(
        self,
        deliveries: Sequence[Delivery],
        operation: str,
        settle: Callable[[_Queue, Delivery], object],
    ) -> None:
        """Call ``settle(queue_paths, delivery)`` for each delivery under its queue's lock;
        then raise ``StaleReceipt`` naming those whose file was gone (nothing of them
        changed)."""
        stale: set[int] = set()
        for queue in dict.fromkeys(d.queue for d in deliveries):
            with self._locked(queue, operation) as q:
                for i, d in enumerate(deliveries):
                    if d.queue == queue:
                        try:
                            settle(q, d)
                        except FileNotFoundError:
                            stale.add(i)
        if stale:
            raise StaleReceipt([d for i, d in enumerate(deliveries) if i in stale], operation)

    def ack(self, deliveries: Sequence[Delivery]) -> None:
        self._each(deliveries, "ack", lambda q, d: (q.leased / d.receipt).unlink())

    def extend(self, deliveries: Sequence[Delivery], *, lease: float) -> None:
        ns = _us(time.time() + lease) * 1000
        self._each(deliveries, "extend", lambda q, d: os.utime(q.leased / d.receipt, ns=(ns, ns)))

    def nack(self, delivery: Delivery, *, delay: float = 0.0) -> None:
        if delay > 0:
            self.check_delay(delay)

        def back(q: _Queue, d: Delivery) -> None:
            seq, n, _ = d.receipt.split("-")  # ready again with its count: next is n + 1
            due = time.time() + max(delay, 0.0)
            os.rename(q.leased / d.receipt, q.ready / _ready_name(due, int(seq), int(n)))

        self._each([delivery], "nack", back)

    def dead_letter(self, delivery: Delivery, *, reason: str, body: bytes | None = None) -> None:
        def bury(q: _Queue, d: Delivery) -> None:
            leased = q.leased / d.receipt
            header, stored, _ = _decode(leased.read_bytes())  # a corrupt file: kept as it is
            dead = {
                "id": d.message_id,  # the stand-in id of a corrupt record, so it can be named
                "enqueued_at": (header or {}).get("enqueued_at", time.time()),
                "reason": reason,
                "dead_at": time.time(),
                "attempt": d.attempt,
            }
            content = _encode(dead, stored if body is None else body)
            self._write(q, q.dead / d.receipt.split("-")[0], content)
            # A crash here leaves the leased file too: _take and stats see dead/<seq> and
            # drop it, so the message is dead once, never dead and redelivered.
            leased.unlink()

        self._each([delivery], "dead_letter", bury)

    # -- inspection -------------------------------------------------------------------------
    def stats(self, queue: str) -> QueueStats:
        if not self._queue(queue).path.is_dir():
            return QueueStats(queue, ready=0, delayed=0, in_flight=0, dead=0, oldest_age=0.0)
        with self._locked(queue, "stats") as q:
            now = time.time()
            ready = delayed = in_flight = 0
            oldest = now  # since when the longest-waiting receivable message is receivable
            for name in _names(q.ready):
                m = _READY.fullmatch(name)
                # A file not named by ackwise is receivable now, waiting since it was written.
                since = int(m[1]) / 1e6 if m else (_mtime(q.ready / name) or now)
                if since > now:
                    delayed += 1
                else:
                    ready += 1
                    oldest = min(oldest, since)
            dead = set(_names(q.dead))
            for name in _names(q.leased):
                m = _LEASED.fullmatch(name)
                deadline = _mtime(q.leased / name)
                if deadline is None or (m and m[1] in dead):  # gone, or dead already
                    continue
                if m and deadline > now:
                    in_flight += 1
                else:  # the lease expired: receivable now, so ready (not in flight)
                    ready += 1
                    oldest = min(oldest, deadline)
        return QueueStats(queue, ready, delayed, in_flight, len(dead), max(0.0, now - oldest))

    def _dead_letters(self, queue: str, q: _Queue) -> list[tuple[DeadLetter, str]]:
        """Every dead letter with its file name, oldest first; a file ackwise did not write
        is listed too (stand-in id ``corrupt-<name>``), so that it can be deleted."""
        out = []
        for name in _names(q.dead):
            with contextlib.suppress(FileNotFoundError):
                raw = (q.dead / name).read_bytes()
                header, body, _ = _decode(raw)
                if header is None:
                    dl = DeadLetter(queue, f"corrupt-{name}", raw, "unknown", 0.0, 0)
                else:
                    dead_at, attempt = header.get("dead_at"), header.get("attempt")
                    dl = DeadLetter(
                        queue,
                        header["id"],
                        body,
                        str(header.get("reason", "unknown")),
                        float(dead_at) if isinstance(dead_at, int | float) else 0.0,
                        attempt if isinstance(attempt, int) else 0,
                    )
                out.append((dl, name))
        out.sort(key=lambda pair: (pair[0].dead_at, pair[1]))
        return out

    def dead_letters(self, queue: str, *, limit: int = 100) -> Sequence[DeadLetter]:
        if not self._queue(queue).path.is_dir():
            return []
        with self._locked(queue, "dead_letters") as q:
            return [dl for dl, _ in self._dead_letters(queue, q)[: max(limit, 0)]]

    def requeue_dead(self, queue: str, message_ids: Sequence[str]) -> int:
        wanted = set(message_ids)
        with self._locked(queue, "requeue_dead") as q:
            moved = 0
            for dl, name in self._dead_letters(queue, q):
                if dl.message_id in wanted:
                    # A new delivery: a new seq, count 0, the stored body (with its history).
                    for leftover in _names(q.leased):  # of a dead_letter() that died
                        if leftover.startswith(f"{name}-"):
                            (q.leased / leftover).unlink()
                    seq = self._next_seqs(q, 1)
                    os.rename(q.dead / name, q.ready / _ready_name(time.time(), seq, 0))
                    moved += 1
            return moved

    def delete_dead(self, queue: str, message_ids: Sequence[str] | None = None) -> int:
        with self._locked(queue, "delete_dead") as q:
            doomed = [
                name
                for dl, name in self._dead_letters(queue, q)
                if message_ids is None or dl.message_id in message_ids
            ]
            for name in doomed:
                (q.dead / name).unlink()
            return len(doomed)

    def purge(self, queue: str) -> int:
        with self._locked(queue, "purge") as q:
            names = _names(q.ready)  # ready and delayed; leased files stay in flight
            for name in names:
                (q.ready / name).unlink()
            return len(names)
