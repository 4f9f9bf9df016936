"""The adapter SPI: what a broker adapter must do, and the values that cross it.

An adapter is a small object that owns one connection to one broker.  The worker calls it from
its consumer thread only, so adapters need not be thread-safe.  Every operation either works
on a batch or on one delivery; a delivery is identified by an opaque *receipt* that the adapter
alone understands.  A receipt names one delivery, not one message: once the lease behind it
has moved on, every settlement with it raises :class:`~ackwise.errors.StaleReceipt` and changes
nothing.
"""

from __future__ import annotations

import abc
import enum
import os
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar
from urllib.parse import parse_qsl, unquote, urlsplit

from ackwise.errors import InvalidBrokerURL, UnsupportedCapability

__all__ = [
    "MAX_PRIORITY",
    "Adapter",
    "AttemptCount",
    "BrokerURL",
    "Capabilities",
    "DeadLetter",
    "Delivery",
    "Execute",
    "LeaseExtension",
    "Outgoing",
    "QueueSpec",
    "QueueStats",
    "fork_generation",
]


Execute = Callable[[str, Mapping[str, Any]], list[tuple[Any, ...]]]
"""Runs one SQL statement (``%(name)s`` parameters) on the caller's own database connection,
inside the caller's transaction, and returns its rows (``app.transaction(conn)``)."""

MAX_PRIORITY = 9
"""The highest message priority; 0 is the lowest and the default (docs/priorities.md)."""


class LeaseExtension(enum.Enum):
    """How a delivery stays owned while its task runs."""

    PER_MESSAGE = "per-message"  # extend() moves each delivery's deadline (SQLite, Redis, SQS)
    CONNECTION = "connection"  # held while the connection lives (RabbitMQ)
    NONE = "none"  # a fixed lease that cannot be extended


class AttemptCount(enum.Enum):
    """How exact the broker's delivery count is."""

    EXACT = "exact"
    APPROXIMATE = "approximate"
    FLAG_ONLY = "flag-only"  # only "redelivered or not" (classic AMQP queues)


