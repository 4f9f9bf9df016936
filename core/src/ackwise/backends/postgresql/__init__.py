"""Core's PostgreSQL stores and leader lock (docs/architecture.md)."""
