"""Django integration: ``INSTALLED_APPS += ["ackwise.contrib.django"]`` (docs/django.md).

- ``ACKWISE_APP = "proj.ackwise_app:app"`` names the ackwise app; it is imported when Django
  starts, and each installed app's ``tasks`` module (``ACKWISE_TASK_MODULES``, default
  ``["tasks"]``) is imported so that its tasks are registered;
- the ``ackwise_outbox`` table comes as a migration (``manage.py migrate ackwise``), for
  ``with app.transaction(connection):`` inside ``transaction.atomic()``;
- :func:`send_on_commit` sends a call after the current transaction commits (Django's
  ``transaction.on_commit``): the smaller guarantee, without the outbox.
"""

from __future__ import annotations

import importlib
import importlib.util
from typing import TYPE_CHECKING, Any

from ackwise.contrib._calls import sender
from ackwise.errors import ConfigurationError

if TYPE_CHECKING:
    from ackwise.app._app import App

__all__ = ["autodiscover", "get_app", "send_on_commit", "setup"]


def send_on_commit(call: Any, *, app: App | None = None, using: str | None = None) -> None:
    """Send ``call`` (``task.s(...)``, a chain, group or chord; by name with ``app``) once the
    transaction open on the ``using`` database commits (at once outside ``atomic()``); never
    if it rolls back.

    What it loses against ``app.transaction(connection)``: a process that dies, or a broker
    that is down, between the commit and the send loses the call (the data is committed and
    nothing sends it again).  A send that fails raises from the end of the ``atomic()`` block,
    after the commit.
    """
    from django.db import transaction

    transaction.on_commit(sender(call, app), using=using)


def setup(app: App) -> None:
    """Set Django up (``DJANGO_SETTINGS_MODULE``) for a process that starts from the ackwise
    app (``ackwise worker proj.ackwise_app:app``), then register the installed apps' tasks
    with ``app``.  Call it at the end of the module that defines ``app``."""
    import django
    from django.apps import apps

    if not apps.ready and not getattr(apps, "loading", False):
        django.setup()  # imports ACKWISE_APP (this module: ``app`` is defined) and discovers
    if apps.apps_ready:
        autodiscover(app)


def autodiscover(app: App) -> list[str]:
    """Import each installed app's task modules (``ACKWISE_TASK_MODULES``); return their names."""
    from django.apps import apps
    from django.conf import settings

    names = getattr(settings, "ACKWISE_TASK_MODULES", ["tasks"])
    found = []
    for config in apps.get_app_configs():
        for name in names:
            module = f"{config.name}.{name}"
            if importlib.util.find_spec(module) is not None:
                importlib.import_module(module)
                found.append(module)
    return found


def get_app() -> App:
    """The app ``ACKWISE_APP`` names (``"module:attribute"``), imported on first use."""
    from django.conf import settings

    from ackwise.app._execution import load_app

    path = getattr(settings, "ACKWISE_APP", None)
    if not path:
        raise ConfigurationError(
            "settings.ACKWISE_APP is not set: expected the ackwise app as 'module:attribute', "
            "e.g. ACKWISE_APP = 'proj.ackwise_app:app'"
        )
    return load_app(path)
