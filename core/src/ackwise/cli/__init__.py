"""The ``ackwise`` command line as a function: ``main(["dlq", "list", ...])`` returns the status.

This package's modules are the ``ackwise`` command's; the command itself is imported when
:func:`main` is first called, so ``ackwise.cli._startup`` stays cheap to import.
"""

from __future__ import annotations

from collections.abc import Sequence

__all__ = ["main"]


def main(argv: Sequence[str] | None = None) -> int:
    """Run the ``ackwise`` command with ``argv`` (``sys.argv[1:]`` when ``None``); its status."""
    from ackwise.cli._main import main as run

    return run(argv)
