"""Guarantees pinned on the SQS adapter itself (beyond the shared conformance suite)."""

from __future__ import annotations

import json
import logging
import os
import signal
import threading
import time
import uuid
from collections.abc import Iterator
from typing import Any

import pytest

from ackwise import Adapter, App, open_adapter
from ackwise.errors import MessageTooLarge, PublishError, StaleReceipt
from ackwise.spi import Outgoing, QueueSpec
from ackwise.testing import run_worker
from ackwise_conformance.brokers import BrokerHandle
from ackwise_conformance.helpers import eventually
from ackwise_sqs import SQSAdapter, VisibilityCapReached, sqs_queue_name


def with_options(url: str, **options: object) -> str:
    sep = "&" if "?" in url else "?"
    return url + sep + "&".join(f"{k}={v}" for k, v in options.items())


# -- helpers -------------------------------------------------------------------------------


@pytest.fixture
def adapter(sqs_url: str) -> Iterator[SQSAdapter]:
    a = open_adapter(sqs_url)
    assert isinstance(a, SQSAdapter)
    a.open()
    yield a
    a.close()


@pytest.fixture
def queue(adapter: Adapter) -> str:
    name = f"pinned-{uuid.uuid4().hex[:12]}"
    adapter.declare(QueueSpec(name, max_deliveries=3))
    return name


def _raw(adapter: SQSAdapter) -> Any:
    """The adapter's boto3 client (white-box checks)."""
    adapter.open()
    return adapter._client.boto


def _queue_url(adapter: SQSAdapter, queue: str) -> str:
    return adapter._topology.queue(queue).url


def _take_n(
    adapter: Adapter, queue: str, n: int, lease: float = 30.0, timeout: float = 15.0
) -> list[Any]:
    got: list[Any] = []

    def more() -> bool:
        got.extend(adapter.receive(queue, max_messages=n - len(got), wait=1.0, lease=lease))
        return len(got) >= n

    eventually(more, timeout, description=f"{n} deliveries from {queue}")
    return got


def _take(adapter: Adapter, queue: str, lease: float, timeout: float = 15.0) -> Any:
    return _take_n(adapter, queue, 1, lease, timeout)[0]


# -- long delays: DelaySeconds, then visibility ----------------------------------------------


def test_countdown_of_forty_minutes_scaled_runs_once_not_early_with_attempt_one(
    sqs_broker: BrokerHandle,
) -> None:
    """A 40-minute countdown takes the long-delay path (beyond 900 s) and runs once.

    Scaled by 1/600: the countdown is 4 s and the DelaySeconds threshold 1.5 s (900 s scaled),
    so the message is sent with DelaySeconds, received early once, re-armed by visibility
    without running, and then delivered with attempt 1 (the early receive is not counted).
    """
    scale = 1 / 600
    countdown = 40 * 60 * scale
    url = with_options(
        sqs_broker.url, prefix=f"t{uuid.uuid4().hex[:10]}-", max_native_delay=900 * scale
    )
    app = App("sqs-countdown", broker=url)
    queue = f"countdown-{uuid.uuid4().hex[:8]}"
    starts: list[float] = []

    @app.task(queue=queue)
    def tick() -> None:
        starts.append(time.time())

    try:
        with run_worker(app, queues=[queue], lease=2.0) as worker:
            sent = time.time()
            tick.apply_async(countdown=countdown)
            eventually(lambda: starts, countdown + 15.0, description="the delayed task to run")
            report = worker.join(15.0)
            time.sleep(3.0)  # two leases: a duplicate would show up now
            report = worker.join(15.0)
            adapter = worker.worker.adapter
            assert isinstance(adapter, SQSAdapter)
            rearmed = adapter.rearmed
        assert len(starts) == 1, f"ran {len(starts)} times"
        assert starts[0] >= sent + countdown - 0.05, (
            f"ran {sent + countdown - starts[0]:.3f}s early"
        )
        assert rearmed >= 1, "the long-delay path (early receive, visibility re-arm) was not taken"
        assert [e.attempt for e in report.started] == [1], "the early receive counted as a delivery"
        assert len(report.succeeded) == 1
    finally:
        app.close()