@dataclass(frozen=True)
class Capabilities:
    """What an adapter's broker can do natively; the single source of truth about it."""

    native_delay: bool = True
    #: Longest delay the broker holds natively, in seconds (``None``: unbounded).
    max_delay: float | None = None
    lease_extension: LeaseExtension = LeaseExtension.PER_MESSAGE
    #: Longest lease one receive or extend may ask for (``None``: unbounded).
    max_lease: float | None = None
    attempt_count: AttemptCount = AttemptCount.EXACT
    native_dead_letter: bool = True
    #: Largest encoded envelope the broker accepts, in bytes (``None``: unbounded).
    max_message_size: int | None = None
    #: Several worker processes can share the broker (False for the in-process memory broker).
    multi_process: bool = True
    #: ``stats()`` reports the age of the oldest ready message (SQS: only in CloudWatch).
    oldest_age: bool = True
    #: ``purge()`` reaches delayed messages too (SQS cannot delete within ``DelaySeconds``).
    purge_delayed: bool = True
    #: Most messages one broker request receives or settles (SQS: 10; ``None``: no such limit,
    #: one call takes any number).  The worker asks for whole batches and sends late acks in
    #: whole batches, so no request goes out part-filled while the queue is busy.
    max_batch: int | None = None
    #: Holding more than 4 x concurrency pays off while tasks are short: the broker pushes into
    #: a consumer window that a settled message refills only a round trip later (AMQP
    #: ``basic.qos``), every request is a round trip that carries a few messages (SQS: 10),
    #: every receive and every batch of acks is a script call on a server (Redis: at one
    #: thread, 4 messages a receive) or a write transaction (SQLite: at one thread and 4
    #: messages a receive, four statements a message).  The worker's default, automatic
    #: prefetch then deepens while tasks are short.  Elsewhere the default prefetch stays 4 x
    #: concurrency (a receive already takes what is ready, and holding more costs lease
    #: renewals).
    deep_prefetch: bool = False
    #: Longest a delivery may stay unsettled before the broker takes it back (``None``: no
    #: such limit).  RabbitMQ's ``consumer_timeout`` is one (it closes the channel); as the
    #: broker URL says it, the adapter's instance carries it (see :attr:`Adapter.capabilities`).
    #: The worker refuses at start a task whose ``time_limit`` is longer.
    max_hold: float | None = None
    #: The broker pushes into a consumer window that counts unacknowledged messages (AMQP
    #: ``basic.qos``): a late ack the worker has not sent yet holds its slot, so the worker
    #: sends its pending acks before it asks for more.  Elsewhere they wait to share a call.
    push_window: bool = False
    #: ``stats().in_flight`` counts the deliveries of every consumer.  False where the broker
    #: tells only this connection's own (RabbitMQ without its management API: AMQP has no
    #: count of other consumers' unacknowledged messages).
    global_in_flight: bool = True
    #: The step of the broker's timers (leases and delays), in seconds: SQS counts visibility
    #: timeouts and delays in whole seconds (1.0); 0.0 where they are finer than a millisecond.
    #: The conformance suite scales its times so that its shortest lease is two steps or more.
    time_resolution: float = 0.0
    #: The broker hands out a queue's ready messages highest :attr:`Outgoing.priority` first
    #: (0 to :data:`MAX_PRIORITY`; first in, first out within one priority), and keeps a
    #: message's priority when it is nacked, redelivered or replayed from the dead letters.
    #: False: the adapter refuses a priority above 0 (SQS has no priorities, a RabbitMQ
    #: quorum queue none before RabbitMQ 4).
    priorities: bool = False
    #: ``publish()`` may be called from several threads at once on one adapter instance, and
    #: calls that overlap share broker round trips (RabbitMQ: one wait for all their
    #: confirms).  The app's producer then publishes outside its lock.  False: one publish
    #: at a time (adapters need not be thread-safe).
    concurrent_publish: bool = False

    def holds_delay(self, delay: float) -> bool:
        """Whether the broker can hold a message ``delay`` seconds before it is delivered."""
        if delay <= 0:
            return True
        return self.native_delay and (self.max_delay is None or delay <= self.max_delay)

    def describe(self) -> dict[str, Any]:
        """Return the capabilities as plain JSON-friendly values."""
        out: dict[str, Any] = {}
        for name in self.__dataclass_fields__:
            value = getattr(self, name)
            out[name] = value.value if isinstance(value, enum.Enum) else value
        return out


@dataclass(frozen=True, slots=True)
class Outgoing:
    """One message to publish: its id, its encoded envelope, an optional delay and priority."""

    id: str
    body: bytes
    #: Seconds from now before the message may be received.
    delay: float = 0.0
    #: 0 (the default, lowest) to :data:`MAX_PRIORITY`: among ready messages, higher first.
    #: Only where :attr:`Capabilities.priorities` says so.
    priority: int = 0


@dataclass(frozen=True, slots=True)
class Delivery:
    """One delivery of a message to this consumer.

    :param receipt: opaque to everyone but the adapter that made it (a row id and lease token,
        an AMQP delivery tag, an SQS receipt handle).
    :param attempt: this delivery's count, 1 for the first delivery.
    :param lease_deadline: wall-clock time (``time.time()``) after which the broker may give
        the message to another consumer, unless the lease is extended.
    :param corrupt: set by the adapter when the stored record is malformed (not written by
        ackwise, or damaged): it says what is wrong, ``body`` holds the record's raw bytes and
        ``message_id`` a stand-in where the record has none.  The worker dead-letters such a
        delivery ``corrupt_record`` without decoding it, through :meth:`Adapter.dead_letter`
        (``body=None``: the record is kept as it is), so its receipt must work like any other.
    """

    queue: str
    message_id: str
    body: bytes
    receipt: Any
    attempt: int
    lease_deadline: float
    corrupt: str | None = None


@dataclass(frozen=True, slots=True)
class DeadLetter:
    """A message in a queue's dead-letter store."""

    queue: str
    message_id: str
    body: bytes
    reason: str
    dead_at: float
    attempt: int


@dataclass(frozen=True, slots=True)
class QueueStats:
    """A queue as the broker itself sees it."""

    queue: str
    ready: int
    delayed: int
    in_flight: int
    dead: int
    #: Seconds the oldest ready message has been waiting (0.0 when none is ready).
    oldest_age: float

    def as_dict(self) -> dict[str, Any]:
        """The figures as a JSON-friendly dict (what ``ackwise stats --json`` prints)."""
        return {
            "queue": self.queue,
            "ready": self.ready,
            "delayed": self.delayed,
            "in_flight": self.in_flight,
            "dead": self.dead,
            "oldest_age": self.oldest_age,
        }


