from django.db import models


class Order(models.Model):
    total_cents = models.PositiveIntegerField()
    receipt_sent = models.BooleanField(default=False)

    class Meta:
        db_table = "orders"
