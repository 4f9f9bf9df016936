"""Adapters whose ``ack`` forgets to remove the message: a failing conformance run on a real
broker (Redis, RabbitMQ, SQS), to prove the suite cleans up after failures too.

``forgetful-redis://…``, ``forgetful-amqp://…`` and ``forgetful-sqs://…`` are the real adapters
with one bug: ``ack`` does nothing, so every acked message comes back after its lease.  Use:
this directory on ``PYTHONPATH`` and ``ACKWISE_PLUGINS=forgetful_adapters`` (worker processes
inherit both).  The classes are built on first access, as in ``broken_adapters``.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from typing import Any

from ackwise import Adapter, BrokerURL, get_plugins, hookimpl
from ackwise.spi import AdapterRegistry, Delivery

__all__ = ["PREFIX", "ackwise_register_adapters"]

PREFIX = "forgetful-"

#: The real schemes wrapped, and the class of each wrapper in this module.
WRAPPED = {"redis": "ForgetfulRedis", "amqp": "ForgetfulAmqp", "sqs": "ForgetfulSqs"}


@hookimpl
def ackwise_register_adapters(registry: AdapterRegistry) -> None:
    for scheme, class_name in WRAPPED.items():
        registry.add(
            f"{PREFIX}{scheme}", f"{__name__}:{class_name}", distribution="ackwise-selftest"
        )


def __getattr__(name: str) -> type[Adapter]:
    try:
        return _classes()[name]
    except KeyError:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}") from None


@functools.cache
def _classes() -> dict[str, type[Adapter]]:
    return {name: _forgetful(scheme) for scheme, name in WRAPPED.items()}


def _forgetful(scheme: str) -> type[Adapter]:
    base: Any = get_plugins().adapters.get(scheme).load()

    class Forgetful(base):  # type: ignore[misc,valid-type]
        """BUG: ``ack`` removes nothing (the message is delivered again after its lease)."""

        def __init__(self, url: BrokerURL) -> None:
            super().__init__(BrokerURL.parse(url.raw.removeprefix(PREFIX)))
            self.url = url

        def ack(self, deliveries: Sequence[Delivery]) -> None:
            return None

        def ack_before_start(self, deliveries: Sequence[Delivery]) -> None:
            return None

    Forgetful.__name__ = Forgetful.__qualname__ = WRAPPED[scheme]
    return Forgetful