@dataclass(frozen=True)
class QueueSpec:
    """What :meth:`Adapter.declare` must make exist."""

    name: str
    max_deliveries: int = 5
    options: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class BrokerURL:
    """A parsed broker URL.  ``str()`` never shows the password."""

    raw: str
    scheme: str
    host: str
    port: int | None
    path: str
    username: str | None
    password: str | None
    query: dict[str, str]

    @classmethod
    def parse(cls, url: str) -> BrokerURL:
        """Parse ``url``; raise :class:`InvalidBrokerURL` naming what is wrong."""
        if not isinstance(url, str) or "://" not in url:
            raise InvalidBrokerURL(
                f"broker URL {redact_url(str(url))!r} is not a URL; expected "
                "'scheme://…', e.g. 'sqlite:///ackwise.db' or 'memory://'"
            )
        try:
            parts = urlsplit(url)
            port = parts.port
        except ValueError as exc:
            raise InvalidBrokerURL(f"broker URL {redact_url(url)!r}: {exc}") from exc
        query: dict[str, str] = {}
        for key, value in parse_qsl(parts.query, keep_blank_values=True):
            if key in query:
                raise InvalidBrokerURL(
                    f"broker URL {redact_url(url)!r}: option {key!r} given twice"
                )
            query[key] = value
        return cls(
            raw=url,
            scheme=parts.scheme.lower(),
            host=parts.hostname or "",
            port=port,
            path=unquote(parts.path),
            username=unquote(parts.username) if parts.username else None,
            password=unquote(parts.password) if parts.password else None,
            query=query,
        )

    @property
    def in_process_name(self) -> str:
        """The name in-process state (``memory://name``) is shared under: host and path."""
        return (self.host + self.path).strip("/") or "default"

    def __str__(self) -> str:
        return redact_url(self.raw)

    def __repr__(self) -> str:
        return f"BrokerURL({redact_url(self.raw)!r})"


# A connection (or thread) inherited through fork() belongs to the parent.  A counter bumped in
# the child is cheaper than os.getpid() (a syscall) on every broker call.
_fork_generation = 0


def _after_fork() -> None:
    global _fork_generation
    _fork_generation += 1


os.register_at_fork(after_in_child=_after_fork)


def fork_generation() -> int:
    """Return a number that changes in a child process after ``fork()``.

    An adapter notes it when it connects and compares it before using the connection: when it
    differs, the connection (and any thread) is the parent's, and the adapter opens its own.
    """
    return _fork_generation


def redact_url(url: str) -> str:
    """Return ``url`` with any password replaced by ``***``."""
    try:
        parts = urlsplit(url)
    except ValueError:
        return "<unparseable URL>"
    if parts.password is None:
        return url
    netloc = parts.netloc
    userinfo, _, hostport = netloc.rpartition("@")
    user = userinfo.split(":", 1)[0]
    return parts._replace(netloc=f"{user}:***@{hostport}").geturl()


