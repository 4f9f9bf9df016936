"""Deadline-based polling helpers: synchronize on a condition, never on a bare sleep."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TypeVar

__all__ = ["eventually"]

T = TypeVar("T")


def eventually(
    predicate: Callable[[], T],
    timeout: float = 5.0,
    *,
    interval: float = 0.02,
    description: str | None = None,
) -> T:
    """Call ``predicate`` until it returns a truthy value, and return that value.

    Polls every ``interval`` seconds (backing off to ten times that) until ``timeout`` seconds
    have passed, then raises :class:`AssertionError` naming ``description`` and the last value
    returned.  An exception raised by ``predicate`` propagates at once.
    """
    deadline = time.monotonic() + timeout
    pause = min(interval, 0.005)
    while True:
        value = predicate()
        if value:
            return value
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            what = description or getattr(predicate, "__name__", "condition")
            raise AssertionError(
                f"{what}: still false after {timeout:.2f}s (last value: {value!r})"
            )
        time.sleep(min(pause, remaining))
        pause = min(pause * 2, interval * 10)
