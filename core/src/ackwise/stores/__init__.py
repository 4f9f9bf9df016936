"""The store interfaces: results, leader locks, idempotency keys, worker presence, rate limits (docs/architecture.md)."""