def test_delay_beyond_the_threshold_is_invisible_and_rearmed_without_a_delivery(
    sqs_broker: BrokerHandle,
) -> None:
    url = with_options(sqs_broker.url, prefix=f"t{uuid.uuid4().hex[:10]}-", max_native_delay=1)
    a = open_adapter(url)
    assert isinstance(a, SQSAdapter)
    a.open()
    try:
        q = f"long-{uuid.uuid4().hex[:8]}"
        a.declare(QueueSpec(q))
        sent = time.time()
        a.publish(q, [Outgoing("later", b"x", delay=4.0)])
        seen: list[Any] = []
        while not seen and time.time() < sent + 20:
            seen.extend(a.receive(q, max_messages=10, wait=1.0, lease=5.0))
        assert seen, "never delivered"
        assert time.time() >= sent + 4.0 - 0.05, "delivered before due"
        (d,) = seen
        assert d.lease_deadline - 5.0 >= sent + 4.0 - 1.0
        assert a.rearmed == 1
        assert d.attempt == 1
        a.ack([d])
    finally:
        a.close()


# -- leases --------------------------------------------------------------------------------


def test_task_four_times_the_visibility_timeout_never_runs_twice(sqs_url: str) -> None:
    lease = 2.0
    app = App("sqs-long", broker=sqs_url)
    queue = f"long-{uuid.uuid4().hex[:8]}"
    runs: list[float] = []

    @app.task(queue=queue)
    def long_task() -> None:
        runs.append(time.time())
        time.sleep(4 * lease)

    spy = open_adapter(sqs_url)
    spy.open()
    try:
        with run_worker(app, queues=[queue], lease=lease) as worker:
            long_task.delay()
            eventually(lambda: runs, 15.0, description="the task to start")
            end = runs[0] + 4 * lease + lease
            while time.time() < end:  # another consumer must never see it meanwhile
                got = spy.receive(queue, max_messages=10, wait=1.0, lease=30.0)
                assert not got, f"redelivered while running: {[d.attempt for d in got]}"
            report = worker.join(15.0)
            adapter = worker.worker.adapter
            assert isinstance(adapter, SQSAdapter)
            renewals = adapter.calls.get("ChangeMessageVisibilityBatch", 0)
        assert len(runs) == 1
        assert len(report.succeeded) == 1 and not report.of("stale")
        assert renewals >= 4, f"expected the lease renewed every lease/3, saw {renewals} calls"
    finally:
        spy.close()
        app.close()


def test_renewal_past_the_twelve_hour_cap_is_a_reported_error(
    adapter: SQSAdapter, queue: str
) -> None:
    adapter.publish(queue, [Outgoing("m", b"x")])
    d = _take(adapter, queue, lease=10.0)
    d.receipt.received_at = time.time() - 43200 + 3  # as if received 12 hours ago, less 3 s
    with pytest.raises(VisibilityCapReached) as info:
        adapter.extend([d], lease=10.0)
    assert isinstance(info.value, StaleReceipt)
    assert info.value.deliveries == (d,)
    assert "12 hours" in str(info.value) and "m" in str(info.value)


# -- dead letters --------------------------------------------------------------------------


def test_poison_message_is_dead_lettered_after_exactly_max_deliveries(
    adapter: SQSAdapter, queue: str
) -> None:
    """A message never settled comes back until its (max_deliveries + 1)-th delivery.

    The worker dead-letters it then (reason ``max_deliveries``), so it ran exactly
    ``max_deliveries`` (3) times.
    """
    adapter.publish(queue, [Outgoing("poison", b"x")])
    attempts = []
    while True:
        d = _take(adapter, queue, lease=2.0)
        attempts.append(d.attempt)
        if d.attempt > 3:  # what the worker does
            adapter.dead_letter(d, reason="max_deliveries")
            break
        # crash: never settled; the lease brings it back
    assert attempts == [1, 2, 3, 4]
    (dead,) = adapter.dead_letters(queue)
    assert (dead.message_id, dead.reason, dead.attempt) == ("poison", "max_deliveries", 4)
    st = adapter.stats(queue)
    assert (st.ready, st.in_flight, st.dead) == (0, 0, 1)


