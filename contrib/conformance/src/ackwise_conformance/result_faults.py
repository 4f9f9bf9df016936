"""Result stores that kill their own worker at an exact point of a task's settlement.

``crash-after-result-<scheme>://…`` (C25: "killed after the store write, before the ack") is
the real result store of ``<scheme>://…`` (SQLite, Redis, memory…) whose ``put`` SIGKILLs its
own process once it has stored a ``succeeded`` record: the record is in the store, the worker
never sends the ack.

``crash-after-callback-<scheme>://…`` (C26) SIGKILLs its process at the first ``put`` after a
chord member's ``join`` completed its chord.  A worker reads the members' values (``get``) only
after a join that completed the chord, then sends the callback, then writes the member's own
record with its ack: so the worker dies after the callback is sent and before the member is
acked.

Worker processes get them with ``ACKWISE_PLUGINS=ackwise_conformance.result_faults``.  The
store is the fault; the broker and its adapter are the real ones under test.
"""

from __future__ import annotations

import functools
import os
import signal
import threading
from collections.abc import Sequence
from typing import Any

from ackwise import BrokerURL, ResultStore, TaskResult, get_plugins, hookimpl
from ackwise.spi import AdapterRegistry

__all__ = ["AFTER_CALLBACK", "PREFIX", "ackwise_register_adapters", "crashing"]

PREFIX = "crash-after-result-"
AFTER_CALLBACK = "crash-after-callback-"
_KINDS = {PREFIX: "CrashAfterResult", AFTER_CALLBACK: "CrashAfterCallback"}
_SCHEMES = (
    *("sqlite", "memory", "redis", "rediss", "unix", "postgresql", "postgres"),
    *("redis+cluster", "rediss+cluster", "redis+sentinel", "rediss+sentinel"),
)


def crashing(url: str, *, after: str = PREFIX) -> str:
    """The URL of the store of ``url`` that dies at ``after`` (:data:`PREFIX`: once it wrote a
    success; :data:`AFTER_CALLBACK`: once a chord it completed sent its callback)."""
    if after not in _KINDS:
        raise ValueError(f"no such fault: {after!r} (known: {', '.join(_KINDS)})")
    return after + url


@hookimpl
def ackwise_register_adapters(registry: AdapterRegistry) -> None:
    for prefix, kind in _KINDS.items():
        for scheme in _SCHEMES:
            registry.add_result_store(f"{prefix}{scheme}", f"{__name__}:{kind}_{scheme}")


def __getattr__(name: str) -> type[ResultStore]:
    kind, _, scheme = name.partition("_")
    if scheme and kind in _KINDS.values():
        return _crashing_class(kind, scheme)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def _die() -> None:
    os.kill(os.getpid(), signal.SIGKILL)


@functools.cache
def _crashing_class(kind: str, scheme: str) -> type[ResultStore]:
    base: Any = get_plugins().adapters.result_store(scheme)
    if base is None:
        raise AttributeError(f"no result store serves {scheme}:// URLs")
    prefix = next(p for p, k in _KINDS.items() if k == kind)

    class Crashing(base):  # type: ignore[misc]
        def __init__(self, url: BrokerURL, **kwargs: Any) -> None:
            super().__init__(BrokerURL.parse(url.raw.removeprefix(prefix)), **kwargs)
            self.url = url
            self._step = threading.local()  # what this thread did last: "join", "complete"

        def put(self, records: Sequence[TaskResult]) -> None:
            if kind == "CrashAfterCallback" and getattr(self._step, "last", "") == "complete":
                _die()
            super().put(records)
            if kind == "CrashAfterResult" and any(r.state == "succeeded" for r in records):
                _die()

        def join(self, chord_id: str, member: int) -> int:
            self._step.last = "join"
            return int(super().join(chord_id, member))

        def get(self, message_id: str) -> TaskResult | None:
            if getattr(self._step, "last", "") == "join":
                self._step.last = "complete"  # values are read once the chord is complete
            return super().get(message_id)  # type: ignore[no-any-return]

    Crashing.__name__ = f"{kind}_{scheme}"
    return Crashing