class Adapter(abc.ABC):
    """The contract between ackwise and one broker.

    Subclasses set :attr:`capabilities` and implement every abstract method.  Driver errors are
    mapped into :mod:`ackwise.errors` in one place and re-raised ``from`` the driver's error.
    """

    #: What the broker can do and its limits: the one source of both.  Set on the class; an
    #: adapter whose URL sets a limit (RabbitMQ's ``consumer_timeout``) replaces it on the
    #: instance with :func:`dataclasses.replace`.
    capabilities: Capabilities
    #: The URL scheme(s) the adapter serves; informational.
    name: ClassVar[str] = "adapter"

    def __init__(self, url: BrokerURL) -> None:
        self.url = url

    @classmethod
    def lease_options(cls, lease: float) -> dict[str, str]:
        """URL options under which a consumer that stops answering loses its deliveries
        within a few leases of ``lease`` seconds (default: none).

        For an adapter whose leases last as long as the connection
        (``LeaseExtension.CONNECTION``) the URL, not the worker's ``--lease``, says how soon a
        frozen or cut-off consumer's deliveries go to others: RabbitMQ's ``heartbeat``.  The
        conformance suite adds these to the URL it is given, or refuses one that sets them
        otherwise.
        """
        return {}

    # -- lifecycle -------------------------------------------------------------------------
    @abc.abstractmethod
    def open(self) -> None:
        """Connect.  Idempotent."""

    @abc.abstractmethod
    def close(self) -> None:
        """Disconnect.  Idempotent; unsettled deliveries come back by lease or connection."""

    def __enter__(self) -> Adapter:
        self.open()
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- topology --------------------------------------------------------------------------
    @abc.abstractmethod
    def declare(self, queue: QueueSpec) -> None:
        """Make ``queue`` (and its dead-letter and delay infrastructure) exist.  Idempotent."""

    # -- producing -------------------------------------------------------------------------
    @abc.abstractmethod
    def publish(self, queue: str, messages: Sequence[Outgoing]) -> None:
        """Publish ``messages`` in as few broker round trips as the broker allows.

        Returns only when the broker has accepted every message; raises otherwise.
        """

    # -- consuming -------------------------------------------------------------------------
    @abc.abstractmethod
    def receive(
        self, queue: str, *, max_messages: int, wait: float, lease: float
    ) -> Sequence[Delivery]:
        """Take up to ``max_messages`` ready messages, each leased for ``lease`` seconds.

        Taking a message and recording it in flight are one atomic step: no crash in between
        may lose it.  Waits up to ``wait`` seconds when none is ready.
        """

    def receive_later(
        self, queue: str, *, max_messages: int, lease: float
    ) -> Callable[[], Sequence[Delivery]] | None:
        """Ask for up to ``max_messages`` ready messages without waiting for the answer.

        Returns a function that reads the answer, as :meth:`receive` with ``wait=0`` would
        have returned or raised it, or ``None`` when the adapter cannot (the default; the
        worker calls :meth:`receive`).  The leases begin when this is called.  While the
        broker works on the request, the caller goes on with what it holds; it calls the
        function once, before it asks again, and may call other methods in between.
        """
        return None

    @abc.abstractmethod
    def ack(self, deliveries: Sequence[Delivery]) -> None:
        """Remove the messages for good.  Stale receipts: see :class:`StaleReceipt`."""

    def ack_before_start(self, deliveries: Sequence[Delivery]) -> None:
        """Ack the messages of tasks about to start (``Ack.EARLY``): at most once.

        Returns only once the broker has recorded the acks, so that no broker restart or cut
        connection after it returns can deliver them again; raises :class:`StaleReceipt` for
        those it cannot vouch for (the worker then does not run them).  When a broker error
        made the outcome unknown, the worker asks again with the same deliveries after it
        reconnected: an adapter that can tell its own earlier ack vouches for it (the task
        runs); one that cannot raises :class:`StaleReceipt` (the task is lost unrun: at most
        once still holds).  The worker's capacity
        does not grow: the tasks still run.  The default calls :meth:`ack`, right for any
        adapter whose ``ack`` waits for the broker's answer; an adapter whose acks are
        fire-and-forget (AMQP's ``basic.ack``) adds a round trip here.
        """
        self.ack(deliveries)

    @abc.abstractmethod
    def nack(self, delivery: Delivery, *, delay: float = 0.0) -> None:
        """Return the message to its queue, ready after ``delay`` seconds.  Never drops it."""

    @abc.abstractmethod
    def extend(self, deliveries: Sequence[Delivery], *, lease: float) -> None:
        """Move the lease deadline of each delivery to ``lease`` seconds from now."""

    @abc.abstractmethod
    def dead_letter(self, delivery: Delivery, *, reason: str, body: bytes | None = None) -> None:
        """Move the message to its queue's dead-letter store, with ``reason``.

        :param body: store this body instead of the delivered one (an envelope annotated with
            the failure); the message id is kept.
        """

    @abc.abstractmethod
    def publish_dead(self, queue: str, messages: Sequence[Outgoing], *, reason: str) -> None:
        """Store ``messages`` directly in ``queue``'s dead-letter store.

        Used where the original delivery is already settled (an early-acked task that failed).
        """

    # -- inspection ------------------------------------------------------------------------
    @abc.abstractmethod
    def stats(self, queue: str) -> QueueStats:
        """Count the queue's messages in each state, from the broker's own view."""

    @abc.abstractmethod
    def dead_letters(self, queue: str, *, limit: int = 100) -> Sequence[DeadLetter]:
        """List up to ``limit`` dead letters of ``queue``, oldest first."""

    @abc.abstractmethod
    def requeue_dead(self, queue: str, message_ids: Sequence[str]) -> int:
        """Move these dead letters back to ready, as new deliveries (count reset); return how many.

        Atomic per message: a replay run twice re-publishes each message once.  The stored body
        (with its history) is what becomes ready.  Ids not in the store are skipped.
        """

    @abc.abstractmethod
    def delete_dead(self, queue: str, message_ids: Sequence[str] | None = None) -> int:
        """Delete these dead letters (every one of ``queue`` when ``None``); return how many."""

    @abc.abstractmethod
    def purge(self, queue: str) -> int:
        """Delete every ready and delayed message of ``queue``; return how many."""

    def delete_queue(self, queue: str) -> None:
        """Remove ``queue`` and everything the adapter keeps for it from the broker.

        Ready, delayed and dead messages go, and so do the broker objects the adapter made for
        the queue (RabbitMQ's delay queues and exchanges, Redis keys, SQS's dead-letter queue).
        Deliveries still held are lost with it: callers delete a queue nobody consumes.  Deleting
        a queue that does not exist is not an error.  The default purges the queue and deletes
        its dead letters (an adapter whose broker keeps nothing else per queue need not
        override it); the conformance suite calls it on every queue it made.
        """
        self.purge(queue)
        self.delete_dead(queue)

    def stop_receiving(self) -> None:  # noqa: B027 - optional, nothing to do by default
        """Stop taking new messages, and give back at once any the adapter prefetched itself.

        The worker calls it when a graceful stop begins, before it returns its own buffer.
        Deliveries already handed out stay owned and may still be settled.  An adapter that
        takes messages only inside :meth:`receive` has nothing to do (the default); one that
        consumes into a buffer of its own (RabbitMQ's ``basic.consume``) cancels its consumers
        here, or the broker would send the returned messages straight back to it.
        """

    def takes_transaction(self, execute: Execute) -> bool:
        """Whether ``execute`` (a statement runner on the caller's database connection) reaches
        this broker's own storage, so that :meth:`publish_in_transaction` enqueues in the
        caller's transaction.  The default, False: ``app.transaction()`` writes to the outbox
        table of the caller's database instead (docs/outbox.md)."""
        return False

    def publish_in_transaction(
        self, execute: Execute, queue: str, messages: Sequence[Outgoing]
    ) -> None:
        """Write ``messages`` through ``execute``, in the caller's transaction: published if
        and only if the caller commits.  Only where :meth:`takes_transaction` said so."""
        raise UnsupportedCapability(self.name, "publishing in the caller's transaction")

    def queues(self) -> Sequence[str]:
        """Names of the queues the broker knows, where it can tell (for ``ackwise stats``)."""
        raise UnsupportedCapability(self.name, "listing queues")

    # -- helpers for subclasses ------------------------------------------------------------
    def check_priorities(self, messages: Sequence[Outgoing]) -> None:
        """Raise :class:`UnsupportedCapability` for a priority the adapter cannot keep."""
        for m in messages:
            if m.priority and (
                not self.capabilities.priorities or not 0 <= m.priority <= MAX_PRIORITY
            ):
                raise UnsupportedCapability(
                    self.name,
                    "priorities",
                    f"message {m.id} has priority {m.priority!r}; this broker takes "
                    + (f"0 to {MAX_PRIORITY}" if self.capabilities.priorities else "none but 0"),
                )

    def check_delay(self, delay: float) -> None:
        """Raise :class:`UnsupportedCapability` when the broker cannot hold ``delay``."""
        caps = self.capabilities
        if caps.holds_delay(delay):
            return
        if not caps.native_delay:
            raise UnsupportedCapability(self.name, "native delay")
        raise UnsupportedCapability(
            self.name, "delay", f"{delay:.3f}s exceeds the maximum of {caps.max_delay}s"
        )
