"""The queues and exchanges behind an ackwise queue on RabbitMQ: their names and declaration,
and the delay tiers' routing keys.

``declare`` makes two objects: the queue and its dead-letter queue.  The delay tiers are
declared when a delay first needs them (:meth:`Topology.declare_tiers`).  See the adapter's
overview (:mod:`ackwise_rabbitmq._adapter`): **Topology**, **Delays**.
"""

from __future__ import annotations

from typing import Any

import pika.exceptions as px

from ackwise.errors import PermanentAdapterError, QueueNotFound
from ackwise.spi import MAX_PRIORITY, QueueSpec
from ackwise_rabbitmq._io import IOThread
from ackwise_rabbitmq._url import RabbitMQSettings

__all__ = ["DEAD_DELIVERY_LIMIT", "DELAY_TIERS", "MAX_DELAY_MS", "Topology", "bits", "tier"]

#: Delay tiers: tier k holds a message 2**k milliseconds.
DELAY_TIERS = 32
MAX_DELAY_MS: int = 2**DELAY_TIERS - 1
#: ``x-delivery-limit`` of a quorum dead-letter queue (see :meth:`Topology._declare`).
DEAD_DELIVERY_LIMIT = 1_000_000


def bits(delay_ms: int) -> str:
    """The routing key of a delay of ``delay_ms``: its 32 bits, highest first."""
    return ".".join("1" if delay_ms >> k & 1 else "0" for k in range(DELAY_TIERS - 1, -1, -1))


def tier(delay_ms: int) -> int:
    """The tier a delay of ``delay_ms`` (> 0) enters: that of its highest set bit."""
    return delay_ms.bit_length() - 1