def test_redrive_policy_moves_a_message_nobody_settles_after_max_deliveries_plus_one(
    adapter: SQSAdapter, queue: str
) -> None:
    """The backstop: without a worker to dead-letter it, SQS's redrive policy does."""
    client = _raw(adapter)
    url = _queue_url(adapter, queue)
    attrs = client.get_queue_attributes(QueueUrl=url, AttributeNames=["RedrivePolicy"])
    assert int(json.loads(attrs["Attributes"]["RedrivePolicy"])["maxReceiveCount"]) == 4
    adapter.publish(queue, [Outgoing("poison", b"x")])
    for attempt in range(1, 5):
        d = _take(adapter, queue, lease=1.0)
        assert d.attempt == attempt
    eventually(
        lambda: (
            adapter.receive(queue, max_messages=1, wait=1.0, lease=1.0) == []
            and adapter.stats(queue).dead == 1
        ),
        15.0,
        description="the redrive policy to move the message",
    )
    (dead,) = adapter.dead_letters(queue)
    assert (dead.message_id, dead.reason) == ("poison", "max_deliveries")


# -- shutdown ------------------------------------------------------------------------------


def test_shutdown_makes_prefetched_messages_visible_at_once(sqs_url: str) -> None:
    app = App("sqs-shutdown", broker=sqs_url)
    queue = f"stop-{uuid.uuid4().hex[:8]}"
    gate = threading.Event()
    started = threading.Event()

    @app.task(queue=queue)
    def work(n: int) -> None:
        if n == 0:
            started.set()
            gate.wait(30)

    spy = open_adapter(sqs_url)
    spy.open()
    try:
        work.delay(0)
        for i in range(1, 10):
            work.delay(i)
        worker = run_worker(app, queues=[queue], lease=30.0, prefetch=10)
        with worker as w:
            assert started.wait(15)
            eventually(lambda: spy.stats(queue).in_flight == 10, 15.0, description="10 held")
            w.worker.request_stop()
            stopped = time.monotonic()
            # Visibility 0 at once, not the 30 s lease.
            eventually(lambda: spy.stats(queue).ready == 9, 3.0, description="9 returned")
            assert time.monotonic() - stopped < 3.0
            got = spy.receive(queue, max_messages=10, wait=1.0, lease=30.0)
            assert len(got) == 9 and all(d.attempt == 2 for d in got)
            spy.ack(got)
            gate.set()
    finally:
        gate.set()
        spy.close()
        app.close()


# -- stale receipts and the known emulator deviation ----------------------------------------


