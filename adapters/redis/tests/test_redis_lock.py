"""The Redis leader lock of ``ackwise beat``: the lock contract, plus what is Redis' own."""

from __future__ import annotations

import pytest

from ackwise import Claim, LeaderLock, open_lock
from ackwise.errors import ConfigurationError, TransientAdapterError
from ackwise_conformance.brokers import BrokerHandle
from ackwise_conformance.locks import LeaderLockConformance
from ackwise_conformance.proxy import FaultProxy
from ackwise_redis import RedisLeaderLock


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
