import json

from django.db import connection, transaction
from django.http import HttpRequest, JsonResponse
from django.views.decorators.csrf import csrf_exempt
from django.views.decorators.http import require_POST
from shop_site.ackwise_app import app

from orders.models import Order
from orders.tasks import send_receipt


@csrf_exempt
@require_POST
def create_order(request: HttpRequest) -> JsonResponse:
    total = json.loads(request.body or b"{}").get("total_cents")
    try:
        # The order and its receipt task: both committed, or neither.
        with transaction.atomic(), app.transaction(connection):
            order = Order.objects.create(total_cents=0)
            send_receipt.delay(order.pk)
            if not isinstance(total, int) or total <= 0:
                raise ValueError(f"total_cents must be a positive whole number, got {total!r}")
            order.total_cents = total
            order.save()
    except ValueError as exc:
        return JsonResponse({"error": str(exc)}, status=400)  # rolled back: no task either
    return JsonResponse({"id": order.pk}, status=201)
