"""The adapter SPI: every name a broker adapter, a store backend or a registering plugin needs.

An adapter distribution imports from here, from :mod:`ackwise.errors` (the errors it raises)
and from :mod:`ackwise` (the names every user has); never from a private ``ackwise._…``
module nor from another part of ackwise (``ackwise.worker``, ``ackwise.app``, ...)::

    from ackwise.spi import Adapter, BrokerURL, Capabilities, Delivery, Outgoing, QueueSpec
    from ackwise.errors import StaleReceipt, TransientAdapterError

Some of these names are also ``ackwise``'s, because a user's code receives them too
(``app.adapter()`` is an :class:`Adapter`, ``app.capabilities`` a :class:`Capabilities`, the
result store's records are :class:`TaskResult`); the others moved here from ``ackwise`` and
``ackwise.errors``, where they still work with a ``DeprecationWarning``. docs/adapter-authors.md
has the table of which is which.
"""

# Imported when first used (PEP 562), as in ``ackwise``: a plugin module that imports
# ``hookimpl`` and ``AdapterRegistry`` from here imports no store nor adapter module with them.
from __future__ import annotations

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

    from ackwise.contract._errormap import ErrorTable, from_table, mapping_errors, redact
    from ackwise.contract._spi import (
        MAX_PRIORITY,
        Adapter,
        AttemptCount,
        BrokerURL,
        Capabilities,
        DeadLetter,
        Delivery,
        Execute,
        LeaseExtension,
        Outgoing,
        QueueSpec,
        QueueStats,
        fork_generation,
        redact_url,
    )
    from ackwise.plugins._hookspecs import hookimpl
    from ackwise.plugins._registries import AdapterRegistry, LockRegistry
    from ackwise.stores._idempotency import ClaimResult, IdempotencyStore, KeyState
    from ackwise.stores._locks import Claim, LeaderLock, Leadership, LockInfo
    from ackwise.stores._presence import WorkerInfo, WorkerRegistry
    from ackwise.stores._ratelimit import RateLimiter
    from ackwise.stores._results import ResultState, ResultStore, TaskResult

__all__ = [
    "MAX_PRIORITY",
    "Adapter",
    "AdapterRegistry",
    "AttemptCount",
    "BrokerURL",
    "Capabilities",
    "Claim",
    "ClaimResult",
    "DeadLetter",
    "Delivery",
    "ErrorTable",
    "Execute",
    "IdempotencyStore",
    "KeyState",
    "LeaderLock",
    "Leadership",
    "LeaseExtension",
    "LockInfo",
    "LockRegistry",
    "Outgoing",
    "QueueSpec",
    "QueueStats",
    "RateLimiter",
    "ResultState",
    "ResultStore",
    "TaskResult",
    "WorkerInfo",
    "WorkerRegistry",
    "fork_generation",
    "from_table",
    "hookimpl",
    "mapping_errors",
    "redact",
    "redact_url",
]

#: The module each name lives in.
_LAZY: dict[str, str] = {
    **dict.fromkeys(["ErrorTable", "from_table", "mapping_errors", "redact"], "contract._errormap"),
    **dict.fromkeys(
        [
            "MAX_PRIORITY",
            "Adapter",
            "AttemptCount",
            "BrokerURL",
            "Capabilities",
            "DeadLetter",
            "Delivery",
            "Execute",
            "LeaseExtension",
            "Outgoing",
            "QueueSpec",
            "QueueStats",
            "fork_generation",
            "redact_url",
        ],
        "contract._spi",
    ),
    "hookimpl": "plugins._hookspecs",
    "AdapterRegistry": "plugins._registries",
    "LockRegistry": "plugins._registries",
    **dict.fromkeys(["ClaimResult", "IdempotencyStore", "KeyState"], "stores._idempotency"),
    **dict.fromkeys(["Claim", "LeaderLock", "Leadership", "LockInfo"], "stores._locks"),
    **dict.fromkeys(["WorkerInfo", "WorkerRegistry"], "stores._presence"),
    "RateLimiter": "stores._ratelimit",
    **dict.fromkeys(["ResultState", "ResultStore", "TaskResult"], "stores._results"),
}


def __getattr__(name: str) -> Any:
    """Import a name of the SPI the first time it is asked for."""
    try:
        module = _LAZY[name]
    except KeyError:
        raise AttributeError(f"module 'ackwise.spi' has no attribute {name!r}") from None
    from importlib import import_module

    value = getattr(import_module(f"ackwise.{module}"), name)
    globals()[name] = value  # the next access does not come here
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
