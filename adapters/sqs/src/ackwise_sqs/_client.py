"""The boto3 client: opening it (afresh after a fork), every API call through it (counted, its
errors mapped by :func:`~ackwise_sqs.map_botocore_errors`), and the parallel requests of one
call on a small thread pool.

See the adapter's overview (:mod:`ackwise_sqs._adapter`).
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

from ackwise.spi import Adapter, BrokerURL, fork_generation
from ackwise_sqs._errors import map_botocore_errors
from ackwise_sqs._url import SQSSettings, parse_sqs_url

# The adapter's one logger, named as before it was split into modules.
log = logging.getLogger("ackwise_sqs._adapter")

#: Requests of one receive / ack / extend that run at once (each carries up to 10 messages).
_PARALLEL = 4


class _Client(Adapter):
    """The boto3 client of one adapter, its API calls and their parallel requests."""

    def __init__(self, url: BrokerURL) -> None:
        super().__init__(url)
        self.settings: SQSSettings = parse_sqs_url(url)
        self._client: Any = None
        #: API calls made, by operation name (for benchmarks and tests).
        self.calls: dict[str, int] = {}
        #: Early receives of long delays re-armed by visibility (not deliveries).
        self.rearmed = 0
        self._counting = threading.Lock()
        self._generation = fork_generation()
        self._io: cf.ThreadPoolExecutor | None = None  # the parallel requests of one call
        #: Per thread: when the last HTTP attempt of its current call was sent (botocore
        #: retries a request on a reset connection; the retry is when SQS may take messages).
        self._sent = threading.local()

    # -- lifecycle -------------------------------------------------------------------------
    def open(self) -> None:
        if self._generation != fork_generation():
            # Inherited through fork(): the parent's client and threads are not ours to use.
            self._client, self._io = None, None
            self._generation = fork_generation()
        if self._client is not None:
            return
        s = self.settings
        with map_botocore_errors("SQS: open"):
            session = boto3.session.Session(profile_name=s.profile, region_name=s.region)
            self._client = session.client(
                "sqs",
                endpoint_url=s.endpoint_url,
                config=Config(
                    connect_timeout=5,
                    read_timeout=30,  # above the longest long poll (20 s)
                    retries={"mode": "standard", "max_attempts": 3},
                    max_pool_connections=_PARALLEL + 1,
                ),
            )
            self._client.meta.events.register("before-send.sqs", self._note_send)

    def _note_send(self, **_: Any) -> None:
        self._sent.at = time.time()  # returns None: the request goes out as usual

    def last_send(self, since: float) -> float:
        """When this thread's last HTTP attempt went out (``since`` if none did after it)."""
        return max(since, getattr(self._sent, "at", since))

    def close(self) -> None:
        io, self._io = self._io, None
        if io is not None and self._generation == fork_generation():
            io.shutdown(wait=False)  # idle: every call waits for its requests
        client, self._client = self._client, None
        if client is not None:
            try:
                client.close()
            except Exception:  # closing a broken connection pool
                log.debug("closing the SQS client failed", exc_info=True)

    def _call(self, operation: str, **params: Any) -> dict[str, Any]:
        if self._client is None or self._generation != fork_generation():
            self.open()
        with self._counting:  # the parallel requests of one call count from their threads
            self.calls[operation] = self.calls.get(operation, 0) + 1
        with map_botocore_errors(f"SQS {operation}"):
            result: dict[str, Any] = getattr(self._client, _snake(operation))(**params)
        return result

    # -- parallel requests -----------------------------------------------------------------
    def _parallel(
        self, fn: Callable[[Any], Any], items: Sequence[Any]
    ) -> tuple[list[Any], Exception | None]:
        """``fn`` over ``items``, up to _PARALLEL at once (the first on this thread).

        Returns the results of the calls that succeeded, in order, and the first error.
        """
        if not items:
            return [], None
        if self._generation != fork_generation():
            self.open()  # not the parent's threads
        if self._io is None and len(items) > 1:
            self._io = cf.ThreadPoolExecutor(_PARALLEL - 1, thread_name_prefix="ackwise-sqs")
        futures = [self._io.submit(fn, x) for x in items[1:]] if self._io else []
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
