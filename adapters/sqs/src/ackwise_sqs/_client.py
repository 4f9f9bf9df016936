"""The boto3 client: opening it (afresh after a fork), every API call through it (counted, its
errors mapped by :func:`~ackwise_sqs.map_botocore_errors`), and the parallel requests of one
call on a small thread pool.

The adapter holds one :class:`Client`, which its other parts use; see its overview
(:mod:`ackwise_sqs._adapter`).
"""

from __future__ import annotations

import concurrent.futures as cf
import logging
import re
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from typing import Any

import boto3
from botocore.config import Config

from ackwise.spi import fork_generation
from ackwise_sqs._errors import map_botocore_errors
from ackwise_sqs._url import SQSSettings

__all__ = ["Client"]

# The adapter's one logger, named as before it was split into modules.
log = logging.getLogger("ackwise_sqs._adapter")

#: Requests of one receive / ack / extend that run at once (each carries up to 10 messages).
_PARALLEL = 4


class Client:
    """The boto3 client of one adapter, its API calls and their parallel requests."""

    def __init__(self, settings: SQSSettings) -> None:
        self.settings = settings
        #: The boto3 client (None until opened).
        self.boto: Any = None
        #: API calls made, by operation name (for benchmarks and tests).
        self.calls: dict[str, int] = {}
        self._counting = threading.Lock()
        self._generation = fork_generation()
        self._pool: cf.ThreadPoolExecutor | None = None  # the parallel requests of one call
        #: Per thread: when the last HTTP attempt of its current call was sent (botocore
        #: retries a request on a reset connection; the retry is when SQS may take messages).
        self._sent = threading.local()

    # -- lifecycle -------------------------------------------------------------------------
    def open(self) -> None:
        if self._generation != fork_generation():
            # Inherited through fork(): the parent's client and threads are not ours to use.
            self.boto, self._pool = None, None
            self._generation = fork_generation()
        if self.boto is not None:
            return
        s = self.settings
        with map_botocore_errors("SQS: open"):
            session = boto3.session.Session(profile_name=s.profile, region_name=s.region)
            self.boto = session.client(
                "sqs",
                endpoint_url=s.endpoint_url,
                config=Config(
                    connect_timeout=5,
                    read_timeout=30,  # above the longest long poll (20 s)
                    retries={"mode": "standard", "max_attempts": 3},
                    max_pool_connections=_PARALLEL + 1,
                ),
            )
            self.boto.meta.events.register("before-send.sqs", self._note_send)

    def _note_send(self, **_: Any) -> None:
        self._sent.at = time.time()  # returns None: the request goes out as usual

    def last_send(self, since: float) -> float:
        """When this thread's last HTTP attempt went out (``since`` if none did after it)."""
        return max(since, getattr(self._sent, "at", since))

    def close(self) -> None:
        pool, self._pool = self._pool, None
        if pool is not None and self._generation == fork_generation():
            pool.shutdown(wait=False)  # idle: every call waits for its requests
        client, self.boto = self.boto, None
        if client is not None:
            try:
                client.close()
            except Exception:  # closing a broken connection pool
                log.debug("closing the SQS client failed", exc_info=True)

    def call(self, operation: str, **params: Any) -> dict[str, Any]:
        """One API call (``operation`` as SQS names it), counted, its errors mapped."""
        if self.boto is None or self._generation != fork_generation():
            self.open()
        with self._counting:  # the parallel requests of one call count from their threads
            self.calls[operation] = self.calls.get(operation, 0) + 1
        with map_botocore_errors(f"SQS {operation}"):
            result: dict[str, Any] = getattr(self.boto, _snake(operation))(**params)
        return result

    # -- parallel requests -----------------------------------------------------------------
    def parallel(
        self, fn: Callable[[Any], Any], items: Sequence[Any]
    ) -> tuple[list[Any], Exception | None]:
        """``fn`` over ``items``, up to _PARALLEL at once (the first on this thread).

        Returns the results of the calls that succeeded, in order, and the first error.
        """
        if not items:
            return [], None
        if self._generation != fork_generation():
            self.open()  # not the parent's threads
        if self._pool is None and len(items) > 1:
            self._pool = cf.ThreadPoolExecutor(_PARALLEL - 1, thread_name_prefix="ackwise-sqs")
        futures = [self._pool.submit(fn, x) for x in items[1:]] if self._pool else []
        results: list[Any] = []
        error: Exception | None = None
        try:
            results.append(fn(items[0]))
        except Exception as exc:
            error = exc
        for f in futures:
            try:
                results.append(f.result())
            except Exception as exc:
                error = error or exc
        return results, error


def _snake(operation: str) -> str:
    return re.sub(r"(?<!^)(?=[A-Z])", "_", operation).lower()


def _slices(items: list[Any], n: int) -> Iterable[list[Any]]:
    for i in range(0, len(items), n):
        yield items[i : i + n]
