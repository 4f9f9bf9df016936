"""Hook specifications.  Every hook is prefixed ``ackwise_``; see docs/hooks.md."""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING, Any

import pluggy

if TYPE_CHECKING:
    from ackwise.plugins._registries import AdapterRegistry, LockRegistry

hookspec = pluggy.HookspecMarker("ackwise")
hookimpl = pluggy.HookimplMarker("ackwise")
"""Marks a plugin's implementation of an ackwise hook (docs/hooks.md): ``@hookimpl``."""


@hookspec
def ackwise_register_adapters(registry: AdapterRegistry) -> None:
    """Register adapters: ``registry.add("scheme", "package.module:AdapterClass", ...)``.

    Registration is lazy: the adapter's module (and its driver) is imported only when a URL
    with that scheme is opened.
    """


@hookspec
def ackwise_register_lock_backends(registry: LockRegistry) -> None:
    """Register leader-lock backends for ``ackwise beat``: ``registry.add("scheme", "pkg.mod:Cls")``.

    Lazy like adapters: the class is imported when a lock URL with that scheme is opened.
    """


@hookspec
def ackwise_add_commands(subparsers: argparse._SubParsersAction[Any]) -> None:
    """Add sub-commands to the ``ackwise`` command line."""


@hookspec
def ackwise_task_started(task: str, message_id: str, attempt: int, queue: str) -> None:
    """A task body is about to run."""


@hookspec
def ackwise_task_succeeded(task: str, message_id: str, attempt: int, duration: float) -> None:
    """A task returned."""


@hookspec
def ackwise_task_failed(task: str, message_id: str, attempt: int, error: str) -> None:
    """A task raised (whether or not it will be retried)."""


@hookspec
def ackwise_task_retried(task: str, message_id: str, attempt: int, delay: float) -> None:
    """A retry of a failed task was published."""


@hookspec
def ackwise_task_dead_lettered(task: str | None, message_id: str, queue: str, reason: str) -> None:
    """A message was moved to its queue's dead-letter store."""


@hookspec
def ackwise_task_lost(task: str, message_id: str, queue: str, reason: str) -> None:
    """An early-acked task did not complete (its executor died): the message is gone."""
