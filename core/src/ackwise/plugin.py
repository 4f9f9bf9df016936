"""The built-in backends' plugin, under the entry point ``ackwise`` of the group ``ackwise``
(the registrations are :mod:`ackwise.plugins._builtin`'s; the plugin manager registers that
module itself, so the entry point is only what a listing of plugins shows)."""

from __future__ import annotations

from ackwise.plugins._builtin import ackwise_register_adapters, ackwise_register_lock_backends

__all__ = ["ackwise_register_adapters", "ackwise_register_lock_backends"]
