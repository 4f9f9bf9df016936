"""The Django app: ``INSTALLED_APPS += ["ackwise.contrib.django"]`` (label ``ackwise``)."""

from __future__ import annotations

from django.apps import AppConfig
from django.conf import settings


class AckwiseConfig(AppConfig):
    name = "ackwise.contrib.django"
    label = "ackwise"
    verbose_name = "ackwise"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        """Import ``ACKWISE_APP`` and register the installed apps' tasks with it."""
        if getattr(settings, "ACKWISE_APP", None):
            from ackwise.contrib.django import autodiscover, get_app

            autodiscover(get_app())
