"""What the modules below the App need of it, as protocols: they import these, never
:mod:`ackwise.app._app`, which stands on top of them and imports them (the imports of the
app wing run one way).  :class:`ackwise.App` is each of them.

Package-internal: the members that are not part of the App's API (``producer``, ``send_call``
…) are ackwise's own, documented on the App as such.  What a task and its calls need of their
App is :class:`ackwise.app._task.TaskApp` (beside the task, whose methods it takes), what a
handle needs :class:`ackwise.app._handle.ResultSource`.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any, Protocol

from ackwise.app._task import TaskApp

if TYPE_CHECKING:
    from ackwise.app._task import Task
    from ackwise.contract._spi import Adapter, Capabilities, Outgoing
    from ackwise.stores._results import ResultStore

__all__ = ["AppPort", "Diversion", "Producing"]


class Producing(Protocol):
    """An app's producer connection (the outbox, :mod:`ackwise.app._transaction`)."""

    def producer(self) -> Adapter: ...


class AppPort(TaskApp, Producing, Protocol):
    """An app as its checks read it (:mod:`ackwise.app._requirements`,
    :mod:`ackwise.app._policy`): its tasks, its stores, its broker's capabilities."""

    @property
    def tasks(self) -> Mapping[str, Task[..., Any]]: ...

    @property
    def idempotency_store_url(self) -> str | None: ...

    @property
    def rate_limit_store_url(self) -> str | None: ...

    @property
    def worker_registry_url(self) -> str | None: ...

    @property
    def adapter_class(self) -> type[Adapter]: ...

    @property
    def capabilities(self) -> Capabilities: ...

    def queues(self) -> list[str]: ...


class Diversion(Protocol):
    """Where an app's sends go instead of its broker while eager mode is on
    (``ackwise.testing.eager``, :mod:`ackwise.app._eager`)."""

    @property
    def results(self) -> ResultStore:
        """The store the app's results are read from meanwhile."""
        ...

    def publish(self, messages: Sequence[Outgoing]) -> None:
        """Take ``messages``, encoded as a publish encodes them."""
        ...
