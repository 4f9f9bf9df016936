"""A retry whose publish meets a broker error (docs/failure-handling.md).

A task fails and its retry is to be published, but the broker connection has just been cut
(a real TCP fault proxy between the worker and a real broker RSTs every connection and turns
new ones away for a moment).  The worker reconnects with its backoff, then publishes the
retry: it is not dropped (at most once: the message acked at its start would be lost; at
least once: it would wait for its lease, then run without the retry's delay and history) and
nothing is reported as a stale receipt.  On RabbitMQ, whose deliveries end with their
connection, the broker has the message back already when the worker reconnects: it runs
again from there, once, and the worker publishes no second copy.
"""

from __future__ import annotations

import itertools
import socket
import threading
import time
import uuid
from collections.abc import Sequence
from pathlib import Path
from typing import Any, ClassVar

import pytest

from ackwise import Ack, App, BrokerURL, Retry, Worker, WorkerConfig, decode_envelope
from ackwise.backends.sqlite._adapter import SQLiteAdapter
from ackwise.errors import BrokerUnavailable, TransientAdapterError
from ackwise.spi import Outgoing
from ackwise.testing import InProcessWorker
from ackwise.worker._events import EVENTS, BrokerError, Failed, Retried, Stale, Started
from ackwise_conformance.brokers import BrokerHandle, missing_broker
from ackwise_conformance.helpers import eventually
from ackwise_conformance.proxy import FaultProxy

#: The worker's lease: far longer than the test waits, so a retry left to the lease is seen.
LEASE = 30.0
#: The retry's own delay.
RETRY_DELAY = 1.0
#: How long the proxy turns connections away after cutting them.
CUT = 1.0
#: Messages tried at most, until the cut meets a retry's publish.
TRIALS = 5


@pytest.fixture(scope="module")
def private_rabbitmq() -> BrokerHandle:
    """The shared RabbitMQ on 5672: the test cuts its own connections through a fault proxy and
    neither restarts nor reconfigures the broker, and its queue is its own (a private node would
    cost its start, some ten seconds)."""
    try:
        socket.create_connection(("127.0.0.1", 5672), timeout=1).close()
    except OSError:
        missing_broker("RabbitMQ is not answering on 127.0.0.1:5672")
    return BrokerHandle(
        "rabbitmq",
        "amqp://guest:guest@127.0.0.1:5672/%2F",
        host="127.0.0.1",
        port=5672,
        owned=False,
        source="shared",
        not_restartable="the shared RabbitMQ is not the test's to restart",
    )


@pytest.mark.parametrize(
    ("broker", "mode"),
    [
        ("redis", Ack.EARLY),
        ("redis", Ack.LATE),
        ("redis", Ack.REJECT_ON_LOST),
        ("rabbitmq", Ack.EARLY),
        ("rabbitmq", Ack.LATE),
    ],
    ids=["redis-EARLY", "redis-LATE", "redis-REJECT_ON_LOST", "rabbitmq-EARLY", "rabbitmq-LATE"],
)
def test_a_retry_whose_publish_meets_a_broker_error_runs_after_the_reconnect(
    request: pytest.FixtureRequest, broker: str, mode: Ack
) -> None:
    handle: BrokerHandle = request.getfixturevalue(f"private_{broker}")
    queue = f"retry-{uuid.uuid4().hex[:10]}"
    # The test sends straight to the broker: the cuts are the worker's alone.
    producer = App("retries", broker=handle.url)
    with FaultProxy(str(handle.host), int(handle.port)).start() as proxy:
        app = App("retries", broker=handle.url_via("127.0.0.1", proxy.port))
        runs: dict[str, list[int]] = {}  # message id: the retries counted by each of its runs

        @app.task(name="flaky", queue=queue, ack=mode, bind=True)
        def flaky(self: Any) -> None:
            seen = runs.setdefault(self.id, [])
            seen.append(self.retries)
            if len(seen) == 1:
                proxy.reset(CUT)  # the link is cut as the task fails: the retry's publish meets it
                raise self.retry(delay=RETRY_DELAY)

        # prefetch 1: while the task runs the worker asks the broker for nothing but, at
        # times, the next message (a receive asked ahead as the task ends).  A message whose
        # cut that receive met first does not count; the next message tries again.
        worker = InProcessWorker(app, queues=[queue], lease=LEASE, prefetch=1)
        timeline: list[Any] = []
        worker.worker.events.subscribe(EVENTS, timeline.append)
        worker.start()
        try:
            for _ in range(TRIALS):
                mid = str(producer.send("flaky", queue=queue))
                eventually(
                    lambda m=mid: len(runs.get(m, ())) >= 2,
                    LEASE / 2,
                    description="the second run",
                )
                if _publish_met_the_cut(timeline, mid):
                    break
            else:
                pytest.fail(f"in {TRIALS} messages, the cut never met a retry's publish")
            time.sleep(RETRY_DELAY + 1.0)  # a second copy would run now
        finally:
            worker.stop(10)
            app.close()
            stats = producer.adapter()
            stats.open()
            try:
                left = stats.stats(queue)
            finally:
                stats.delete_queue(queue)
                stats.close()
                producer.close()

    mine = [e for e in timeline if getattr(e, "message_id", None) == mid]
    kinds = [type(e) for e in mine]
    assert Stale not in kinds, mine  # no stale receipt
    assert len(runs[mid]) == 2, runs[mid]  # once failed, once more: not lost, not twice
    assert (left.ready, left.delayed, left.in_flight, left.dead) == (0, 0, 0, 0), left
    if broker == "rabbitmq" and mode is not Ack.EARLY:
        # The connection's end gave the delivery back; RabbitMQ runs it again at once.
        assert runs[mid][1] == 0 and Retried not in kinds, mine
    else:
        # The retry itself ran: its history counts the retry.
        assert runs[mid][1] == 1, runs[mid]
        assert kinds.count(Retried) == 1 and kinds.count(Started) == 2, mine


