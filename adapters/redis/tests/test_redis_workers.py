"""The Redis worker registry (docs/workers.md): one hash of the URL's prefix, which expires an
hour after its newest record and goes once every record is forgotten."""

from __future__ import annotations

import time

import redis

from ackwise import BrokerURL, WorkerInfo, open_worker_registry
from ackwise_redis._presence import FORGET_AFTER
from ackwise_redis._url import parse_redis_url


def _info(wid: str) -> WorkerInfo:
    now = time.time()
    return WorkerInfo(
        id=wid, host="h", pid=1, app="a", queues=["default"], pool="threads",
        concurrency=1, version="0", started_at=now, last_seen=now,
    )  # fmt: skip


def test_the_registry_hash_expires_after_its_newest_record_and_goes_when_emptied(
    redis_url: str,
) -> None:
    settings = parse_redis_url(BrokerURL.parse(redis_url))
    key = f"{{{settings.prefix}}}:workers"
    client = redis.Redis(host=settings.host, port=settings.port, db=settings.db)
    registry = open_worker_registry(redis_url)
    try:
        registry.beat(_info("h:1"))
        registry.beat(_info("h:2"))
        assert 0 < client.pttl(key) <= FORGET_AFTER * 1000
        registry.forget(["h:1"])
        assert client.hkeys(key) == [b"h:2"]
        registry.forget(["h:2"])
        assert not client.exists(key)  # the last record forgotten: nothing left
    finally:
        registry.close()
        client.close()


def test_a_store_namespace_is_a_longer_key_prefix_or_none_when_it_cannot_be_one() -> None:
    from ackwise_redis._presence import RedisWorkerRegistry
    from ackwise_redis._results import RedisResultStore

    url = BrokerURL.parse("redis://h:6379/0?prefix=app")
    for store in (RedisResultStore, RedisWorkerRegistry):
        assert store.namespace_options(url, "run-1-q") == {"prefix": "app:run-1-q"}
        assert store.namespace_options(url, "no spaces") == {}  # keys keep the URL's prefix
        assert store.namespace_options(url, "x" * 64) == {}  # 64 characters at most
