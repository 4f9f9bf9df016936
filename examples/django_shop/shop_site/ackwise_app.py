"""The ackwise app of the shop: ``ackwise worker shop_site.ackwise_app:app``.

Run from this directory, the worker and the relay start Django here (``setup``), so the
tasks can use the ORM.
"""

import os

from ackwise import App
from ackwise.contrib.django import setup

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "shop_site.settings")

# Any broker: with one that is not this database, `ackwise relay` publishes the outbox.
app = App("shop", broker=os.environ.get("ACKWISE_BROKER_URL", "sqlite:///shop-broker.db"))

setup(app)  # Django first, then each installed app's tasks module