class Topology:
    """Names (``p.q.kind``), declaration and existence of a queue and its auxiliaries, and
    what this adapter remembers having declared."""

    def __init__(self, settings: RabbitMQSettings, io: IOThread) -> None:
        self.settings = settings
        self._io = io
        #: The queues this adapter declared (``declare`` is then a no-op); one found missing
        #: since is forgotten (:meth:`forget`), and declared again.
        self._declared: set[str] = set()
        #: The highest delay tier of a queue this adapter declared (tiers 0 to it, all of
        #: them, bottom up: see :meth:`declare_tiers`).  The objects are durable, so it holds
        #: across reconnects; a tier deleted since (``delete_queue`` in another process) is
        #: found by the publish that needs it, which declares the tiers again and sends what
        #: RabbitMQ did not store (:class:`~ackwise_rabbitmq._confirms.NotStored`).
        #: Read and written with single dict operations, from any thread.
        self._tiers: dict[str, int] = {}

    # -- names -----------------------------------------------------------------------------
    def aux(self, queue: str, kind: str) -> str:
        """The name of ``queue``'s auxiliary ``kind`` (``dead``, ``delay.3``, ...)."""
        return f"{self.settings.prefix}.{queue}.{kind}"

    def check_name(self, queue: str) -> None:
        """Refuse a queue name RabbitMQ or ackwise's auxiliary names cannot take."""
        longest = len(self.aux(queue, f"delay.{DELAY_TIERS - 1}").encode())
        if not queue or queue.startswith("amq.") or longest > 255:
            raise PermanentAdapterError(
                f"queue name {queue!r} cannot be used with RabbitMQ: it must be non-empty, not "
                "start with 'amq.', and leave room for ackwise's auxiliary names (255 bytes)"
            )

    # -- queues (I/O thread) ---------------------------------------------------------------
    def exists(self, queue: str) -> int | None:
        """Ready count of ``queue``, or None when it does not exist (I/O thread)."""
        try:
            ok = self._io.admin().queue_declare(queue, passive=True)
        except px.ChannelClosedByBroker as exc:
            if exc.reply_code == 404:
                return None
            raise
        return int(ok.method.message_count)

    # -- topology --------------------------------------------------------------------------
    def declare(self, queue: QueueSpec) -> None:
        name = queue.name
        self.check_name(name)
        if name in self._declared:
            return
        self._io.call(lambda: self._declare(queue), timeout=60.0)
        self._declared.add(name)

    def forget(self, queue: str) -> None:
        """``queue`` was found missing (deleted since, maybe): ``declare`` declares it again."""
        self._declared.discard(queue)

    def _declare(self, spec: QueueSpec) -> None:
        """The queue and its dead-letter queue, nothing else (I/O thread).  The queue
        dead-letters through the default exchange, routed by name to its dead-letter queue
        (``x-dead-letter-routing-key``): no exchange of its own is needed."""
        name = spec.name
        dead = self.aux(name, "dead")
        # Listing dead letters takes them and puts them back, which a quorum queue counts as
        # a delivery: a limit no listing reaches (RabbitMQ 4 would drop them after 20).
        self._declare_aux(dead, {"x-delivery-limit": DEAD_DELIVERY_LIMIT})
        if self.exists(name) is None:
            args: dict[str, Any] = self._dead_lettering(name, legacy=False)
            if self.settings.queue_type == "quorum":
                args["x-queue-type"] = "quorum"
                args["x-delivery-limit"] = spec.max_deliveries
                # What the queue dead-letters itself (past the delivery limit) stays in it
                # until the dead-letter queue has confirmed it.  The default, at-most-once,
                # drops it when that queue cannot take it (a broker shutting down); RabbitMQ
                # requires reject-publish overflow for it (no length limit is set: no effect).
                args["x-dead-letter-strategy"] = "at-least-once"
                args["x-overflow"] = "reject-publish"
            else:
                args["x-queue-type"] = "classic"
                if self.settings.priorities:
                    args["x-max-priority"] = MAX_PRIORITY
            try:
                self._io.admin().queue_declare(name, durable=True, arguments=args)
            except px.ChannelClosedByBroker as exc:
                # Declared meanwhile by another process with other arguments: keep theirs.
                if exc.reply_code != 406 or self.exists(name) is None:
                    raise
                if self.settings.priorities:
                    legacy = self._exchange_exists(self.aux(name, "dlx"))
                    self._check_priorities(name, legacy=legacy)
            return
        legacy = self._exchange_exists(self.aux(name, "dlx"))
        if legacy:
            # Declared by an earlier ackwise, which dead-lettered through an exchange of the
            # queue's own (``p.q.dlx``, a fanout; RabbitMQ cannot change the queue's
            # arguments): keep that exchange bound to the dead-letter queue, as it did.
            self._io.admin().queue_bind(dead, self.aux(name, "dlx"))
        if self.settings.priorities:
            self._check_priorities(name, legacy=legacy)

    def _dead_lettering(self, name: str, *, legacy: bool) -> dict[str, Any]:
        """The queue arguments that send what ``name`` dead-letters to its dead-letter queue:
        through the default exchange, or (``legacy``) the queue's own ``p.q.dlx``."""
        if legacy:
            return {"x-dead-letter-exchange": self.aux(name, "dlx")}
        return {"x-dead-letter-exchange": "", "x-dead-letter-routing-key": self.aux(name, "dead")}

    def _exchange_exists(self, exchange: str) -> bool:
        """Whether ``exchange`` exists (I/O thread)."""
        try:
            self._io.admin().exchange_declare(exchange, passive=True)
        except px.ChannelClosedByBroker as exc:
            if exc.reply_code == 404:
                return False
            raise
        return True

    # -- delay tiers -----------------------------------------------------------------------
    def has_tiers(self, queue: str, top: int) -> bool:
        """Whether this adapter declared ``queue``'s delay tiers up to ``top``."""
        return self._tiers.get(queue, -1) >= top

    def forget_tiers(self, queue: str) -> None:
        """Forget that this adapter declared ``queue``'s delay tiers."""
        self._tiers.pop(queue, None)

    def ensure_tiers(self, queue: str, top: int) -> None:
        """Declare ``queue``'s delay tiers 0 to ``top`` unless this adapter did."""
        if top >= 0 and not self.has_tiers(queue, top):
            self._io.call(lambda: self.declare_tiers(queue, top), timeout=60.0)

    def declare_tiers(self, queue: str, top: int) -> None:
        """Declare the delay tiers 0 to ``top`` of ``queue`` (I/O thread), every one of them,
        from the bottom up, even those this adapter declared before: a message in tier *k*
        goes on through every tier below it, so the tiers that exist always are 0 to some
        *k* (``stats`` counts them up to the first one missing).  Declaring what exists
        changes nothing.  The queue must exist (else the last hop would drop what expires):
        :class:`~ackwise.errors.QueueNotFound`, nothing declared."""
        if self.exists(queue) is None:
            raise QueueNotFound(
                f"{self.settings.where}: queue {queue!r} does not exist (declare it first); "
                "nothing was published"
            )
        deliver = self.aux(queue, "deliver")
        ch = self._io.admin()
        ch.exchange_declare(deliver, "fanout", durable=True)
        ch.queue_bind(queue, deliver)
        below = deliver
        for k in range(top + 1):
            exchange, wait = self.aux(queue, f"delay.{k}"), self.aux(queue, f"wait.{k}")
            ch.exchange_declare(exchange, "topic", durable=True)
            self._declare_aux(wait, {"x-message-ttl": 2**k, "x-dead-letter-exchange": below})
            ch = self._io.admin()
            above = "*." * (DELAY_TIERS - 1 - k)
            ch.queue_bind(wait, exchange, routing_key=f"{above}1.#")
            ch.exchange_bind(below, exchange, routing_key=f"{above}0.#")
            below = exchange
        if not self.has_tiers(queue, top):
            self._tiers[queue] = top

    def _declare_aux(self, name: str, args: dict[str, Any]) -> None:
        """Declare a queue that holds ackwise's own messages (dead letters, a delay tier) of
        the URL's ``aux_queue_type`` (I/O thread): quorum queues are replicated, so a cluster
        that loses a node keeps them; what expires from a quorum delay tier is dead-lettered
        at least once.  One that exists with other arguments (declared classic by an
        earlier version) is kept as it is."""
        kind = self.settings.aux_queue_type
        args = {**args, "x-queue-type": kind}
        if kind != "quorum":
            args.pop("x-delivery-limit", None)
        elif "x-dead-letter-exchange" in args:
            args["x-dead-letter-strategy"] = "at-least-once"
            args["x-overflow"] = "reject-publish"
        try:
            self._io.admin().queue_declare(name, durable=True, arguments=args)
        except px.ChannelClosedByBroker as exc:
            if exc.reply_code != 406 or self.exists(name) is None:
                raise

    def _check_priorities(self, name: str, *, legacy: bool) -> None:
        """Refuse an existing queue that has no ``x-max-priority`` of 9 (I/O thread): AMQP
        cannot read a queue's arguments, but a declaration with other arguments fails."""
        args: dict[str, Any] = {
            **self._dead_lettering(name, legacy=legacy),
            "x-queue-type": "classic",
            "x-max-priority": MAX_PRIORITY,
        }
        try:
            self._io.admin().queue_declare(name, durable=True, arguments=args)
        except px.ChannelClosedByBroker as exc:
            if exc.reply_code != 406:
                raise
            self._refuse_without_priorities(name)

    def _refuse_without_priorities(self, name: str) -> None:
        raise PermanentAdapterError(
            f"{self.settings.where}: queue {name!r} exists without the arguments of a priority "
            f"queue (classic, x-max-priority {MAX_PRIORITY}); RabbitMQ cannot add them to an "
            "existing queue: drain and delete it, or use the URL without priorities=true"
        )

    def delete_queue(self, queue: str) -> None:
        """Delete the queue, its dead-letter and delay queues, and its exchanges (every name
        ackwise could have declared: what does not exist is skipped)."""
        self.check_name(queue)
        queues = [queue, self.aux(queue, "dead")]
        queues += [self.aux(queue, f"wait.{k}") for k in range(DELAY_TIERS)]
        exchanges = [self.aux(queue, "dlx"), self.aux(queue, "deliver")]
        exchanges += [self.aux(queue, f"delay.{k}") for k in range(DELAY_TIERS)]

        def run() -> None:
            for name in queues:
                self._gone(lambda ch, name=name: ch.queue_delete(name))
            for name in exchanges:
                self._gone(lambda ch, name=name: ch.exchange_delete(name))

        self._io.call(run, timeout=60.0)
        self._declared.discard(queue)
        self.forget_tiers(queue)

    def _gone(self, delete: Any) -> None:
        """Run one delete on the admin channel; what does not exist is already gone."""
        try:
            delete(self._io.admin())
        except px.ChannelClosedByBroker as exc:
            if exc.reply_code != 404:
                raise
