"""The queues and exchanges behind an ackwise queue on RabbitMQ: their names and declaration,
and the delay tiers' routing keys.

See the adapter's overview (:mod:`ackwise_rabbitmq._adapter`): **Topology**, **Delays**.
"""

from __future__ import annotations

from typing import Any

import pika.exceptions as px

from ackwise import MAX_PRIORITY, BrokerURL, QueueSpec
from ackwise.errors import PermanentAdapterError
from ackwise_rabbitmq._io import _IOThread

#: Delay tiers: tier k holds a message 2**k milliseconds.
DELAY_TIERS = 32
MAX_DELAY_MS = 2**DELAY_TIERS - 1
#: ``x-delivery-limit`` of a quorum dead-letter queue (see :meth:`_Topology._declare`).
DEAD_DELIVERY_LIMIT = 1_000_000


def _bits(delay_ms: int) -> str:
    return ".".join("1" if delay_ms >> k & 1 else "0" for k in range(DELAY_TIERS - 1, -1, -1))


class _Topology(_IOThread):
    """Names (``p.q.kind``), declaration and existence of a queue and its auxiliaries."""

    def __init__(self, url: BrokerURL) -> None:
        super().__init__(url)
        self._declared: set[str] = set()

    # -- names -----------------------------------------------------------------------------
    def _aux(self, queue: str, kind: str) -> str:
        return f"{self.settings.prefix}.{queue}.{kind}"

    def _check_name(self, queue: str) -> None:
        longest = len(self._aux(queue, f"delay.{DELAY_TIERS - 1}").encode())
        if not queue or queue.startswith("amq.") or longest > 255:
            raise PermanentAdapterError(
                f"queue name {queue!r} cannot be used with RabbitMQ: it must be non-empty, not "
                "start with 'amq.', and leave room for ackwise's auxiliary names (255 bytes)"
            )

    # -- queues (I/O thread) ---------------------------------------------------------------
    def _exists(self, queue: str) -> int | None:
        """Ready count of ``queue``, or None when it does not exist (I/O thread)."""
        try:
            ok = self._admin().queue_declare(queue, passive=True)
        except px.ChannelClosedByBroker as exc:
            if exc.reply_code == 404:
                return None
            raise
        return int(ok.method.message_count)

    # -- topology --------------------------------------------------------------------------
    def declare(self, queue: QueueSpec) -> None:
        name = queue.name
        self._check_name(name)
        if name in self._declared:
            return
        self._call(lambda: self._declare(queue), timeout=60.0)
        self._declared.add(name)

    def _declare(self, spec: QueueSpec) -> None:
        name = spec.name
        dlx, dead = self._aux(name, "dlx"), self._aux(name, "dead")
        deliver = self._aux(name, "deliver")
        ch = self._admin()
        ch.exchange_declare(dlx, "fanout", durable=True)
        # Listing dead letters takes them and puts them back, which a quorum queue counts as
        # a delivery: a limit no listing reaches (RabbitMQ 4 would drop them after 20).
        self._declare_aux(dead, {"x-delivery-limit": DEAD_DELIVERY_LIMIT})
        ch = self._admin()
        ch.queue_bind(dead, dlx)
        if self._exists(name) is None:
            args: dict[str, Any] = {"x-dead-letter-exchange": dlx}
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
                self._admin().queue_declare(name, durable=True, arguments=args)
            except px.ChannelClosedByBroker as exc:
                # Declared meanwhile by another process with other arguments: keep theirs.
                if exc.reply_code != 406 or self._exists(name) is None:
                    raise
                if self.settings.priorities:
                    self._refuse_without_priorities(name)
        elif self.settings.priorities:
            self._check_priorities(name, dlx)
        ch = self._admin()
        ch.exchange_declare(deliver, "fanout", durable=True)
        ch.queue_bind(name, deliver)
        below = deliver
        for k in range(DELAY_TIERS):
            exchange, wait = self._aux(name, f"delay.{k}"), self._aux(name, f"wait.{k}")
            ch.exchange_declare(exchange, "topic", durable=True)
            self._declare_aux(wait, {"x-message-ttl": 2**k, "x-dead-letter-exchange": below})
            ch = self._admin()
            above = "*." * (DELAY_TIERS - 1 - k)
            ch.queue_bind(wait, exchange, routing_key=f"{above}1.#")
            ch.exchange_bind(below, exchange, routing_key=f"{above}0.#")
            below = exchange

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
            self._admin().queue_declare(name, durable=True, arguments=args)
        except px.ChannelClosedByBroker as exc:
            if exc.reply_code != 406 or self._exists(name) is None:
                raise

    def _check_priorities(self, name: str, dlx: str) -> None:
        """Refuse an existing queue that has no ``x-max-priority`` of 9 (I/O thread): AMQP
        cannot read a queue's arguments, but a declaration with other arguments fails."""
        args: dict[str, Any] = {
            "x-dead-letter-exchange": dlx,
            "x-queue-type": "classic",
            "x-max-priority": MAX_PRIORITY,
        }
        try:
            self._admin().queue_declare(name, durable=True, arguments=args)
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
        """Delete the queue, its dead-letter and delay queues, and its exchanges."""
        self._check_name(queue)
        queues = [queue, self._aux(queue, "dead")]
        queues += [self._aux(queue, f"wait.{k}") for k in range(DELAY_TIERS)]
        exchanges = [self._aux(queue, "dlx"), self._aux(queue, "deliver")]
        exchanges += [self._aux(queue, f"delay.{k}") for k in range(DELAY_TIERS)]

        def run() -> None:
            for name in queues:
                self._gone(lambda ch, name=name: ch.queue_delete(name))
            for name in exchanges:
                self._gone(lambda ch, name=name: ch.exchange_delete(name))

        self._call(run, timeout=60.0)
        self._declared.discard(queue)

    def _gone(self, delete: Any) -> None:
        """Run one delete on the admin channel; what does not exist is already gone."""
        try:
            delete(self._admin())
        except px.ChannelClosedByBroker as exc:
            if exc.reply_code != 404:
                raise
