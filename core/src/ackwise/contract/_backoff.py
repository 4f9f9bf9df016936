"""Reconnect delays: exponential, capped, with jitter, so that workers restarted together by
an outage do not all knock on the broker at the same instant when it comes back."""

from __future__ import annotations

import random

__all__ = ["Backoff"]


class Backoff:
    """Delays of ``first * 2**n`` seconds up to ``cap``, each drawn from ``[d / 2, d]``.

    Half the delay is kept ("equal jitter"): a retry never comes at once, and copies of one
    fleet spread over the other half.
    """

    def __init__(self, first: float = 0.1, cap: float = 5.0) -> None:
        self.first = first
        self.cap = cap
        self._current = 0.0

    def next(self) -> float:
        """The delay before the next attempt."""
        self._current = min(self.cap, self._current * 2 if self._current else self.first)
        return random.uniform(self._current / 2, self._current)

    def reset(self) -> None:
        """An attempt worked: the next failure starts from ``first`` again."""
        self._current = 0.0

    @property
    def failing(self) -> bool:
        """Whether attempts have failed since the last :meth:`reset`."""
        return self._current > 0
