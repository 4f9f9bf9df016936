"""Level 2 of the conformance suite (crash scenarios C01-C28) on a Redis Cluster URL and on a
Sentinel URL: the tests' own deployments (``redis_topologies``: 3 primaries with a replica
each; a master with a replica watched by 3 sentinels), every applicable scenario in all three
modes.

The connection-cut scenarios are n/a on both: the client connects to every primary of the
cluster, and to the master the sentinels name, so a proxy in front of the URL's one address
would cut only part of its connections.  A broker restart (C19) is n/a too: the suite does not
own these deployments; what a primary's loss does is ``test_redis_failover.py``'s.
"""

from __future__ import annotations

import uuid

import pytest
from redis_topologies import LocalCluster, LocalSentinels

from ackwise_conformance.broker_views import SimpleBroker
from ackwise_conformance.crash import CrashConformance

pytestmark = pytest.mark.slow


def _prefix() -> str:
    return f"prefix=c-{uuid.uuid4().hex[:10]}"


class TestRedisClusterCrashConformance(CrashConformance):
    @pytest.fixture
    def broker(self, redis_cluster: LocalCluster) -> SimpleBroker:
        return SimpleBroker(redis_cluster.url(_prefix()), name="redis-cluster", proxied=False)


class TestRedisSentinelCrashConformance(CrashConformance):
    @pytest.fixture
    def broker(self, redis_sentinels: LocalSentinels) -> SimpleBroker:
        return SimpleBroker(redis_sentinels.url(_prefix()), name="redis-sentinel", proxied=False)
