"""What the ``send_on_commit`` helpers accept, turned into a call that sends it."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from ackwise.app._task import Signature
from ackwise.errors import ConfigurationError

if TYPE_CHECKING:
    from ackwise.app._app import App

__all__ = ["sender"]


def sender(call: Any, app: App | None = None) -> Callable[[], Any]:
    """``call`` (a task's signature, ``task.s(...)``; one by name with its ``app``; or a
    chain, group or chord) as a function that sends it.  Checked now, sent later."""
    if isinstance(call, Signature):
        owner = app if isinstance(call.task, str) else call.task.app
        if owner is None:
            raise ConfigurationError(
                f"send_on_commit({call.task!r} by name): a signature by name needs its app "
                "(send_on_commit(app.signature(...), app=app))"
            )
        return lambda: owner.send_many([call])
    apply_async = getattr(call, "apply_async", None)
    if not callable(apply_async):
        raise ConfigurationError(
            f"send_on_commit() got {type(call).__name__}; expected a signature (task.s(...)), "
            "a chain, a group or a chord"
        )
    send: Callable[[], Any] = apply_async
    return send
