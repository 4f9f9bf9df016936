"""The ``ackwise_outbox`` table (docs/outbox.md), on PostgreSQL databases only: elsewhere
``app.transaction()`` refuses the connection, so there is nothing to create."""

from __future__ import annotations

from typing import Any

from django.db import migrations

from ackwise.app import _outbox


def create(apps: Any, schema_editor: Any) -> None:
    if schema_editor.connection.vendor == "postgresql":
        for statement in _outbox.SCHEMA:
            schema_editor.execute(statement)


def drop(apps: Any, schema_editor: Any) -> None:
    if schema_editor.connection.vendor == "postgresql":
        schema_editor.execute("DROP TABLE IF EXISTS ackwise_outbox")


class Migration(migrations.Migration):
    initial = True
    dependencies: list[tuple[str, str]] = []
    operations = [migrations.RunPython(create, drop)]
