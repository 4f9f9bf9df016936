"""``with app.transaction(conn):`` — every call sent inside the block is written in the
caller's database transaction: enqueued if and only if it commits (docs/outbox.md).

On a broker that can take the rows in that transaction itself (the PostgreSQL adapter, when
``conn`` is on its database), the messages are its rows; on any other broker they go to the
``ackwise_outbox`` table of ``conn``'s database, which ``ackwise relay`` publishes.
"""

from __future__ import annotations

import contextlib
import contextvars
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from ackwise.app import _outbox
from ackwise.app._dbconn import executor_for
from ackwise.contract._spi import Execute, Outgoing

if TYPE_CHECKING:
    from ackwise.app._ports import Producing

__all__ = ["Enlisted", "current", "enlist"]


@dataclass
class Enlisted:
    """An app's sends inside one ``with app.transaction(conn):`` block."""

    app: Producing
    execute: Execute
    #: True: to the outbox table (the broker cannot take them in this transaction); each
    #: message then carries the idempotency key ``outbox:<id>``, so that a relay that
    #: publishes it twice (killed before it deleted the row) has one effect.
    outbox: bool

    def publish(self, queue: str, messages: Sequence[Outgoing]) -> None:
        if not self.outbox:
            self.app.producer().publish_in_transaction(self.execute, queue, messages)
            return
        self.execute(_outbox.INSERT, _outbox.insert_params(queue, messages))
        self.execute(_outbox.NOTIFY, {})


_current: contextvars.ContextVar[tuple[Enlisted, ...]] = contextvars.ContextVar(
    "ackwise_transactions", default=()
)


def current(app: Producing) -> Enlisted | None:
    """The innermost transaction block of ``app`` open in this context, or None."""
    for enlisted in reversed(_current.get()):
        if enlisted.app is app:
            return enlisted
    return None


@contextlib.contextmanager
def enlist(app: Producing, conn: Any) -> Iterator[Enlisted]:
    execute = executor_for(conn)
    outbox = not app.producer().takes_transaction(execute)
    if outbox and execute(_outbox.EXISTS, {})[0][0] is None:
        # The first time on this database: created in the caller's transaction (the lock
        # is held until it ends), so a rolled-back first send leaves nothing either.
        execute("SELECT pg_advisory_xact_lock(%(key)s)", {"key": _outbox.SCHEMA_LOCK})
        for statement in _outbox.SCHEMA:
            execute(statement, {})
    enlisted = Enlisted(app, execute, outbox)
    token = _current.set((*_current.get(), enlisted))
    try:
        yield enlisted
    finally:
        _current.reset(token)
