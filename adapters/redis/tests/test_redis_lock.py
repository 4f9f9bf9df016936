"""The Redis leader lock of ``ackwise beat``: the lock contract, plus what is Redis' own."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import redis

from ackwise import Claim, LeaderLock, open_lock
from ackwise.errors import ConfigurationError, TransientAdapterError
from ackwise_conformance.brokers import BrokerHandle
from ackwise_conformance.locks import LeaderLockConformance
from ackwise_conformance.proxy import FaultProxy
from ackwise_redis import RedisLeaderLock
from ackwise_redis._lock import KEEP_FIRES


class TestRedisLeaderLock(LeaderLockConformance):
    @pytest.fixture
    def lock_url(self, redis_url: str) -> str:
        return redis_url


def test_redis_urls_open_the_redis_lock(redis_url: str) -> None:
    lock = open_lock(redis_url)
    assert isinstance(lock, RedisLeaderLock)


def test_lock_names_with_braces_are_refused(redis_url: str) -> None:
    lock = open_lock(redis_url)
    with pytest.raises(ConfigurationError, match="braces"):
        lock.acquire("a{b}", "t", 30, "o")


def test_scripts_are_loaded_again_after_a_script_flush(redis_url: str) -> None:
    lock = open_lock(redis_url)
    lock.open()
    assert lock.acquire("flushed", "t1", 30, "a") is not None
    raw = lock._link.connection()  # type: ignore[attr-defined]
    raw.send_command("SCRIPT", "FLUSH")
    raw.read_response()
    assert lock.claim("flushed", "t1", "s", 1) is Claim.CLAIMED
    lock.close()


def test_a_cut_connection_fails_within_the_lock_timeout_and_recovers(
    redis_broker: BrokerHandle, redis_url: str
) -> None:
    # The beat sets timeout = ttl / 3: a leader cut off from Redis must learn it that fast,
    # and must not read a late reply as the answer to its next command.
    assert redis_broker.host is not None and redis_broker.port is not None
    with FaultProxy(redis_broker.host, redis_broker.port).start() as proxy:
        url = redis_broker.url_via("127.0.0.1", proxy.port)
        sep = "&" if "?" in url else "?"
        prefix = redis_url.rpartition("prefix=")[2]
        lock: LeaderLock = open_lock(f"{url}{sep}prefix={prefix}")
        lock.timeout = 0.3
        lock.open()
        assert lock.acquire("cut", "t1", 30, "a") is not None
        proxy.blackhole(1.0)
        with pytest.raises(TransientAdapterError):
            lock.renew("cut", "t1", 30)
        proxy.heal()
        assert lock.renew("cut", "t1", 30) is True
        info = lock.info("cut")
        assert info is not None and info.owner == "a"
        lock.close()


@pytest.fixture
def raw(redis_url: str) -> Iterator[redis.Redis]:
    with redis.Redis.from_url(redis_url.split("?")[0]) as client:
        yield client


@pytest.fixture
def lock(redis_url: str) -> Iterator[RedisLeaderLock]:
    lock = open_lock(redis_url)
    assert isinstance(lock, RedisLeaderLock)
    lock.timeout = 5.0
    lock.open()
    yield lock
    lock.close()


def test_claims_recorded_before_fences_were_kept_have_an_unknown_claimer_and_keep_working(
    lock: RedisLeaderLock, raw: redis.Redis
) -> None:
    # The keys as the previous version left them: the lock's counter, a full sorted set of
    # claimed fires and the schedules set; no fences:<schedule> hash.
    base = f"{{{lock.settings.prefix}:beat:legacy}}"
    raw.set(f"{base}:fence", 1)
    raw.zadd(f"{base}:fires:tick", {str(t): t for t in range(1, KEEP_FIRES + 1)})
    raw.sadd(f"{base}:schedules", "tick")
    assert lock.claimed_by("legacy", "tick", KEEP_FIRES) is None  # recorded, by whom unknown
    assert lock.last_fires("legacy") == {"tick": KEEP_FIRES}
    assert lock.acquire("legacy", "new", 30, "b") == 2
    assert lock.claim("legacy", "new", "tick", KEEP_FIRES) is Claim.TAKEN
    assert lock.claim("legacy", "new", "tick", KEEP_FIRES + 1) is Claim.CLAIMED
    assert lock.claimed_by("legacy", "tick", KEEP_FIRES + 1) == 2
    assert lock.claimed_by("legacy", "tick", KEEP_FIRES) is None
    assert raw.zcard(f"{base}:fires:tick") == KEEP_FIRES  # pruned as before
    lock.delete("legacy")
    assert list(raw.scan_iter(match=f"{base}*")) == []


def test_the_claimers_of_pruned_fires_are_dropped_with_them(
    lock: RedisLeaderLock, raw: redis.Redis
) -> None:
    base = f"{{{lock.settings.prefix}:beat:bounded}}"
    fence = lock.acquire("bounded", "t1", 30, "a")
    for t in range(1, 201):
        assert lock.claim("bounded", "t1", "tick", t) is Claim.CLAIMED
    fires, fences = f"{base}:fires:tick", f"{base}:fences:tick"
    assert raw.hlen(fences) == raw.zcard(fires) == KEEP_FIRES
    assert {int(k) for k in raw.hkeys(fences)} == set(range(201 - KEEP_FIRES, 201))
    # A version that kept no fences pruned a fire and left its field (a rolling upgrade):
    # the next claim drops it, so a field never outlives its fire.
    raw.zrem(fires, "150")
    assert lock.claimed_by("bounded", "tick", 150) is None
    assert lock.claim("bounded", "t1", "tick", 201) is Claim.CLAIMED
    assert raw.hlen(fences) == raw.zcard(fires) == KEEP_FIRES
    assert not raw.hexists(fences, "150") and lock.claimed_by("bounded", "tick", 201) == fence
    lock.delete("bounded")
    assert list(raw.scan_iter(match=f"{base}*")) == []
