"""Plugins: the hook specifications, the registries plugins fill, and the plugin manager (docs/architecture.md)."""