def test_stale_receipt_handle_delete_is_a_known_moto_deviation(
    adapter: SQSAdapter, queue: str, on_moto: bool
) -> None:
    """SQS documents that DeleteMessage with an old receipt handle may succeed without deleting.

    moto deletes the message.  The adapter never sends a receipt it knows to be stale (it
    fences by its own lease deadline, see test_sqs_spi's stale-receipt tests), so this
    difference matters only for a receipt that goes stale while its request is in flight.
    On moto this test is reported as an expected failure (a known emulator deviation), never
    as a pass; against a real SQS it checks the documented behaviour.
    """
    client = _raw(adapter)
    url = _queue_url(adapter, queue)
    client.send_message(QueueUrl=url, MessageBody="m")
    old = client.receive_message(QueueUrl=url, VisibilityTimeout=1, WaitTimeSeconds=1)
    old_handle = old["Messages"][0]["ReceiptHandle"]
    new: dict[str, Any] = {}

    def again() -> bool:
        new.update(client.receive_message(QueueUrl=url, VisibilityTimeout=30, WaitTimeSeconds=1))
        return bool(new.get("Messages"))

    eventually(again, 15.0, description="the redelivery")
    client.delete_message(QueueUrl=url, ReceiptHandle=old_handle)
    left = client.get_queue_attributes(
        QueueUrl=url, AttributeNames=["ApproximateNumberOfMessagesNotVisible"]
    )["Attributes"]["ApproximateNumberOfMessagesNotVisible"]
    if on_moto:
        if left == "0":
            pytest.xfail(
                "known emulator deviation (moto 5.2): DeleteMessage with a stale receipt handle "
                "deletes the message; SQS's documentation says the call succeeds without "
                "deleting it"
            )
        pytest.fail("moto no longer deletes on a stale receipt handle: drop the deviation note")
    assert left == "1", "the stale DeleteMessage removed the newer delivery"


def test_ack_just_before_the_deadline_is_fenced_as_stale(adapter: SQSAdapter, queue: str) -> None:
    adapter.publish(queue, [Outgoing("m", b"x")])
    d = _take(adapter, queue, lease=1.0)
    time.sleep(max(0.0, d.lease_deadline - time.time() - 0.1))
    with pytest.raises(StaleReceipt):
        adapter.ack([d])  # could reach SQS after the lease: refused without a request


# -- stats, purge, sizes, names, FIFO ------------------------------------------------------


def test_stats_count_ready_delayed_in_flight_and_dead(adapter: SQSAdapter, queue: str) -> None:
    adapter.publish(queue, [Outgoing(f"r{i}", b"x") for i in range(3)])
    taken = _take(adapter, queue, lease=30.0)
    adapter.publish(queue, [Outgoing("d", b"x", delay=60.0)])
    adapter.publish_dead(queue, [Outgoing("x", b"x")], reason="failed")
    st = adapter.stats(queue)
    assert (st.ready, st.delayed, st.in_flight, st.dead, st.oldest_age) == (2, 1, 1, 1, 0.0)
    adapter.ack([taken])


def test_purge_deletes_ready_and_leaves_in_flight(adapter: SQSAdapter, queue: str) -> None:
    adapter.publish(queue, [Outgoing(f"r{i}", b"x") for i in range(3)])
    taken = _take(adapter, queue, lease=30.0)
    assert adapter.purge(queue) == 2
    st = adapter.stats(queue)
    assert (st.ready, st.in_flight) == (0, 1)
    adapter.ack([taken])


def test_size_limit_is_read_from_the_queue(adapter: SQSAdapter, sqs_url: str) -> None:
    q = f"small-{uuid.uuid4().hex[:8]}"
    adapter.declare(QueueSpec(q))
    _raw(adapter).set_queue_attributes(
        QueueUrl=_queue_url(adapter, q), Attributes={"MaximumMessageSize": "1024"}
    )
    fresh = open_adapter(sqs_url)
    fresh.open()
    try:
        fresh.publish(q, [Outgoing("ok", b"x" * 900)])
        with pytest.raises(MessageTooLarge, match="1024"):
            fresh.publish(q, [Outgoing("big", b"x" * 1100)])
        assert fresh.stats(q).ready == 1  # nothing of the refused batch was sent
    finally:
        fresh.close()


def test_binary_bodies_round_trip_base64_and_text_bodies_are_sent_as_they_are(
    adapter: SQSAdapter, queue: str
) -> None:
    bodies = {"bin": b"\x00\xff\xfe binary", "text": '{"json": "ünïcode ✓"}'.encode()}
    adapter.publish(queue, [Outgoing(k, v) for k, v in bodies.items()])
    client = _raw(adapter)
    raw = client.receive_message(
        QueueUrl=_queue_url(adapter, queue),
        MaxNumberOfMessages=10,
        VisibilityTimeout=0,
        MessageAttributeNames=["All"],
    )["Messages"]
    by_id = {m["MessageAttributes"]["ackwise-id"]["StringValue"]: m for m in raw}
    assert by_id["text"]["Body"] == bodies["text"].decode()
    assert "ackwise-enc" in by_id["bin"]["MessageAttributes"]
    got = {d.message_id: d.body for d in adapter.receive(queue, max_messages=10, wait=1, lease=5)}
    assert got == bodies


