"""What sending a task returns: its message id, and a way to its result (docs/results.md)."""

from __future__ import annotations

import asyncio
from typing import Any, Protocol

from ackwise.errors import ConfigurationError, TaskFailed
from ackwise.stores._results import FINAL, ResultState, ResultStore, TaskResult, value_of

__all__ = ["ResultSource", "TaskHandle"]


class ResultSource(Protocol):
    """What a handle needs of its App (:class:`ackwise.App` is one): its result store."""

    def results(self) -> ResultStore: ...


class TaskHandle(str):
    """The message id of a sent task (a ``str``: everything that took the id still does),
    with its result: ``state``, ``result``, ``error``, ``traceback``, ``get()``, ``aget()``.

    The result is read from the app's result store; the task must store results
    (``store_results=True`` on the task or the app), or ``get()`` waits in vain — a handle of
    a task this app knows does not store them raises at once.
    """

    _app: ResultSource
    _task: str
    _stores: bool | None

    def __new__(
        cls, message_id: str, app: ResultSource, task: str, stores: bool | None
    ) -> TaskHandle:
        handle = super().__new__(cls, message_id)
        handle._app, handle._task, handle._stores = app, task, stores
        return handle

    def __reduce__(self) -> tuple[Any, ...]:  # pickles as the plain id
        return (str, (str(self),))

    @property
    def id(self) -> str:
        return str(self)

    @property
    def task(self) -> str:
        return self._task

    def record(self) -> TaskResult | None:
        """The stored record now (``None``: nothing stored yet)."""
        return self._store().get(self.id)

    @property
    def state(self) -> ResultState:
        record = self.record()
        return ResultState.PENDING if record is None else record.status

    def ready(self) -> bool:
        """Whether the task has a final state (succeeded, failed or dead)."""
        return self.state in FINAL

    @property
    def result(self) -> Any:
        """The return value once it succeeded, else ``None`` (does not wait)."""
        record = self.record()
        if record is None or record.status is not ResultState.SUCCEEDED:
            return None
        return value_of(record)

    @property
    def error(self) -> str | None:
        record = self.record()
        return None if record is None else record.error

    @property
    def traceback(self) -> str | None:
        record = self.record()
        return None if record is None else record.traceback

    def get(self, timeout: float | None = None, *, propagate: bool = True) -> Any:
        """Wait for the final state; return the value.

        :param timeout: seconds (``None``: wait for ever).
        :param propagate: raise :class:`TaskFailed` when it failed or is dead (else return
            ``None``).
        :raises TimeoutError: no final state within ``timeout``.
        :raises TaskFailed: it failed or was dead-lettered (the error and traceback on it).
        """
        record = self._store().wait(self.id, timeout)
        return self._outcome(record, timeout, propagate)

    async def aget(self, timeout: float | None = None, *, propagate: bool = True) -> Any:
        """:meth:`get` for asyncio code: the wait runs in a thread, the loop keeps running."""
        record = await asyncio.to_thread(self._store().wait, self.id, timeout)
        return self._outcome(record, timeout, propagate)

    def _outcome(self, record: TaskResult | None, timeout: float | None, propagate: bool) -> Any:
        if record is None or record.status not in FINAL:
            state = "nothing stored" if record is None else f"state {record.state}"
            raise TimeoutError(
                f"task {self._task} ({self.id}) has no final state after {timeout}s ({state})"
            )
        if record.status is ResultState.SUCCEEDED:
            return value_of(record)
        if propagate:
            raise TaskFailed(
                self._task, self.id, record.state, record.error, record.traceback, record.reason
            )
        return None

    def _store(self) -> ResultStore:
        if self._stores is False:
            raise ConfigurationError(
                f"task {self._task} does not store results: declare it with "
                "store_results=True (or App(store_results=True))"
            )
        return self._app.results()
