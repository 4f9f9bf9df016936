"""Publishing: messages routed into a queue or its delay tiers, and confirmed.

Every publish is ``mandatory`` and returns only once the broker confirmed every message of the
batch (one round trip for it, :mod:`ackwise_rabbitmq._confirms`); a message that no queue took
raises ``QueueNotFound``.  See the adapter's overview (:mod:`ackwise_rabbitmq._adapter`),
**Delays**.

A delayed message needs its delay tiers, which are declared before the first publish that
needs them (:meth:`~ackwise_rabbitmq._topology.Topology.ensure_tiers`).  This adapter remembers
what it declared; when the tiers were deleted since (``delete_queue``, by another process),
RabbitMQ refuses the publish (it closes the channel on a missing exchange, it returns a message
no queue took), never silently: the tiers are declared again and what RabbitMQ certainly did
not store is sent again (:meth:`Publisher.publish_tiered`), so a stale memory neither loses nor
duplicates a message.
"""

from __future__ import annotations

import math
import time
from collections.abc import Sequence
from typing import Any

from ackwise.errors import QueueNotFound, TransientAdapterError
from ackwise.spi import Outgoing
from ackwise_rabbitmq._calls import Publish
from ackwise_rabbitmq._confirms import NotStored
from ackwise_rabbitmq._frames import Properties
from ackwise_rabbitmq._io import IOThread
from ackwise_rabbitmq._messages import H_ATTEMPT, H_DEAD_AT, H_REASON
from ackwise_rabbitmq._topology import MAX_DELAY_MS, Topology, bits, tier
from ackwise_rabbitmq._url import RabbitMQSettings

__all__ = ["Publisher", "delay_ms"]

#: How many times a publish declares the delay tiers again after RabbitMQ found one missing.
_TIER_ATTEMPTS = 3


def delay_ms(delay: float) -> int:
    """A delay in whole milliseconds: rounded up (never early), at most the longest."""
    return min(MAX_DELAY_MS, math.ceil(delay * 1000))


class Publisher:
    """Routes messages (a queue, a delay tier, a dead-letter queue) and publishes them,
    confirmed, through the connection (:class:`~ackwise_rabbitmq._io.IOThread`).  Checking
    them (size, delay, priority) is the adapter's, before they come here."""

    def __init__(self, settings: RabbitMQSettings, io: IOThread, topology: Topology) -> None:
        self.settings = settings
        self._io = io
        self._topology = topology

    def properties(
        self, message_id: str, headers: dict[str, Any] | None = None, priority: int = 0
    ) -> Properties:
        """The properties of a message the adapter publishes (persistent, stamped now)."""
        return Properties(message_id, int(time.time()), headers or None, priority)

    def route(
        self, queue: str, m: Outgoing, headers: dict[str, Any] | None = None
    ) -> tuple[str, str, bytes, Any]:
        """Where ``m`` goes: ``queue``, or the delay tier its delay enters."""
        props = self.properties(m.id, headers, m.priority)
        if m.delay > 0:
            ms = delay_ms(m.delay)
            return (self._topology.aux(queue, f"delay.{tier(ms)}"), bits(ms), m.body, props)
        return ("", queue, m.body, props)

    def publish_tiered(
        self, queue: str, items: Sequence[Publish], top: int, *, io_thread: bool = False
    ) -> None:
        """Publish ``items`` (confirmed), declaring ``queue``'s delay tiers 0 to ``top``
        first unless this adapter did (``top`` -1: no delay).  What RabbitMQ did not store
        because a tier was deleted since (:class:`~ackwise_rabbitmq._confirms.NotStored`) is
        sent again once the tiers are declared again.  ``io_thread``: the caller runs on the
        I/O thread."""
        topology = self._topology
        for _ in range(_TIER_ATTEMPTS):
            if top >= 0 and not topology.has_tiers(queue, top):
                if io_thread:
                    topology.declare_tiers(queue, top)
                else:
                    topology.ensure_tiers(queue, top)
            try:
                if io_thread:
                    self._io.publish_now(items)
                else:
                    self._io.publish_call(items)
                return
            except NotStored as exc:
                topology.forget_tiers(queue)
                items = exc.items
            except QueueNotFound:
                # A message no queue took: its queue was deleted since, maybe (the adapter's
                # messages of one call that are not delayed all go to one queue, by name
                # through the default exchange): declare() declares it again.
                for exchange, key, *_ in items:
                    if not exchange:
                        topology.forget(key)
                raise
        raise TransientAdapterError(
            f"{self.settings.where}: the delay tiers of queue {queue!r} were deleted again "
            f"each of {_TIER_ATTEMPTS} times they were declared (is another process deleting "
            f"the queue?); {len(items)} message(s) were not stored: publish them again"
        )

    def publish(self, queue: str, messages: Sequence[Outgoing]) -> None:
        """Publish checked ``messages`` (at least one) into ``queue`` or its delay tiers."""
        delayed = [m for m in messages if m.delay > 0]
        if not delayed:
            self.publish_tiered(queue, [self.route(queue, m) for m in messages], -1)
            return
        # Delayed messages go out first (each has its own time; the others keep their order):
        # should RabbitMQ refuse one for a tier deleted since, none before it is left in doubt.
        ordered = [*delayed, *(m for m in messages if m.delay <= 0)]
        top = max(tier(delay_ms(m.delay)) for m in delayed)
        self.publish_tiered(queue, [self.route(queue, m) for m in ordered], top)

    def publish_dead(self, queue: str, messages: Sequence[Outgoing], *, reason: str) -> None:
        """Publish checked ``messages`` (at least one) into ``queue``'s dead letters."""
        now = time.time()
        dead = self._topology.aux(queue, "dead")
        self.publish_tiered(
            queue,
            [
                ("", dead, m.body, self.dead_props(m.id, reason, now, 1, m.priority))
                for m in messages
            ],
            -1,
        )

    def dead_props(
        self, message_id: str, reason: str, at: float, attempt: int, priority: int = 0
    ) -> Any:
        """A dead letter's properties; its priority is kept for a replay."""
        return self.properties(
            message_id, {H_REASON: reason, H_DEAD_AT: repr(at), H_ATTEMPT: attempt}, priority
        )
