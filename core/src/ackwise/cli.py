"""The ``ackwise`` command line as a function: ``main(["dlq", "list", ...])`` returns the status."""

from ackwise._cli import main

__all__ = ["main"]
