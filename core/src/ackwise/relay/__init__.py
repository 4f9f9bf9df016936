"""The relay wing: ``ackwise relay``, the outbox's publisher (docs/architecture.md)."""
