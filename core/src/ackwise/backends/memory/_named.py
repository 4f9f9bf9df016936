"""What the in-process stores share: one state per ``memory://name``."""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Generic, TypeVar

__all__ = ["Named"]

S = TypeVar("S")


class Named(Generic[S]):
    """The states of one kind of in-process store, one per name: every store of that kind
    opened on ``memory://name`` shares the name's.

    :param make: a new, empty state (called once per name, on its first use).
    """

    def __init__(self, make: Callable[[], S]) -> None:
        self._make = make
        self._states: dict[str, S] = {}
        self._lock = threading.Lock()

    def get(self, name: str) -> S:
        """The state of ``name``, made on its first use."""
        with self._lock:
            state = self._states.get(name)
            if state is None:
                state = self._states[name] = self._make()
            return state