def test_invalid_queue_names_are_refused_before_any_request(adapter: SQSAdapter) -> None:
    calls = dict(adapter.calls)
    for bad in ("has:colon", "dot.inside", "x" * 80, "space here"):
        with pytest.raises(PublishError, match="invalid queue name"):
            adapter.publish(bad, [Outgoing("m", b"x")])
    assert adapter.calls == calls
    assert sqs_queue_name("p-", "jobs") == ("p-jobs", "p-jobs-dlq")
    assert sqs_queue_name("", "jobs.fifo") == ("jobs.fifo", "jobs-dlq.fifo")


def test_batch_receive_fills_max_messages_with_several_calls(
    adapter: SQSAdapter, queue: str
) -> None:
    adapter.publish(queue, [Outgoing(f"m{i}", b"x") for i in range(25)])
    before = adapter.calls.get("ReceiveMessage", 0)
    got = adapter.receive(queue, max_messages=25, wait=1.0, lease=30.0)
    assert len(got) == 25
    assert adapter.calls["ReceiveMessage"] - before == 3
    before = adapter.calls.get("DeleteMessageBatch", 0)
    adapter.ack(got)
    assert adapter.calls["DeleteMessageBatch"] - before == 3


def test_fifo_queue_dedups_by_idempotency_key_and_keeps_group_order(sqs_url: str) -> None:
    app = App("sqs-fifo", broker=sqs_url)
    queue = f"orders-{uuid.uuid4().hex[:8]}.fifo"

    @app.task(queue=queue)
    def place(n: int) -> None:
        pass

    adapter = open_adapter(sqs_url)
    adapter.open()
    try:
        adapter.declare(QueueSpec(queue))
        place.apply_async((1,), headers={"idempotency_key": "order-1"})
        place.apply_async((1,), headers={"idempotency_key": "order-1"})  # deduplicated
        for n in range(2, 6):
            place.apply_async((n,), headers={"message_group_id": "g1"})
        got: list[Any] = []
        deadline = time.time() + 15
        while len(got) < 5 and time.time() < deadline:
            batch = adapter.receive(queue, max_messages=10, wait=1.0, lease=30.0)
            got.extend(batch)
            adapter.ack(batch)
        from ackwise import decode_envelope

        args = [decode_envelope(d.body).args[0] for d in got]
        assert sorted(args) == [1, 2, 3, 4, 5], args
        assert [a for a in args if a != 1] == [2, 3, 4, 5], "order within group g1"
    finally:
        adapter.close()
        app.close()


# -- requests per message, late acks in the background --------------------------------------


