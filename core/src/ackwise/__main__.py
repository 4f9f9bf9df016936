"""``python -m ackwise`` and the ``ackwise`` script: the ``ackwise`` command.

It takes SIGTERM and SIGINT before it imports anything heavy (``import ackwise`` imports
none of its modules), so that a service stopped while it starts exits cleanly
(ackwise.cli._startup).
"""

import sys

from ackwise.cli import _startup


def main() -> int:
    """Run the ``ackwise`` command line, its signals taken first."""
    _startup.hold()
    from ackwise.cli._main import main as cli_main

    return cli_main()


if __name__ == "__main__":
    sys.exit(main())
