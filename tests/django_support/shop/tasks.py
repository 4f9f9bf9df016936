"""Found by ackwise.contrib.django's autodiscovery (an installed app's ``tasks`` module)."""

from django_test_app import app


@app.task(name="shop.confirm")
def confirm(order: str) -> str:
    return order
