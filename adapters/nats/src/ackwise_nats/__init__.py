"""ackwise-nats: the NATS JetStream adapter for ackwise (``nats://host:port``).

Importing the package imports no driver; :mod:`ackwise_nats._adapter` holds the adapter.
"""

from __future__ import annotations

__all__: list[str] = []
