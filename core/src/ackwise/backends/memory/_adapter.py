"""``memory://[name]``: an in-process broker with real leases, delays and dead letters.

Not a mock: it keeps the full contract of the SPI (leases expire and redeliver with the count
incremented, stale receipts are refused, delays are held by the broker) within one process.
Adapters opened on the same ``memory://name`` share one broker; ``memory://`` is the default.
"""

from __future__ import annotations

import heapq
import itertools
import threading
import time
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, field

from ackwise.contract._spi import (
    Adapter,
    BrokerURL,
    Capabilities,
    DeadLetter,
    Delivery,
    Outgoing,
    QueueSpec,
    QueueStats,
)
from ackwise.errors import InvalidBrokerURL, QueueNotFound, StaleReceipt

__all__ = ["MemoryAdapter", "MemoryBroker", "reset_memory_brokers"]


@dataclass(slots=True)
class _Message:
    id: str
    body: bytes
    enqueued_at: float
    deliveries: int = 0
    token: int = 0  # the current delivery's token; 0 when not in flight
    deadline: float = 0.0
    priority: int = 0
    seq: int = 0  # publication order: the place of a message of priority > 0 in ``urgent``


@dataclass
class _Queue:
    ready: deque[_Message] = field(default_factory=deque)  # priority 0, first in first out
    #: Ready messages of priority > 0: a heap by (-priority, seq), taken before ``ready``.
    urgent: list[tuple[int, int, _Message]] = field(default_factory=list)
    delayed: list[tuple[float, int, _Message]] = field(default_factory=list)  # heap by due time
    in_flight: dict[int, _Message] = field(default_factory=dict)  # token -> message
    dead: list[DeadLetter] = field(default_factory=list)
    dead_priority: dict[str, int] = field(default_factory=dict)  # message id -> priority

    def make_ready(self, msg: _Message, *, head: bool = False) -> None:
        """Put ``msg`` back among the ready: at its priority's place, else at the head or tail."""
        if msg.priority:
            heapq.heappush(self.urgent, (-msg.priority, msg.seq, msg))
        elif head:
            self.ready.appendleft(msg)
        else:
            self.ready.append(msg)

    def take_ready(self) -> object:
        """The next ready message: highest priority first (an entry as stored, unchecked)."""
        if self.urgent:
            return heapq.heappop(self.urgent)[2]
        return self.ready.popleft()

    def ready_count(self) -> int:
        return len(self.ready) + len(self.urgent)


class MemoryBroker:
    """The shared state behind every adapter opened on one ``memory://name``."""

    def __init__(self) -> None:
        self.lock = threading.Condition()
        self.queues: dict[str, _Queue] = {}
        self.tokens = itertools.count(1)
        self.seq = itertools.count()

    def queue(self, name: str) -> _Queue:
        q = self.queues.get(name)
        if q is None:
            raise QueueNotFound(f"memory queue {name!r} was not declared")
        return q

    def sweep(self, q: _Queue, now: float) -> None:
        """Make due delayed messages ready and expired leases receivable again."""
        while q.delayed and q.delayed[0][0] <= now:
            _, _, msg = heapq.heappop(q.delayed)
            q.make_ready(msg)
        expired = [tok for tok, m in q.in_flight.items() if m.deadline <= now]
        for tok in expired:
            msg = q.in_flight.pop(tok)
            msg.token = 0
            q.make_ready(msg, head=True)


def _checked(entry: object, now: float) -> tuple[_Message, str | None]:
    """A ready entry as a message, and what is wrong with it (``None``: nothing).

    Code that writes into a :class:`MemoryBroker` directly may leave anything in a queue; such
    an entry is delivered as a corrupt record (its ``repr`` as the body), never dropped.
    """
    if not isinstance(entry, _Message):
        raw = _Message(f"corrupt-{id(entry):x}", repr(entry).encode(), now)
        return raw, f"ready entry is a {type(entry).__name__}, not a message"
    problems = [
        f"{name} is a {type(value).__name__}, not {kind.__name__}"
        for name, value, kind in (
            ("id", entry.id, str),
            ("body", entry.body, bytes),
            ("delivery count", entry.deliveries, int),
        )
        if type(value) is not kind
    ]
    if not problems:
        return entry, None
    if type(entry.id) is not str:
        entry.id = f"corrupt-{id(entry):x}"
    if type(entry.body) is not bytes:
        entry.body = repr(entry.body).encode()
    if type(entry.deliveries) is not int:
        entry.deliveries = 0
    return entry, "; ".join(problems)