def test_draining_a_busy_queue_takes_about_one_request_per_five_messages(sqs_url: str) -> None:
    """Receives and late acks go 10 per request, even at concurrency 1, given a budget that
    holds whole requests (here a fixed prefetch of 40).

    The automatic prefetch gets there by itself only while tasks are short enough on this
    host (it holds about 10 ms of work: under a loaded run, no-op tasks took long enough to
    keep it near 11, and receives carried ~7): its sizing is tested on RabbitMQ
    (test_automatic_prefetch_deepens_the_window_for_short_tasks_only), the batching here.
    """
    app = App("sqs-batches", broker=sqs_url)
    queue = f"busy-{uuid.uuid4().hex[:8]}"
    ran: list[int] = []

    @app.task(queue=queue)
    def noop(i: int) -> None:
        ran.append(i)

    def requests(w: Any) -> tuple[int, int]:
        calls = dict(w.worker.adapter.calls)
        return calls.get("ReceiveMessage", 0), calls.get("DeleteMessageBatch", 0)

    try:
        for start in range(0, 800, 200):
            app.send_many([noop.s(i) for i in range(start, start + 200)])
        with run_worker(app, queues=[queue], concurrency=1, prefetch=40) as w:
            eventually(lambda: len(ran) >= 200, 60.0, description="200 tasks ran")
            done, calls = len(ran), requests(w)
            # Measured while the queue still holds messages: once all 800 are received (after
            # ~760 ran, with 40 held), the worker polls the empty queue while its last tasks
            # run, ~20 empty receives that a window ending late counted (0.136 in a README run;
            # every receive before them carried 10).
            eventually(lambda: len(ran) >= 500, 60.0, description="500 tasks ran")
            now, n = requests(w), len(ran) - done
            receives, acks = (now[0] - calls[0]) / n, (now[1] - calls[1]) / n
            eventually(lambda: len(ran) >= 800, 60.0, description="800 tasks ran")
        assert sorted(ran) == list(range(800))
        # 10 per request is 0.1 per message.  Receives ask for whole requests of 10; acks wait
        # for 10 while a task runs, and go at once when none does (with one slot, a buffer run
        # dry before the next receive answers): how often depends on the host's speed, from
        # ~6 to 10 per request here.  One request per message or two would be 1.0 or 0.5.
        assert receives <= 0.13, (receives, acks, dict(w.worker.adapter.calls))
        assert acks <= 0.2, (receives, acks, dict(w.worker.adapter.calls))
    finally:
        app.close()


def test_a_forked_child_opens_its_own_client_and_request_threads(
    adapter: SQSAdapter, queue: str
) -> None:
    """A producer or consumer used before fork() and in the child: no inherited thread or
    connection is used (the parent's request threads do not exist in the child)."""
    adapter.publish(queue, [Outgoing(f"m{i}", b"x") for i in range(40)])
    got = _take_n(adapter, queue, 40)
    adapter.ack(got[:20])  # two requests at once: the parent's request threads exist now
    assert adapter._client._pool is not None
    pid = os.fork()
    if pid == 0:  # the child
        code = 1
        try:
            adapter.ack(got[20:])
            code = 0 if adapter.stats(queue).in_flight == 0 else 2
        finally:
            os._exit(code)
    deadline = time.monotonic() + 20
    while True:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            break
        if time.monotonic() > deadline:
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
            pytest.fail("the forked child hung on the request threads it inherited")
        time.sleep(0.05)
    assert os.waitstatus_to_exitcode(status) == 0
    st = adapter.stats(queue)  # the parent's adapter still works
    assert (st.ready, st.in_flight) == (0, 0)


