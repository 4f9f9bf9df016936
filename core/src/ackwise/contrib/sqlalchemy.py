"""Send after a SQLAlchemy session commits (``after_commit``): the smaller guarantee.

``send_on_commit(session, add.s(1, 2))`` sends the call once the session's transaction has
committed, and never if it rolls back (a savepoint that rolls back drops the calls made in
it).  What it loses against ``app.transaction(session)`` (docs/outbox.md): a process that
dies, or a broker that is down, between the commit and the send loses the call; the data is
committed and nothing sends it again.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ackwise.contrib._calls import sender

if TYPE_CHECKING:
    from ackwise.app._app import App

__all__ = ["send_on_commit"]

#: ``session.info`` key: the calls waiting for the commit, each with the transaction it was
#: made in.
_PENDING = "ackwise_send_on_commit"


def send_on_commit(session: Any, call: Any, *, app: App | None = None) -> None:
    """Send ``call`` (``task.s(...)``, a chain, group or chord; by name with ``app``) after
    ``session``'s transaction commits; drop it if that transaction rolls back.

    A send that fails raises from ``session.commit()``, after the data was committed.
    """
    from sqlalchemy import event

    send = sender(call, app)
    pending = session.info.get(_PENDING)
    if pending is None:
        pending = session.info[_PENDING] = []
        event.listen(session, "after_commit", _after_commit)
        event.listen(session, "after_soft_rollback", _after_soft_rollback)
    tx = session.get_nested_transaction() or session.get_transaction()
    if tx is None:  # no transaction yet: the next statement opens one
        tx = session.begin()
    pending.append((tx, send))


def _after_commit(session: Any) -> None:
    if session.get_nested_transaction() is not None:
        return  # a savepoint released: its calls wait for the outermost commit
    pending = session.info.get(_PENDING) or []
    session.info[_PENDING] = []
    for _, send in pending:
        send()


def _after_soft_rollback(session: Any, previous_transaction: Any) -> None:
    pending = session.info.get(_PENDING)
    if pending:
        session.info[_PENDING] = [
            (tx, send) for tx, send in pending if not _within(tx, previous_transaction)
        ]


def _within(tx: Any, ancestor: Any) -> bool:
    while tx is not None:
        if tx is ancestor:
            return True
        tx = tx.parent
    return False
