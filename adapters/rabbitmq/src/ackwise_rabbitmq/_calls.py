"""A call handed to the I/O thread (:mod:`ackwise_rabbitmq._io`) and the wait for its answer."""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from typing import Any

__all__ = ["Publish", "_Call", "_Done"]

#: A message to publish: exchange, routing key, body, properties.
Publish = tuple[str, str, bytes, Any]


class _Done:
    """Whether a call is done, and a wait for it: an ``Event`` for one waiter, without the
    ``Condition`` an Event builds (a call is made for every publish)."""

    __slots__ = ("_flag", "_lock")

    def __init__(self) -> None:
        self._flag = False
        self._lock = threading.Lock()
        self._lock.acquire()  # released once, by set()

    def is_set(self) -> bool:
        return self._flag

    def set(self) -> None:
        """Mark it done; again is a no-op."""
        if not self._flag:
            self._flag = True
            try:
                self._lock.release()
            except RuntimeError:  # two threads set it at once (a failure and a shutdown)
                pass

    def wait(self, timeout: float) -> bool:
        """Whether it is done, waiting up to ``timeout`` seconds (one waiter)."""
        if not self._flag:
            self._lock.acquire(timeout=timeout)
        return self._flag


class _Call:
    __slots__ = ("detached", "done", "error", "fn", "publish", "result")

    def __init__(
        self,
        fn: Callable[[], Any],
        *,
        detached: bool = False,
        publish: Sequence[Publish] | None = None,
    ) -> None:
        self.fn = fn
        self.detached = detached  # nobody waits for it: its error is logged
        #: A confirmed publish of these messages: publishes queued behind one another go
        #: out while earlier ones await their confirms
        #: (:meth:`~ackwise_rabbitmq._io.IOThread._run_publishes`).
        self.publish = publish
        self.done = _Done()
        self.result: Any = None
        self.error: BaseException | None = None
