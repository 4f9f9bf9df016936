"""The shop's tasks, found by ackwise.contrib.django when Django starts."""

from shop_site.ackwise_app import app

from orders.models import Order


@app.task(name="orders.send_receipt")
def send_receipt(order_id: int) -> None:
    # The order is committed before this can run: it was enqueued in the same transaction.
    Order.objects.filter(pk=order_id).update(receipt_sent=True)
