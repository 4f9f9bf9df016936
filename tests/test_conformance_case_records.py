"""A conformance case's records in the broker's own stores: its workers' registry records and
its messages' result records are named like its queue where the store has namespaces (Redis'
key prefix), and are deleted when the case closes, as its queues are (docs/conformance.md)."""

from __future__ import annotations

import socket
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from ackwise import Ack, open_result_store, open_worker_registry
from ackwise_conformance.broker_views import own_store, with_option_values
from ackwise_conformance.harness import Harness, SimpleBroker
from ackwise_conformance.helpers import eventually

pytestmark = pytest.mark.slow


@pytest.fixture(params=["memory", "sqlite", "redis", "postgresql"])
def broker_url(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    if request.param == "memory":
        yield f"memory://{uuid.uuid4().hex}"
    elif request.param == "sqlite":
        yield f"sqlite:///{tmp_path / 'broker.db'}"
    elif request.param == "redis":
        yield request.getfixturevalue("private_redis").url
    else:
        yield request.getfixturevalue("pg_schema_url")


def _redis_keys(url: str) -> set[str]:
    import redis

    client = redis.Redis.from_url(url.split("?")[0])
    try:
        return {k.decode() for k in client.scan_iter(count=1000)}
    finally:
        client.close()


def test_a_cases_worker_and_result_records_are_deleted_when_it_closes(
    broker_url: str, tmp_path: Path
) -> None:
    is_redis = broker_url.startswith("redis")
    before = _redis_keys(broker_url) if is_redis else set()
    prefix = f"records-{uuid.uuid4().hex[:6]}-"
    broker = own_store(SimpleBroker(broker_url), tmp_path / "store")
    h = Harness(broker, Ack.LATE, tmp_path / "case", prefix=prefix)
    assert h.worker_registry_url is not None  # each of these brokers has a registry
    registry = open_worker_registry(h.worker_registry_url)
    results = open_result_store(h.result_store_url)
    try:
        try:
            worker = h.worker(pool="threads", results=h.result_store_url)
            [mid] = h.publish(["a"])
            h.wait_for("end", key="a")
            wid = (
                worker.in_process.worker.worker_id
                if worker.in_process
                else f"{socket.gethostname()}:{worker.pid}"
            )
            eventually(
                lambda: wid in {w.id for w in registry.workers()}, 30, description="its record"
            )
            eventually(lambda: results.get(mid), 30, description="the result record")
            if is_redis:
                made = _redis_keys(broker_url) - before
                assert f"{{ackwise:{h.queue}}}:workers" in made
                assert f"{{ackwise:{h.queue}:result:{mid}}}" in made
                assert not [k for k in made if prefix not in k and k != "{ackwise}:queues"], made
        finally:
            h.close()
        assert wid not in {w.id for w in registry.workers()}
        assert results.get(mid) is None
        if is_redis:
            assert _redis_keys(broker_url) - before == set()
    finally:
        registry.close()
        results.close()


def test_a_store_url_option_is_replaced_or_added_and_the_others_kept() -> None:
    url = "redis://:pw@h:6379/0?prefix=app&socket_timeout=5"
    assert with_option_values(url, prefix="app:q") == (
        "redis://:pw@h:6379/0?socket_timeout=5&prefix=app:q"
    )
    assert with_option_values("redis://h/0", prefix="p") == "redis://h/0?prefix=p"
    options: dict[str, Any] = {}
    assert with_option_values(url, **options) == url
