"""The worker wing: one process's consumer loop, what it holds, how it settles (docs/architecture.md)."""
