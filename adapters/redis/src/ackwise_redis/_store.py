"""What the Redis stores (idempotency keys, task results, rate limits, the worker registry)
share: one connection to the Redis of their URL, one command at a time, and the URL's key
prefix."""

from __future__ import annotations

import threading
from typing import Any

from ackwise.spi import BrokerURL
from ackwise_redis._connection import Link
from ackwise_redis._url import PREFIX_FORM, RedisSettings, parse_redis_url

__all__ = ["RedisStoreBase"]


class RedisStoreBase:
    """Mixed in before the store's ABC: ``class S(RedisStoreBase, ResultStore)``."""

    def __init__(self, url: BrokerURL, **kwargs: Any) -> None:
        super().__init__(url, **kwargs)  # type: ignore[call-arg]  # the store's ABC
        self.settings: RedisSettings = parse_redis_url(url)
        self._link = Link(self.settings)
        self._mutex = threading.Lock()  # one connection: one command at a time

    @classmethod
    def namespace_options(cls, url: BrokerURL, namespace: str) -> dict[str, str]:
        """``prefix=<the URL's prefix>:<namespace>``: the store's keys then start with
        ``{<prefix>:<namespace>`` (none when that is not a valid prefix)."""
        prefix = f"{parse_redis_url(url).prefix}:{namespace}"
        return {"prefix": prefix} if PREFIX_FORM.match(prefix) else {}

    def open(self) -> None:
        with self._mutex, self._link.errors():
            self._link.connection()

    def close(self) -> None:
        with self._mutex:
            self._link.close()
