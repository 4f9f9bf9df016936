"""The PostgreSQL idempotency and result stores on a database they meet for the first time."""

from __future__ import annotations

import threading

import pytest

from ackwise import open_idempotency_store, open_result_store

psycopg = pytest.importorskip("psycopg")


@pytest.fixture
def fresh_schema_url(pg_schema_url: str) -> str:
    """The caller's database: a schema of this test's own."""
    return pg_schema_url


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
