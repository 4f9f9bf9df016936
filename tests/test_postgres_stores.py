"""The PostgreSQL idempotency and result stores on a database they meet for the first time."""

from __future__ import annotations

import threading
import uuid
from collections.abc import Iterator

import pytest

from ackwise import open_idempotency_store, open_result_store

psycopg = pytest.importorskip("psycopg")

PG_URL = "postgresql://postgres@127.0.0.1:5432/test"


@pytest.fixture
def fresh_schema_url() -> Iterator[str]:
    """The shared server's test database, seen through a new, empty schema."""
    schema = f"stores_{uuid.uuid4().hex[:12]}"
    try:
        with psycopg.connect(PG_URL, autocommit=True, connect_timeout=3) as conn:
            conn.execute(f"CREATE SCHEMA {schema}")
    except psycopg.OperationalError as exc:
        pytest.skip(f"no PostgreSQL at {PG_URL}: {exc}")
    yield f"{PG_URL}?options=-csearch_path%3D{schema}"
    with psycopg.connect(PG_URL, autocommit=True) as conn:
        conn.execute(f"DROP SCHEMA {schema} CASCADE")


@pytest.mark.parametrize("kind", ["results", "idempotency"])
def test_workers_starting_together_create_the_tables_once(fresh_schema_url: str, kind: str) -> None:
    # Defect: eight workers started at once on a new database; one died at start with
    # "duplicate key value violates unique constraint pg_type_typname_nsp_index" (two
    # CREATE TABLE IF NOT EXISTS racing in the catalogue).
    opener = open_result_store if kind == "results" else open_idempotency_store
    errors: list[BaseException] = []
    stores: list[object] = []
    start = threading.Barrier(8)

    def open_one() -> None:
        try:
            start.wait()
            stores.append(opener(fresh_schema_url))
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=open_one) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for store in stores:
        store.close()  # type: ignore[attr-defined]
    assert not errors, errors[0]
