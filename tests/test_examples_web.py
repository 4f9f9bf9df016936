"""The web examples, run as their READMEs say: a Django shop (examples/django_shop) and a
FastAPI + SQLAlchemy shop (examples/fastapi_shop), each saving an order and its receipt task in
one transaction on the shared PostgreSQL (a schema of the test's own), with a SQLite broker:
the outbox, ``ackwise relay`` and ``ackwise worker`` as real processes."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from ackwise_conformance.helpers import eventually

psycopg = pytest.importorskip("psycopg")
pytest.importorskip("django")
pytest.importorskip("fastapi")
pytest.importorskip("httpx")

pytestmark = pytest.mark.slow

EXAMPLES = Path(__file__).parent.parent / "examples"

_DJANGO_REQUESTS = """
from django.test import Client
c = Client()
for body in ('{"total_cents": 1999}', '{"total_cents": -1}'):
    r = c.post("/orders/", data=body, content_type="application/json")
    print(r.status_code, r.content.decode())
"""

_FASTAPI_REQUESTS = """
from fastapi.testclient import TestClient
from shop_api.main import api
with TestClient(api) as c:
    for body in ({"total_cents": 1999}, {"total_cents": 5, "coupon": "NOPE"}):
        r = c.post("/orders", json=body)
        print(r.status_code, r.text)
"""


def _run(cmd: list[str], cwd: Path, env: dict[str, str]) -> str:
    done = subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, f"{' '.join(cmd)}:\n{done.stdout}\n{done.stderr}"
    return done.stdout


def _answers(stdout: str) -> list[tuple[int, dict[str, object]]]:
    lines = [line.split(" ", 1) for line in stdout.strip().splitlines()[-2:]]
    return [(int(code), json.loads(body)) for code, body in lines]


def _relay_and_work(
    app_path: str, cwd: Path, env: dict[str, str], database: str, order_id: int
) -> None:
    """Run a relay and a worker until the order's receipt is sent; stop them (exit 0)."""
    procs = [
        subprocess.Popen(
            [sys.executable, "-m", "ackwise", *args],
            cwd=cwd,
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
        )
        for args in (
            ["relay", app_path, "--database", database],
            ["worker", app_path, "--pool", "threads"],
        )
    ]
    try:

        def sent() -> bool:
            with psycopg.connect(database) as conn:
                row = conn.execute(
                    "SELECT receipt_sent FROM orders WHERE id = %s", (order_id,)
                ).fetchone()
                return bool(row and row[0])

        eventually(sent, 60.0, description="the receipt task to run")
    finally:
        for p in procs:
            p.send_signal(signal.SIGTERM)
        errors = [p.communicate(timeout=30)[1].decode() for p in procs]
    assert [p.returncode for p in procs] == [0, 0], errors


def _after(database: str, broker: Path) -> tuple[int, int, int]:
    """(orders, outbox rows, messages left at the broker)."""
    with psycopg.connect(database) as conn:
        orders = conn.execute("SELECT count(*) FROM orders").fetchone()[0]
        outbox = conn.execute("SELECT count(*) FROM ackwise_outbox").fetchone()[0]
    import sqlite3

    with sqlite3.connect(broker) as lite:
        left = lite.execute("SELECT count(*) FROM ackwise_messages").fetchone()[0]
    return orders, outbox, left


def test_the_django_shop_enqueues_with_its_data(tmp_path: Path, pg_schema_url: str) -> None:
    shop = tmp_path / "django_shop"
    shutil.copytree(EXAMPLES / "django_shop", shop)
    broker = tmp_path / "broker.db"
    schema = pg_schema_url.rsplit("%3D", 1)[1]
    env = {
        **os.environ,
        "PYTHONPATH": str(shop),
        "SHOP_DB_NAME": "test",
        "SHOP_DB_OPTIONS": f"-c search_path={schema}",
        "ACKWISE_BROKER_URL": f"sqlite:///{broker}",
    }
    env.pop("DJANGO_SETTINGS_MODULE", None)
    _run([sys.executable, "manage.py", "migrate", "-v", "0"], shop, env)
    out = _run([sys.executable, "manage.py", "shell", "-c", _DJANGO_REQUESTS], shop, env)
    (created, body), (refused, _) = _answers(out)
    assert (created, refused) == (201, 400), out
    _relay_and_work("shop_site.ackwise_app:app", shop, env, pg_schema_url, int(body["id"]))
    assert _after(pg_schema_url, broker) == (1, 0, 0)  # the refused order left nothing


def test_the_fastapi_shop_enqueues_with_its_data(tmp_path: Path, pg_schema_url: str) -> None:
    shop = tmp_path / "fastapi_shop"
    shutil.copytree(EXAMPLES / "fastapi_shop", shop)
    broker = tmp_path / "broker.db"
    env = {
        **os.environ,
        "PYTHONPATH": str(shop),
        "SHOP_DATABASE_URL": pg_schema_url.replace("postgresql://", "postgresql+psycopg://", 1),
        "ACKWISE_BROKER_URL": f"sqlite:///{broker}",
    }
    out = _run([sys.executable, "-c", _FASTAPI_REQUESTS], shop, env)
    (created, body), (refused, _) = _answers(out)
    assert (created, refused) == (201, 400), out
    _relay_and_work("shop_api.tasks:app", shop, env, pg_schema_url, int(body["id"]))
    assert _after(pg_schema_url, broker) == (1, 0, 0)
