"""What the Redis stores (idempotency keys, task results) share: one connection to the Redis
of their URL, one command at a time."""

from __future__ import annotations

import threading
from typing import Any

from ackwise import BrokerURL
from ackwise_redis._connection import Link
from ackwise_redis._url import RedisSettings, parse_redis_url

__all__ = ["RedisStoreBase"]


class RedisStoreBase:
    """Mixed in before the store's ABC: ``class S(RedisStoreBase, ResultStore)``."""

    def __init__(self, url: BrokerURL, **kwargs: Any) -> None:
        super().__init__(url, **kwargs)  # type: ignore[call-arg]  # the store's ABC
        self.settings: RedisSettings = parse_redis_url(url)
        self._link = Link(self.settings)
        self._mutex = threading.Lock()  # one connection: one command at a time

    def open(self) -> None:
        with self._mutex, self._link.errors():
            self._link.connection()

    def close(self) -> None:
        with self._mutex:
            self._link.close()
