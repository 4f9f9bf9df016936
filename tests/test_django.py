"""``ackwise.contrib.django``: the app and its tasks found when Django starts, the outbox table
as a migration, ``app.transaction(connection)`` inside ``atomic()``, and ``send_on_commit``
(docs/django.md).  Django is configured once, in this process, on a schema of this module's
own in the shared PostgreSQL; the broker is SQLite."""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from ackwise import App, decode_envelope
from ackwise.errors import ConfigurationError
from ackwise.relay._loop import Relay

psycopg = pytest.importorskip("psycopg")
pytest.importorskip("django")

SUPPORT = Path(__file__).parent / "django_support"


@pytest.fixture(scope="module")
def django_app(
    tmp_path_factory: pytest.TempPathFactory, pg_module_schema: tuple[str, str]
) -> Iterator[App]:
    """Django set up with ``ackwise.contrib.django`` and a ``shop`` app; the ackwise app."""
    import django
    from django.conf import settings

    if settings.configured:
        pytest.skip("Django was configured by another test module in this process")
    url, schema = pg_module_schema
    broker = f"sqlite:///{tmp_path_factory.mktemp('django') / 'broker.db'}"
    os.environ["DJANGO_TEST_BROKER"] = broker
    os.environ["DJANGO_TEST_DATABASE"] = url
    sys.path.insert(0, str(SUPPORT))
    settings.configure(
        INSTALLED_APPS=["ackwise.contrib.django", "shop"],
        DATABASES={
            "default": {
                "ENGINE": "django.db.backends.postgresql",
                "NAME": "test",
                "USER": "postgres",
                "HOST": "127.0.0.1",
                "PORT": "5432",
                "OPTIONS": {"options": f"-c search_path={schema}"},
            },
            "lite": {"ENGINE": "django.db.backends.sqlite3", "NAME": ":memory:"},
        },
        ACKWISE_APP="django_test_app:app",
        USE_TZ=True,
    )
    django.setup()
    from django_test_app import app

    yield app
    from django.db import connections

    connections.close_all()
    app.close()
    sys.path.remove(str(SUPPORT))


def _database() -> str:
    return os.environ["DJANGO_TEST_DATABASE"]


def _outbox_table() -> str | None:
    from django.db import connection

    with connection.cursor() as cur:
        cur.execute("SELECT CAST(to_regclass('ackwise_outbox') AS text)")
        return cur.fetchone()[0]


def _drain(app: App) -> list[str]:
    """Relay the outbox, then take what is ready at the broker."""
    with psycopg.connect(_database(), autocommit=True) as conn:
        Relay(app, _database()).round(conn)
    adapter = app.adapter()
    adapter.open()
    try:
        got = adapter.receive("default", max_messages=100, wait=0.0, lease=60.0)
        adapter.ack(got)
        return sorted(decode_envelope(d.body).args[0] for d in got)
    finally:
        adapter.close()


def test_the_installed_apps_tasks_are_registered_when_django_starts(django_app: App) -> None:
    from ackwise.contrib.django import autodiscover, get_app

    assert get_app() is django_app
    assert "shop.confirm" in django_app.tasks
    assert autodiscover(django_app) == ["shop.tasks"]


def test_the_outbox_table_comes_and_goes_as_a_migration(django_app: App) -> None:
    from django.core.management import call_command

    call_command("migrate", "ackwise", verbosity=0)
    assert _outbox_table() == "ackwise_outbox"
    call_command("migrate", "ackwise", "zero", verbosity=0)
    assert _outbox_table() is None
    call_command("migrate", "ackwise", verbosity=0)
    assert _outbox_table() == "ackwise_outbox"


def test_app_transaction_on_the_django_connection_enqueues_with_the_commit_only(
    django_app: App,
) -> None:
    from django.db import connection, transaction

    confirm = django_app.tasks["shop.confirm"]
    with transaction.atomic(), django_app.transaction(connection):
        confirm.delay("committed")
    with pytest.raises(RuntimeError), transaction.atomic():
        with django_app.transaction(connection):
            confirm.delay("rolled back")
        raise RuntimeError("the order could not be saved")
    assert _drain(django_app) == ["committed"]


def test_a_django_connection_without_a_transaction_or_not_on_postgresql_is_refused(
    django_app: App,
) -> None:
    from django.db import connection, connections, transaction

    with pytest.raises(ConfigurationError, match="inside `with transaction"):
        with django_app.transaction(connection):
            pass
    with pytest.raises(ConfigurationError, match="connection to sqlite; it needs PostgreSQL"):
        with transaction.atomic(using="lite"), django_app.transaction(connections["lite"]):
            pass


def test_send_on_commit_sends_after_the_commit_and_never_on_rollback(django_app: App) -> None:
    from django.db import transaction

    from ackwise.contrib.django import send_on_commit

    confirm = django_app.tasks["shop.confirm"]
    with transaction.atomic():
        send_on_commit(confirm.s("kept"))
        adapter = django_app.adapter()
        adapter.open()
        assert adapter.stats("default").ready == 0  # not before the commit
        adapter.close()
    with pytest.raises(RuntimeError), transaction.atomic():
        send_on_commit(confirm.s("dropped"))
        raise RuntimeError("rolled back")
    assert _drain(django_app) == ["kept"]
