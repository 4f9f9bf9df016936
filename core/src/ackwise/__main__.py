"""``python -m ackwise``: the same as the ``ackwise`` command."""

import sys

from ackwise._cli import main

sys.exit(main())