# -- an early ack asked again after its answer was lost ----------------------------------------
def test_an_early_ack_carried_out_whose_answer_was_lost_is_done_when_asked_again(
    adapter: SQSAdapter, queue: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Defect (found by the chaos soak): a cut connection swallowed the answer of a
    # DeleteMessageBatch that SQS had carried out; the worker's renewal of the delivery it
    # still held was refused (the message was gone), the receipt taken for stale, and the
    # at-most-once task lost unrun.
    from ackwise.errors import TransientAdapterError

    adapter.publish(queue, [Outgoing("e1", b"one")])
    [d] = _take_n(adapter, queue, 1)
    call = adapter._client.call
    lost = []

    def answer_lost(operation: str, **params: Any) -> Any:
        out = call(operation, **params)
        if operation == "DeleteMessageBatch" and not lost:
            lost.append(out)
            raise TransientAdapterError("connection reset (the answer was lost)")
        return out

    monkeypatch.setattr(adapter._client, "call", answer_lost)
    with pytest.raises(TransientAdapterError):
        adapter.ack_before_start([d])  # SQS deleted it; the worker cannot know
    assert lost, "the delete was carried out"
    adapter.extend([d], lease=30)  # the worker renews what it holds meanwhile: no stale
    adapter.ack_before_start([d])  # asked again after the reconnect: done
    st = adapter.stats(queue)
    assert (st.ready, st.in_flight) == (0, 0)


def test_a_receive_retried_by_botocore_counts_its_lease_from_the_retry(
    adapter: SQSAdapter, queue: str
) -> None:
    # Defect (C18 on SQS under load): a ReceiveMessage cut by a connection reset was retried
    # by botocore a second and more later, and SQS took the message at the retry; the lease
    # counted from the call's start ended before the worker could start the task, whose ack
    # the local fence then refused: the message ran a third time elsewhere.
    from botocore.exceptions import ConnectionClosedError

    adapter.publish(queue, [Outgoing("r1", b"one")])
    failed: list[float] = []

    def reset_once(request: Any, **_: Any) -> None:
        if not failed:
            failed.append(time.time())
            time.sleep(1.5)  # the cut lasts a while before the reset reaches the client
            raise ConnectionClosedError(endpoint_url=request.url)

    events = _raw(adapter).meta.events
    events.register_first("before-send.sqs.ReceiveMessage", reset_once)
    try:
        started = time.time()
        [d] = adapter.receive(queue, max_messages=1, wait=0, lease=2.0)
    finally:
        events.unregister("before-send.sqs.ReceiveMessage", reset_once)
    assert failed, "the first attempt was reset and retried"
    # SQS cannot have taken it before the retry was sent, 1.5 s after the call started.
    assert d.lease_deadline >= started + 1.5 + 2.0
    adapter.ack([d])  # the lease is good: no stale receipt
    assert adapter.stats(queue).in_flight == 0


def test_a_pending_ack_is_sent_before_a_receive_that_may_outlast_its_lease(sqs_url: str) -> None:
    # Defect (C18 on SQS under the README run's load): a completed task's ack waited to fill a
    # request of 10 while the loop's next ReceiveMessage hung in botocore's retries longer
    # than the lease; the ack then found the receipt stale and the task ran again.
    from ackwise import Ack, App
    from ackwise.testing import run_worker

    app = App("t", broker=sqs_url)
    armed = threading.Event()
    runs: list[str] = []

    # Running (so the short task's ack waits for company), but holding no lease that the
    # hang could outlast: acked at start.
    @app.task(name="t.long", ack=Ack.EARLY)
    def long() -> None:
        runs.append("long")
        armed.set()
        time.sleep(4.0)

    @app.task(name="t.short")
    def short() -> None:
        runs.append("short")
        armed.wait(5)

    finished = threading.Event()  # set on the worker's loop, as it settles the short task
    slowed: list[float] = []

    def hang_once(**_: Any) -> None:
        if finished.is_set() and not slowed:
            slowed.append(time.time())
            time.sleep(2.5)  # longer than the 2 s lease

    class OnSuccess(logging.Handler):  # the task log's line is written as the loop settles
        def emit(self, record: logging.LogRecord) -> None:
            fields = getattr(record, "ackwise", {})
            if fields.get("event") == "succeeded" and fields.get("task") == "t.short":
                finished.set()

    task_log = logging.getLogger("ackwise.task")
    handler, level = OnSuccess(), task_log.level

    app.send_many([long.s(), short.s()])
    task_log.addHandler(handler)
    task_log.setLevel(logging.INFO)  # before the worker starts: it subscribes what is enabled
    try:
        with run_worker(app, concurrency=2, lease=2.0, prefetch=4) as w:
            assert w.worker.wait_ready(10)
            _raw(w.worker.adapter).meta.events.register_first(  # type: ignore[arg-type]
                "before-send.sqs.ReceiveMessage", hang_once
            )
            w.join(timeout=30)
    finally:
        task_log.removeHandler(handler)
        task_log.setLevel(level)
    assert slowed, "a receive hung past the lease while the short task's ack was pending"
    assert runs.count("short") == 1, runs
    assert runs.count("long") == 1, runs
