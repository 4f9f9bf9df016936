"""Idempotency keys (docs/idempotency.md): a redelivered or duplicated message has one effect.

A task declared with ``idempotency_key=callable`` (or a message carrying the header
``idempotency_key``, as beat's fenced fires do) is claimed in a store before it runs:

``DONE``  the key completed before: the message is acked without running;
``BUSY``  a live execution holds it: the message is offered again after the holder's lease;
``RUN``   new, or its holder died (the lease ran out): this execution takes it.

Claims are held with a lease that the worker renews with the delivery's own lease, so a key
whose holder crashed is taken over after one lease, and a long task keeps its key.
"""

from __future__ import annotations

import abc
import enum
from collections.abc import Sequence
from dataclasses import dataclass
from typing import ClassVar

from ackwise.contract._spi import BrokerURL

__all__ = ["DONE_TTL", "ClaimResult", "IdempotencyStore", "KeyState"]

#: How long a completed key is remembered (seconds) unless the store is told otherwise.
DONE_TTL = 7 * 24 * 3600.0


class KeyState(enum.Enum):
    """What a claim of an idempotency key found: ``RUN`` (the caller holds it now: run the
    task), ``DONE`` (an earlier run finished: skip it) or ``BUSY`` (another holder's lease
    is live: try again later)."""

    RUN = "run"
    DONE = "done"
    BUSY = "busy"


@dataclass(frozen=True, slots=True)
class ClaimResult:
    """The answer to :meth:`IdempotencyStore.claim`."""

    state: KeyState
    #: For BUSY: seconds until the holder's lease runs out.
    retry_after: float = 0.0


class IdempotencyStore(abc.ABC):
    """Where idempotency keys live.  Called from the worker's consumer thread only."""

    scheme: ClassVar[str] = "?"

    def __init__(self, url: BrokerURL, *, done_ttl: float = DONE_TTL) -> None:
        self.url = url
        self.done_ttl = done_ttl

    @abc.abstractmethod
    def open(self) -> None:
        """Connect to the store (called once, before any other method)."""

    @abc.abstractmethod
    def close(self) -> None:
        """Release the store's connections; safe to call twice."""

    @abc.abstractmethod
    def claim(self, key: str, holder: str, lease: float) -> ClaimResult:
        """Atomically: take ``key`` for ``holder`` for ``lease`` seconds, or say why not."""

    @abc.abstractmethod
    def extend(self, claims: Sequence[tuple[str, str]], lease: float) -> None:
        """Move the lease of each (key, holder) that still holds its key."""

    @abc.abstractmethod
    def complete(self, key: str, holder: str) -> None:
        """Mark ``key`` done: later claims answer DONE (for ``done_ttl`` seconds)."""

    @abc.abstractmethod
    def release(self, key: str, holder: str) -> None:
        """Give ``key`` up (the execution failed): the next claim may run it."""

    def forget(self, keys: Sequence[str]) -> None:  # noqa: B027 - optional, see below
        """Delete ``keys`` whatever their state (a test run cleaning up after itself).

        Optional: a store that cannot delete keys leaves them to expire (``done_ttl``).
        """
