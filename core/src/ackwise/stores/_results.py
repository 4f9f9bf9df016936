"""Task results (docs/results.md): what a task returned, or why it did not, kept for a while.

A task with ``store_results`` has one record per message id in the app's result store:

``started``    it began (``track_started``); replaced by what follows;
``succeeded``  it returned (the value, JSON); written once: never replaced, so a redelivered
               execution (its first run's ack lost to a crash) cannot change a stored success;
``failed``     it raised and was dead-lettered ``failed``;
``dead``       it was dead-lettered for another reason (``max_deliveries``, ``worker_lost``…)
               or lost (``Ack.EARLY``); a later run (a replayed dead letter) replaces it.

The worker writes a success before its ack, so a crash in between runs the task again and
keeps the first value.  Records expire after the store's TTL.
"""

from __future__ import annotations

import abc
import contextlib
import enum
import time
from collections.abc import Callable, Iterator, Sequence
from typing import Any, ClassVar

import msgspec

from ackwise.contract._spi import BrokerURL

__all__ = [
    "FINAL",
    "RESULT_TTL",
    "ResultState",
    "ResultStore",
    "TaskResult",
    "value_of",
]

#: How long a record is kept (seconds) unless the app says otherwise (``result_ttl``).
RESULT_TTL = 24 * 3600.0


class ResultState(enum.Enum):
    """Where a task's result stands: ``PENDING`` (nothing recorded yet), ``STARTED`` (with
    ``track_started``), ``SUCCEEDED``, ``FAILED`` (raised) or ``DEAD`` (dead-lettered)."""

    PENDING = "pending"
    STARTED = "started"
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    DEAD = "dead"


#: States after which the message is settled (a dead one may still be replayed).
FINAL = frozenset({ResultState.SUCCEEDED, ResultState.FAILED, ResultState.DEAD})


class TaskResult(msgspec.Struct, frozen=True, omit_defaults=True, kw_only=True):
    """One message's record.  ``value`` is the return value as JSON text (``succeeded``)."""

    id: str
    state: str
    task: str | None = None
    value: str | None = None
    error: str | None = None
    traceback: str | None = None
    #: ``dead``: the dead-letter reason.
    reason: str | None = None
    attempt: int = 0
    at: float = 0.0

    @property
    def status(self) -> ResultState:
        return ResultState(self.state)

    @property
    def final(self) -> bool:
        """Succeeded, failed or dead."""
        return self.status in FINAL

    def replaces(self, old: TaskResult | None) -> bool:
        """Whether this record may overwrite ``old``: a success never; a final state not by
        ``started``."""
        if old is None:
            return True
        if old.status is ResultState.SUCCEEDED:
            return False
        return not (self.status is ResultState.STARTED and old.status in FINAL)

    def to_json(self) -> bytes:
        """The record as stored: JSON bytes."""
        return _ENCODER.encode(self)

    @classmethod
    def from_json(cls, raw: bytes | str) -> TaskResult:
        """A record from what :meth:`to_json` stored."""
        return _DECODER.decode(raw)


_ENCODER = msgspec.json.Encoder()
_DECODER = msgspec.json.Decoder(TaskResult)


class ResultStore(abc.ABC):
    """Where task results live.  The worker writes from its loop thread; handles read from
    any thread of the producer (an implementation guards its connection)."""

    scheme: ClassVar[str] = "?"

    def __init__(self, url: BrokerURL, *, ttl: float = RESULT_TTL) -> None:
        self.url = url
        self.ttl = ttl

    @classmethod
    def namespace_options(cls, url: BrokerURL, namespace: str) -> dict[str, str]:
        """URL options under which this store keeps its records apart, under ``namespace``,
        from those of the store at ``url`` (default: none, the store has no namespaces).

        The conformance suite adds them to the URL of a run's result store, so that the run's
        records are named with its prefix (Redis: the key prefix).
        """
        return {}

    @abc.abstractmethod
    def open(self) -> None:
        """Connect to the store (called once, before any other method)."""

    @abc.abstractmethod
    def close(self) -> None:
        """Release the store's connections; safe to call twice."""

    @abc.abstractmethod
    def put(self, records: Sequence[TaskResult]) -> None:
        """Store each record where :meth:`TaskResult.replaces` lets it, atomically per record."""

    @abc.abstractmethod
    def get(self, message_id: str) -> TaskResult | None:
        """The record of ``message_id``, or ``None`` (none yet, or expired)."""

    @abc.abstractmethod
    def forget(self, message_ids: Sequence[str]) -> None:
        """Delete these records (and chord counts of these ids) now."""

    @abc.abstractmethod
    def join(self, chord_id: str, member: int) -> int:
        """Count ``member`` as finished in the chord ``chord_id`` (once, however often it is
        said); return how many distinct members have finished.  Kept for the store's TTL."""

    def wait(self, message_id: str, timeout: float | None) -> TaskResult | None:
        """Wait until the record is final, at most ``timeout`` seconds (``None``: for ever);
        return it, or the latest record (``None`` if there is none) at the timeout.

        Reads, then pauses as :meth:`_listening` says, until then.
        """
        deadline = None if timeout is None else time.monotonic() + timeout
        with self._listening(message_id) as pause:
            while True:
                record = self.get(message_id)
                if record is not None and record.final:
                    return record
                left = None if deadline is None else deadline - time.monotonic()
                if left is not None and left <= 0:
                    return record
                pause(left)

    @contextlib.contextmanager
    def _listening(self, message_id: str) -> Iterator[Callable[[float | None], None]]:
        """Entered before :meth:`wait`'s first read; yields how to pause until the record
        may have changed (at most the time left, ``None``: no limit).

        This default polls, from every 5 ms up to every 0.2 s; stores that can be told of a
        write (Redis pub/sub, PostgreSQL LISTEN) subscribe here and wait for it instead.
        """
        step = 0.005

        def pause(left: float | None) -> None:
            nonlocal step
            time.sleep(step if left is None else min(step, left))
            step = min(step * 2, 0.2)

        yield pause


def value_of(record: TaskResult) -> Any:
    """The return value of a ``succeeded`` record, decoded."""
    return msgspec.json.decode(record.value) if record.value is not None else None
