"""A broker fault for tests/test_outbox.py's relays (``ACKWISE_PLUGINS=outbox_faults``).

``stall-after-publish-sqlite://`` is the real SQLite broker whose ``publish`` writes
``<OUTBOX_TEST_JOURNAL>.published`` and then stalls: a relay is killed there, between its
publish and its delete.  ``slow-publish-sqlite://`` writes the same file after each publish
and then pauses 0.3 s: a relay is slow enough for its database to restart under it.
"""

from __future__ import annotations

import os
import time
from collections.abc import Sequence

from ackwise import BrokerURL, hookimpl
from ackwise.backends.sqlite._adapter import SQLiteAdapter
from ackwise.spi import AdapterRegistry, Outgoing


class _JournaledPublish(SQLiteAdapter):
    """The SQLite broker of ``<prefix>sqlite://``: each publish is noted, then paused."""

    prefix = ""
    pause = 0.0

    def __init__(self, url: BrokerURL) -> None:
        super().__init__(BrokerURL.parse(url.raw.replace(self.prefix, "", 1)))

    def publish(self, queue: str, messages: Sequence[Outgoing]) -> None:
        super().publish(queue, messages)
        with open(os.environ["OUTBOX_TEST_JOURNAL"] + ".published", "a") as marker:
            marker.write(f"{len(messages)}\n")
        time.sleep(self.pause)


class StallAfterPublish(_JournaledPublish):
    prefix = "stall-after-publish-"
    pause = 3600.0


class SlowPublish(_JournaledPublish):
    prefix = "slow-publish-"
    pause = 0.3


@hookimpl
def ackwise_register_adapters(registry: AdapterRegistry) -> None:
    registry.add("stall-after-publish-sqlite", f"{__name__}:StallAfterPublish")
    registry.add("slow-publish-sqlite", f"{__name__}:SlowPublish")
