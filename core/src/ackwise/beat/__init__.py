"""The beat wing: ``ackwise beat``, the periodic-task scheduler (docs/architecture.md)."""
