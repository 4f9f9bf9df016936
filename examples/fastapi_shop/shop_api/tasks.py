"""The ackwise app: ``ackwise worker shop_api.tasks:app`` (and ``ackwise relay`` beside it
when the broker is not the shop's database)."""

import os

from ackwise import App
from shop_api.db import Order, Session

app = App("shop", broker=os.environ.get("ACKWISE_BROKER_URL", "sqlite:///shop-broker.db"))


@app.task(name="orders.send_receipt")
def send_receipt(order_id: int) -> None:
    # The order is committed before this can run: it was enqueued in the same transaction.
    with Session.begin() as session:
        order = session.get(Order, order_id)
        if order is not None:
            order.receipt_sent = True