_brokers: dict[str, MemoryBroker] = {}
_brokers_lock = threading.Lock()


def _broker_for(name: str) -> MemoryBroker:
    with _brokers_lock:
        broker = _brokers.get(name)
        if broker is None:
            broker = _brokers[name] = MemoryBroker()
        return broker


def reset_memory_brokers() -> None:
    """Forget every in-process broker (between tests)."""
    with _brokers_lock:
        _brokers.clear()


class MemoryAdapter(Adapter):
    """Adapter for the in-process broker."""

    name = "memory"
    capabilities = Capabilities(native_dead_letter=True, multi_process=False, priorities=True)

    def __init__(self, url: BrokerURL) -> None:
        super().__init__(url)
        if url.query:
            raise InvalidBrokerURL(f"memory:// takes no options, got {sorted(url.query)} in {url}")
        self.broker_name = url.in_process_name
        self._broker: MemoryBroker | None = None

    @property
    def broker(self) -> MemoryBroker:
        if self._broker is None:
            self.open()
        assert self._broker is not None
        return self._broker

    def open(self) -> None:
        if self._broker is None:
            self._broker = _broker_for(self.broker_name)

    def close(self) -> None:
        self._broker = None

    def declare(self, queue: QueueSpec) -> None:
        b = self.broker
        with b.lock:
            b.queues.setdefault(queue.name, _Queue())

    def publish(self, queue: str, messages: Sequence[Outgoing]) -> None:
        b = self.broker
        now = time.time()
        with b.lock:
            q = b.queue(queue)
            self.check_priorities(messages)
            for m in messages:
                if m.delay > 0:
                    self.check_delay(m.delay)
            for m in messages:
                msg = _Message(m.id, m.body, now, priority=m.priority, seq=next(b.seq))
                if m.delay > 0:
                    heapq.heappush(q.delayed, (now + m.delay, msg.seq, msg))
                else:
                    q.make_ready(msg)
            b.lock.notify_all()

    def receive(
        self, queue: str, *, max_messages: int, wait: float, lease: float
    ) -> Sequence[Delivery]:
        b = self.broker
        end = time.monotonic() + max(0.0, wait)
        with b.lock:
            q = b.queue(queue)
            while True:
                now = time.time()
                b.sweep(q, now)
                if q.ready or q.urgent:
                    break
                remaining = end - time.monotonic()
                if remaining <= 0:
                    return []
                if q.delayed:
                    remaining = min(remaining, max(0.0, q.delayed[0][0] - now))
                if q.in_flight:
                    next_expiry = min(m.deadline for m in q.in_flight.values())
                    remaining = min(remaining, max(0.0, next_expiry - now))
                b.lock.wait(max(remaining, 0.001))
            out: list[Delivery] = []
            deadline = now + lease
            while (q.ready or q.urgent) and len(out) < max_messages:
                msg, problem = _checked(q.take_ready(), now)
                msg.deliveries += 1
                msg.token = next(b.tokens)
                msg.deadline = deadline
                q.in_flight[msg.token] = msg
                out.append(
                    Delivery(queue, msg.id, msg.body, msg.token, msg.deliveries, deadline, problem)
                )
            return out

    def _owned(self, q: _Queue, d: Delivery) -> _Message | None:
        msg = q.in_flight.get(d.receipt)
        return msg if msg is not None and msg.token == d.receipt else None

    def ack(self, deliveries: Sequence[Delivery]) -> None:
        b = self.broker
        stale: list[Delivery] = []
        with b.lock:
            for d in deliveries:
                q = b.queue(d.queue)
                if self._owned(q, d) is None:
                    stale.append(d)
                else:
                    del q.in_flight[d.receipt]
        if stale:
            raise StaleReceipt(stale, "ack")

    def nack(self, delivery: Delivery, *, delay: float = 0.0) -> None:
        b = self.broker
        if delay > 0:
            self.check_delay(delay)
        with b.lock:
            q = b.queue(delivery.queue)
            msg = self._owned(q, delivery)
            if msg is None:
                raise StaleReceipt([delivery], "nack")
            del q.in_flight[delivery.receipt]
            msg.token = 0
            if delay > 0:
                heapq.heappush(q.delayed, (time.time() + delay, next(b.seq), msg))
            else:
                q.make_ready(msg, head=True)
            b.lock.notify_all()

    def extend(self, deliveries: Sequence[Delivery], *, lease: float) -> None:
        b = self.broker
        stale: list[Delivery] = []
        deadline = time.time() + lease
        with b.lock:
            for d in deliveries:
                msg = self._owned(b.queue(d.queue), d)
                if msg is None:
                    stale.append(d)
                else:
                    msg.deadline = deadline
        if stale:
            raise StaleReceipt(stale, "extend")

    def dead_letter(self, delivery: Delivery, *, reason: str, body: bytes | None = None) -> None:
        b = self.broker
        with b.lock:
            q = b.queue(delivery.queue)
            msg = self._owned(q, delivery)
            if msg is None:
                raise StaleReceipt([delivery], "dead_letter")
            del q.in_flight[delivery.receipt]
            q.dead_priority[msg.id] = msg.priority
            q.dead.append(
                DeadLetter(
                    delivery.queue,
                    msg.id,
                    msg.body if body is None else body,
                    reason,
                    time.time(),
                    msg.deliveries,
                )
            )

    def publish_dead(self, queue: str, messages: Sequence[Outgoing], *, reason: str) -> None:
        b = self.broker
        now = time.time()
        with b.lock:
            q = b.queue(queue)
            self.check_priorities(messages)
            for m in messages:
                q.dead_priority[m.id] = m.priority
                q.dead.append(DeadLetter(queue, m.id, m.body, reason, now, 0))

    def stats(self, queue: str) -> QueueStats:
        b = self.broker
        with b.lock:
            q = b.queue(queue)
            now = time.time()
            b.sweep(q, now)
            waiting = itertools.chain(q.ready, (entry[2] for entry in q.urgent))
            oldest = min((getattr(m, "enqueued_at", now) for m in waiting), default=now)
            return QueueStats(
                queue,
                ready=q.ready_count(),
                delayed=len(q.delayed),
                in_flight=len(q.in_flight),
                dead=len(q.dead),
                oldest_age=max(0.0, now - oldest),
            )

    def dead_letters(self, queue: str, *, limit: int = 100) -> Sequence[DeadLetter]:
        b = self.broker
        with b.lock:
            return list(b.queue(queue).dead[:limit])

    def requeue_dead(self, queue: str, message_ids: Sequence[str]) -> int:
        b = self.broker
        wanted = set(message_ids)
        now = time.time()
        with b.lock:
            q = b.queue(queue)
            keep: list[DeadLetter] = []
            moved = 0
            for dead in q.dead:
                if dead.message_id in wanted:
                    priority = q.dead_priority.get(dead.message_id, 0)
                    msg = _Message(
                        dead.message_id, dead.body, now, priority=priority, seq=next(b.seq)
                    )
                    q.make_ready(msg)
                    moved += 1
                else:
                    keep.append(dead)
            q.dead = keep
            for mid in wanted - {d.message_id for d in keep}:
                q.dead_priority.pop(mid, None)
            if moved:
                b.lock.notify_all()
            return moved

    def delete_dead(self, queue: str, message_ids: Sequence[str] | None = None) -> int:
        b = self.broker
        with b.lock:
            q = b.queue(queue)
            before = len(q.dead)
            if message_ids is None:
                q.dead = []
            else:
                wanted = set(message_ids)
                q.dead = [d for d in q.dead if d.message_id not in wanted]
            left = {d.message_id for d in q.dead}
            q.dead_priority = {k: v for k, v in q.dead_priority.items() if k in left}
            return before - len(q.dead)

    def purge(self, queue: str) -> int:
        b = self.broker
        with b.lock:
            q = b.queue(queue)
            n = q.ready_count() + len(q.delayed)
            q.ready.clear()
            q.urgent.clear()
            q.delayed.clear()
            return n

    def delete_queue(self, queue: str) -> None:
        b = self.broker
        with b.lock:
            b.queues.pop(queue, None)

    def queues(self) -> Sequence[str]:
        b = self.broker
        with b.lock:
            return sorted(b.queues)
