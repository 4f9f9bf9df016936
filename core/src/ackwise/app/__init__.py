"""The user API's implementation: the app, tasks, canvas, handles, eager mode (docs/architecture.md)."""
