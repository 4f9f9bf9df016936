"""Level 1 of the conformance suite: the adapter SPI, one guarantee per test.

An adapter author subclasses :class:`AdapterConformance` and overrides one fixture::

    class TestRedisAdapter(AdapterConformance):
        @pytest.fixture
        def adapter_factory(self, redis_url):
            return lambda: ackwise.open_adapter(redis_url)

``adapter_factory`` returns a zero-argument callable that builds a **new, unopened** adapter on
the same broker each time it is called (the suite opens several: "another consumer").
Optional overrides:

``time_scale`` (fixture, default 1.0)
    multiplies every lease, delay and timeout of the suite.
``lease`` (fixture, default ``1.0 * time_scale`` seconds)
    the short lease the tests let expire.
``ordered`` (class attribute, default True)
    set False for brokers that do not keep publication order (SQS standard queues); the
    ordering test is then reported as skipped with that reason.

``queue_prefix`` (fixture, default ``"conformance-"``)
    what the name of every queue the suite declares starts with.

Each test gets a fresh queue with a unique name (``queue`` fixture); deliveries the test left
in flight are acked and every queue the test declared is deleted afterwards
(:meth:`~ackwise.Adapter.delete_queue`).

A test whose capability the adapter declares absent is skipped with ``n/a:`` and the reason;
the gate tests check that such an adapter raises :class:`~ackwise.errors.UnsupportedCapability`.

Connection-based leases (``lease_extension=CONNECTION``, RabbitMQ) do not expire while the
consumer's connection lives: for those adapters "the lease expires" is expressed as "the
consumer loses its connection" (:meth:`AdapterConformance.lose_lease`: close and reopen the
adapter), and the lease-expiry test checks that the delivery outlives its nominal lease while
the connection lives and comes back with ``attempt + 1`` once it is gone.
"""

from __future__ import annotations

from ackwise_conformance._spi_delivery import DeliveryChecks
from ackwise_conformance._spi_leases import LeaseChecks
from ackwise_conformance._spi_priorities import PriorityChecks
from ackwise_conformance._spi_receive import ReceiveChecks
from ackwise_conformance._spi_storage import StorageChecks

__all__ = ["AdapterConformance", "PriorityChecks"]


class AdapterConformance(DeliveryChecks, LeaseChecks, StorageChecks, ReceiveChecks, PriorityChecks):
    """Base class of the SPI conformance tests.  Override :meth:`adapter_factory`."""
