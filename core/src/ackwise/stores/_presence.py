"""Which workers are alive: each worker writes a record of itself every few seconds to the
app's worker registry (docs/workers.md), and ``ackwise workers`` reads them back.

A record names the worker (``host:pid``) and says what it runs (queues, pool, concurrency,
version), since when, what it has done (counters) and when it was last seen.  A worker that
stops cleanly writes a last record, ``stopped``; one that dies just stops writing, and is shown
``gone`` once its record is older than :data:`GONE_AFTER`.  Records are dropped
:data:`FORGET_AFTER` after their last write, or at once by :meth:`WorkerRegistry.forget` (a
test run cleaning up after itself).  The registry is the broker's own where its adapter has
one (memory, SQLite, Redis, PostgreSQL), else ``App(worker_registry=URL)``.
"""

from __future__ import annotations

import abc
import json
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from typing import Any, ClassVar

from ackwise.contract._spi import BrokerURL

__all__ = ["FORGET_AFTER", "GONE_AFTER", "HEARTBEAT", "WorkerInfo", "WorkerRegistry", "ordered"]

#: Seconds between two records of a running worker.
HEARTBEAT = 5.0
#: A running worker whose last record is older than this is shown ``gone``.
GONE_AFTER = 3 * HEARTBEAT
#: Records are forgotten this long after their last write.
FORGET_AFTER = 3600.0


@dataclass(frozen=True)
class WorkerInfo:
    """One worker as it last described itself."""

    id: str
    host: str
    pid: int
    app: str
    queues: list[str]
    pool: str
    concurrency: int
    version: str
    started_at: float
    last_seen: float
    #: ``running``, ``stopping`` (a graceful stop under way) or ``stopped``.
    state: str = "running"
    #: Tasks running now.
    running: int = 0
    #: What it has done since it started: ``succeeded``, ``failed``, ``retried``, …
    counters: dict[str, int] = field(default_factory=dict)
    #: ``[succeeded, failed]`` since it started, by queue.
    by_queue: dict[str, list[int]] = field(default_factory=dict)

    def status(self, now: float | None = None) -> str:
        """``state``, or ``gone`` when a worker that did not stop cleanly went quiet."""
        now = time.time() if now is None else now
        if self.state != "stopped" and now - self.last_seen > GONE_AFTER:
            return "gone"
        return self.state

    def to_json(self) -> str:
        """The record as the registry stores it: compact JSON."""
        return json.dumps(asdict(self), separators=(",", ":"))

    @classmethod
    def from_json(cls, text: str | bytes) -> WorkerInfo:
        """A record from what :meth:`to_json` stored (fields this version does not know are
        dropped)."""
        data: dict[str, Any] = json.loads(text)
        return cls(**{k: v for k, v in data.items() if k in _FIELDS})


_FIELDS = set(WorkerInfo.__dataclass_fields__)


class WorkerRegistry(abc.ABC):
    """Where workers write their records; see the module documentation."""

    scheme: ClassVar[str] = "?"

    def __init__(self, url: BrokerURL) -> None:
        self.url = url

    @classmethod
    def namespace_options(cls, url: BrokerURL, namespace: str) -> dict[str, str]:
        """URL options under which this registry keeps its records apart, under
        ``namespace``, from those of the registry at ``url`` (default: none, the store has no
        namespaces).

        The conformance suite adds them to the URL of a run's registry, so that the run's
        records are named with its prefix (Redis: the key prefix).
        """
        return {}

    @abc.abstractmethod
    def open(self) -> None:
        """Connect to the registry (called once, before any other method)."""

    @abc.abstractmethod
    def close(self) -> None:
        """Release the registry's connections; safe to call twice."""

    @abc.abstractmethod
    def beat(self, info: WorkerInfo) -> None:
        """Write ``info`` in place of the worker's previous record."""

    @abc.abstractmethod
    def workers(self) -> list[WorkerInfo]:
        """Every record not yet forgotten, oldest start first (forgets the old ones)."""

    def forget(self, worker_ids: Sequence[str]) -> None:  # noqa: B027 - optional, see below
        """Delete the records of ``worker_ids`` now (a test run cleaning up after itself).

        Optional: a registry that cannot delete records leaves them to be forgotten
        :data:`FORGET_AFTER` after their last write.
        """


def ordered(infos: Sequence[WorkerInfo]) -> list[WorkerInfo]:
    """``infos`` as :meth:`WorkerRegistry.workers` returns them: oldest start first."""
    return sorted(infos, key=lambda w: (w.started_at, w.id))
