"""ackwise-rabbitmq: the RabbitMQ adapter for ackwise (``amqp://``, ``amqps://``).

Importing this package stays light (the entry point imports :mod:`ackwise_rabbitmq.plugin`
through it): the adapter and pika are imported on first use of these names.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from ackwise_rabbitmq._adapter import (
        DELAY_TIERS,
        MAX_MESSAGE_SIZE,
        RabbitMQAdapter,
        Receipt,
    )
    from ackwise_rabbitmq._errors import ERROR_MAP, map_pika_errors, translate_pika_error
    from ackwise_rabbitmq._url import RabbitMQSettings, parse_rabbitmq_url

__all__ = [
    "DELAY_TIERS",
    "ERROR_MAP",
    "MAX_MESSAGE_SIZE",
    "RabbitMQAdapter",
    "RabbitMQSettings",
    "Receipt",
    "map_pika_errors",
    "parse_rabbitmq_url",
    "translate_pika_error",
]

#: Where each public name lives: imported from there on first use.
_WHERE = {
    name: module
    for module, names in {
        "_adapter": ("DELAY_TIERS", "MAX_MESSAGE_SIZE", "RabbitMQAdapter", "Receipt"),
        "_errors": ("ERROR_MAP", "map_pika_errors", "translate_pika_error"),
        "_url": ("RabbitMQSettings", "parse_rabbitmq_url"),
    }.items()
    for name in names
}


def __getattr__(name: str) -> Any:
    module = _WHERE.get(name)
    if module is None:
        raise AttributeError(f"module 'ackwise_rabbitmq' has no attribute {name!r}")
    import importlib

    return getattr(importlib.import_module(f"ackwise_rabbitmq.{module}"), name)
