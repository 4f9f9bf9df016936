"""A result store that dies after it writes a success: C25's "killed after the store write,
before the ack", at that exact point.

``crash-after-result-<scheme>://…`` is the real result store of ``<scheme>://…`` (SQLite,
Redis, memory…) whose ``put`` SIGKILLs its own process once it has stored a ``succeeded``
record: the record is in the store, the worker never sends the ack.  Worker processes get it
with ``ACKWISE_PLUGINS=ackwise_conformance.result_faults``.  The store is the fault; the
broker and its adapter are the real ones under test.
"""

from __future__ import annotations

import functools
import os
import signal
from collections.abc import Sequence
from typing import Any

from ackwise import AdapterRegistry, BrokerURL, ResultStore, TaskResult, get_plugins, hookimpl

__all__ = ["PREFIX", "ackwise_register_adapters", "crashing"]

PREFIX = "crash-after-result-"


def crashing(url: str) -> str:
    """The URL of the store of ``url`` that dies after writing a success."""
    return PREFIX + url


@hookimpl
def ackwise_register_adapters(registry: AdapterRegistry) -> None:
    for scheme in ("sqlite", "memory", "redis", "rediss", "unix", "postgresql", "postgres"):
        registry.add_result_store(f"{PREFIX}{scheme}", f"{__name__}:{_class_name(scheme)}")


def _class_name(scheme: str) -> str:
    return f"CrashAfterResult_{scheme}"


def __getattr__(name: str) -> type[ResultStore]:
    if name.startswith("CrashAfterResult_"):
        return _crashing_class(name.removeprefix("CrashAfterResult_"))
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


@functools.cache
def _crashing_class(scheme: str) -> type[ResultStore]:
    base: Any = get_plugins().adapters.result_store(scheme)
    if base is None:
        raise AttributeError(f"no result store serves {scheme}:// URLs")

    class CrashAfterResult(base):  # type: ignore[misc]
        def __init__(self, url: BrokerURL, **kwargs: Any) -> None:
            super().__init__(BrokerURL.parse(url.raw.removeprefix(PREFIX)), **kwargs)
            self.url = url

        def put(self, records: Sequence[TaskResult]) -> None:
            super().put(records)
            if any(r.state == "succeeded" for r in records):
                os.kill(os.getpid(), signal.SIGKILL)

    CrashAfterResult.__name__ = _class_name(scheme)
    return CrashAfterResult
