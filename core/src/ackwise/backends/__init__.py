"""Core's own backends, one folder each, laid out like the adapter distributions (docs/architecture.md)."""