def _publish_met_the_cut(timeline: list[Any], mid: str) -> bool:
    """Whether the worker met a broker error after message ``mid`` failed and before its
    next step (its retry published, or its next run started)."""
    failed = next(
        i for i, e in enumerate(timeline) if isinstance(e, Failed) and e.message_id == mid
    )
    rest = timeline[failed + 1 :]
    nxt = next(
        (i for i, e in enumerate(rest) if isinstance(e, Retried | Started) and e.message_id == mid),
        len(rest),
    )
    return any(isinstance(e, BrokerError) for e in rest[:nxt])


# -- a publish that keeps failing: bounded by --broker-timeout -----------------------------
class _RetriesNeverPublish(SQLiteAdapter):
    """The real SQLite broker, whose every publish of a retry (a message with an attempt
    history) fails as a broker error would, while the connection itself opens fine."""

    attempts: ClassVar[list[float]] = []

    def __init__(self, url: BrokerURL) -> None:
        super().__init__(BrokerURL.parse(url.raw.replace("nopub-", "", 1)))

    def publish(self, queue: str, messages: Sequence[Outgoing]) -> None:
        if any(decode_envelope(m.body).history for m in messages):
            type(self).attempts.append(time.monotonic())
            raise TransientAdapterError("the broker dropped the publish (injected)")
        super().publish(queue, messages)


@pytest.mark.parametrize("mode", [Ack.EARLY, Ack.LATE], ids=["EARLY", "LATE"])
def test_a_retry_whose_publish_keeps_failing_is_tried_with_backoff_until_the_broker_timeout(
    plugins_serving: Any, tmp_path: Path, mode: Ack
) -> None:
    _RetriesNeverPublish.attempts = []
    plugins = plugins_serving("nopub-sqlite", f"{__name__}:_RetriesNeverPublish")
    app = App("retries", broker=f"nopub-sqlite:///{tmp_path / 'q.db'}", plugins=plugins)

    @app.task(name="fails", ack=mode)
    def fails() -> None:
        raise Retry(delay=0.1)

    fails.delay()
    worker = Worker(app, WorkerConfig(pool="threads", lease=30.0, broker_timeout=2.0))
    outcome: list[BaseException | int] = []

    def run() -> None:
        try:
            outcome.append(worker.run())
        except BaseException as exc:
            outcome.append(exc)

    started = time.monotonic()
    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    thread.join(30)
    assert not thread.is_alive(), "the worker went on as if the retry had been published"
    [error] = outcome
    assert isinstance(error, BrokerUnavailable), error
    assert "unreachable for 2s" in str(error)
    assert 2.0 <= time.monotonic() - started < 20
    tries = _RetriesNeverPublish.attempts
    assert len(tries) >= 3, tries  # tried again after each reconnect...
    gaps = [b - a for a, b in itertools.pairwise(tries)]
    assert gaps[-1] > gaps[0], gaps  # ...with a growing backoff, not in a tight loop
    # At most once: the message went at its start, and its retry never: lost, and counted.
    # At least once: still at the broker, it comes back when its lease runs out.
    assert worker.counters.lost == (1 if mode is Ack.EARLY else 0)
    stats = app.adapter()
    stats.open()
    try:
        assert stats.stats("default").in_flight == (0 if mode is Ack.EARLY else 1)
    finally:
        stats.close()
        app.close()
