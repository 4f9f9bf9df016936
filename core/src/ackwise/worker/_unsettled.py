"""What a broker error leaves of a settlement, taken up again after the reconnect.

A settlement is a list of steps, each one broker call and what follows it (a retry: publish
it, then ack the original).  A broker error in a step keeps that step and the ones after it
in the :class:`Backlog`, and is raised for the worker to reconnect; once it has, the backlog
takes them in order.  The steps before the error are not taken again: a retry published is
not published twice (docs/failure-handling.md).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace

from ackwise.contract._semantics import (
    AckMessage,
    DeadLetterMessage,
    NackMessage,
    RetryMessage,
    Settlement,
)
from ackwise.contract._spi import Delivery
from ackwise.errors import TransientAdapterError

__all__ = ["Backlog", "Moot", "Step", "Unsettled", "loses", "original_settled"]

#: One step of a settlement: ``step(again)``; ``again``: taken after a reconnect.
Step = Callable[[bool], None]


class Moot(Exception):
    """Raised by a step: the settlement's steps left have nothing to do any more."""


@dataclass
class Unsettled:
    """A settlement's steps not taken yet."""

    delivery: Delivery
    task: str | None
    steps: list[Step]
    #: The message is gone from the broker (acked as it started) until these steps publish
    #: it again: dropping them loses it.
    lost_if_dropped: bool


class Backlog:
    """The settlements a broker error cut short, oldest first."""

    def __init__(self) -> None:
        self.items: list[Unsettled] = []

    def __len__(self) -> int:
        return len(self.items)

    def carry(self, unsettled: Unsettled, *, keep: bool) -> None:
        """Take the steps of ``unsettled``; a broker error keeps what is left of it (where
        ``keep``: the caller holds the delivery no more), then is raised."""
        self._take(unsettled, again=False, keep=keep)

    def resume(self) -> None:
        """After the reconnect: take what is left, in order; a broker error keeps what is
        left, where it was, then is raised."""
        while self.items:
            self._take(self.items.pop(0), again=True, keep=True)

    def drop(self) -> list[Unsettled]:
        """Forget every settlement left, and return them."""
        items, self.items = self.items, []
        return items

    def _take(self, unsettled: Unsettled, *, again: bool, keep: bool) -> None:
        steps = unsettled.steps
        for i, step in enumerate(steps):
            try:
                step(again)
            except Moot:
                return
            except TransientAdapterError:
                if keep:
                    rest = replace(unsettled, steps=steps[i:])
                    if again:
                        self.items.insert(0, rest)
                    else:
                        self.items.append(rest)
                raise


def original_settled(decision: Settlement) -> bool:
    """Whether the delivery was settled before ``decision`` (acked as it started), or
    ``decision`` asks the broker nothing about it."""
    if isinstance(decision, RetryMessage | DeadLetterMessage):
        return decision.original_settled
    return not isinstance(decision, AckMessage | NackMessage)


def loses(decision: Settlement) -> bool:
    """Whether dropping ``decision`` unsettled loses its message: it was acked as it
    started, and only ``decision`` puts it back (a retry, a dead letter)."""
    return isinstance(decision, RetryMessage | DeadLetterMessage) and decision.original_settled
