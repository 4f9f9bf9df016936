"""How an adapter maps its driver's exceptions into :mod:`ackwise.errors`, in one place.

Public as :mod:`ackwise.spi`'s ``ErrorTable``, ``from_table``, ``mapping_errors`` and
``redact`` (``ackwise.errors`` served them before; it still does, deprecated).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator, Mapping

from ackwise.errors import AdapterError, PermanentAdapterError

__all__ = ["ErrorTable", "from_table", "mapping_errors", "redact"]

#: A driver exception class -> (the ackwise class to raise, what it means, for the message).
ErrorTable = Mapping[type[BaseException], tuple[type[AdapterError], str]]
"""An adapter's driver exceptions mapped to ackwise's error class and a hint (:func:`from_table`)."""


def redact(text: str, secret: str | None) -> str:
    """``text`` with ``secret`` (a password a driver might echo) blanked out."""
    return text.replace(secret, "***") if secret else text


def from_table(exc: BaseException, table: ErrorTable, where: str, detail: str) -> AdapterError:
    """The error ``table`` gives for ``exc``'s class or its nearest listed base class.

    The message reads ``"{where}: {meaning}: {detail} ({driver class})"``; an exception no
    class of which is listed is a :class:`PermanentAdapterError`.  Not raised.
    """
    for cls in type(exc).__mro__:
        entry = table.get(cls)
        if entry is not None:
            target, meaning = entry
            return target(f"{where}: {meaning}: {detail} ({type(exc).__name__})")
    return PermanentAdapterError(f"{where}: {type(exc).__name__}: {detail}")


@contextlib.contextmanager
def mapping_errors(
    translate: Callable[[BaseException, str, str | None], AdapterError],
    caught: tuple[type[BaseException], ...],
    where: str,
    secret: str | None = None,
) -> Iterator[None]:
    """Re-raise every ``caught`` (and socket) error as ``translate(exc, where, secret)``.

    Always ``from`` the driver's exception, so the cause stays in the traceback.  An adapter's
    ``map_<driver>_errors()`` is this with its own table and translation.
    """
    handled: tuple[type[BaseException], ...] = (*caught, OSError)
    try:
        yield
    except handled as exc:
        raise translate(exc, where, secret) from exc
