"""Registers the PostgreSQL adapter: names the class by import path, imports no driver.

The idempotency and result stores and the worker registry of ``postgresql://`` URLs are core's;
they need psycopg, which this distribution brings (``ackwise[postgresql]``), so an app on this
broker keeps its results and keys in the same database by default.
"""

from __future__ import annotations

from ackwise.spi import AdapterRegistry, hookimpl

_ADAPTER = "ackwise_postgresql._adapter:PostgreSQLAdapter"


@hookimpl
def ackwise_register_adapters(registry: AdapterRegistry) -> None:
    for scheme in ("postgresql", "postgres"):
        registry.add(scheme, _ADAPTER, distribution="ackwise-postgresql")
