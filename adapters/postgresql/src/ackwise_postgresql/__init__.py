"""ackwise-postgresql: the PostgreSQL adapter for ackwise (``postgresql://``, ``postgres://``).

Importing this package stays light (the entry point imports :mod:`ackwise_postgresql.plugin`
through it): the adapter and psycopg are imported on first use of these names.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from ackwise_postgresql._adapter import MAX_MESSAGE_SIZE, PostgreSQLAdapter

__all__ = ["MAX_MESSAGE_SIZE", "PostgreSQLAdapter"]


def __getattr__(name: str) -> Any:
    if name in __all__:
        from ackwise_postgresql import _adapter

        return getattr(_adapter, name)
    raise AttributeError(f"module 'ackwise_postgresql' has no attribute {name!r}")
