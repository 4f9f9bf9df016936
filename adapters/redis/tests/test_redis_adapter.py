"""Guarantees pinned on the Redis adapter itself (beyond the shared conformance suite)."""

from __future__ import annotations

import logging
import random
import signal
import subprocess
import sys
import textwrap
import threading
import time
import uuid
from collections.abc import Iterator, Sequence

import pytest

from ackwise import Adapter, App, open_adapter
from ackwise.errors import PermanentAdapterError, StaleReceipt, TransientAdapterError
from ackwise.spi import Delivery, Outgoing, QueueSpec
from ackwise.testing import run_worker
from ackwise_conformance.brokers import BrokerHandle
from ackwise_conformance.helpers import eventually

# -- helpers -------------------------------------------------------------------------------


@pytest.fixture
def adapter(redis_url: str) -> Iterator[Adapter]:
    a = open_adapter(redis_url)
    a.open()
    yield a
    a.close()


@pytest.fixture
def queue(adapter: Adapter) -> str:
    name = f"pinned-{uuid.uuid4().hex[:12]}"
    adapter.declare(QueueSpec(name))
    return name


def _raw(adapter: Adapter, *command: object) -> object:
    """Send one raw command on the adapter's connection (white-box checks)."""
    conn = adapter._server.connection()  # type: ignore[attr-defined]
    conn.send_command(*command)
    return conn.read_response()


# -- no loss window between pop and in flight ----------------------------------------------

_RECEIVER = textwrap.dedent(
    """
    import sys
    from ackwise import open_adapter
    a = open_adapter(sys.argv[1])
    a.open()
    print("looping", flush=True)
    while True:  # take and never settle: only the lease can bring them back
        a.receive(sys.argv[2], max_messages=7, wait=0.0, lease=float(sys.argv[3]))
    """
)


def test_sigkill_during_receive_calls_loses_no_message(
    adapter: Adapter, queue: str, redis_url: str
) -> None:
    """Receivers SIGKILLed at random points of their receive loop lose nothing.

    Each receive script pops ready messages and records them in flight in one atomic step, so
    a killed caller leaves every message it touched either ready or leased; the leased ones come
    back when the lease expires.  A drain afterwards must see every published message.
    """
    lease = 0.5
    ids = [f"m{i}" for i in range(3000)]
    adapter.publish(queue, [Outgoing(i, i.encode()) for i in ids])
    rng = random.Random(4)
    kills = 0
    for _ in range(25):
        proc = subprocess.Popen(
            [sys.executable, "-c", _RECEIVER, redis_url, queue, str(lease)],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
        )
        try:
            assert proc.stdout is not None
            assert proc.stdout.readline() == b"looping\n", proc.stderr.read() if proc.stderr else ""
            # Fault injection, not synchronization: kill at a random point of the loop.
            time.sleep(rng.uniform(0.0, 0.03))
            proc.send_signal(signal.SIGKILL)
            kills += 1
        finally:
            proc.kill()
            proc.wait(10)
    seen: dict[str, int] = {}
    deadline = time.monotonic() + 30
    while len(seen) < len(ids) and time.monotonic() < deadline:
        got = adapter.receive(queue, max_messages=500, wait=0.2, lease=30.0)
        for d in got:
            assert d.message_id not in seen, f"{d.message_id} delivered twice after its ack"
            seen[d.message_id] = d.attempt
        if got:
            adapter.ack(got)
    missing = sorted(set(ids) - set(seen))
    assert not missing, f"{len(missing)} message(s) lost after {kills} kills: {missing[:10]}"
    # Messages the killed receivers had leased came back with their delivery count raised
    # (without this the kills hit nothing and the test would prove nothing).
    assert sum(1 for a in seen.values() if a > 1) >= 1, "no redelivery after the kills"
    st = adapter.stats(queue)
    assert (st.ready, st.delayed, st.in_flight, st.dead) == (0, 0, 0, 0), st


# -- stale receipts ------------------------------------------------------------------------


def test_stale_ack_after_the_lease_moved_on_leaves_the_new_delivery_alone(
    adapter: Adapter, queue: str, redis_url: str
) -> None:
    other = open_adapter(redis_url)
    other.open()
    try:
        adapter.publish(queue, [Outgoing("m", b"body")])
        (old,) = adapter.receive(queue, max_messages=1, wait=5.0, lease=0.3)
        (new,) = eventually(
            lambda: other.receive(queue, max_messages=1, wait=0.5, lease=30.0), 10.0
        )
        assert (new.message_id, new.attempt) == ("m", old.attempt + 1)
        for settle in (
            lambda: adapter.ack([old]),
            lambda: adapter.extend([old], lease=30.0),
            lambda: adapter.nack(old),
            lambda: adapter.dead_letter(old, reason="failed"),
        ):
            with pytest.raises(StaleReceipt) as info:
                settle()
            assert info.value.deliveries == (old,)
        keys = adapter.keys(queue)  # type: ignore[attr-defined]
        # Redis' own state: only the new delivery is in flight, its body is still stored.
        assert _raw(adapter, "ZRANGE", keys.inflight, 0, -1) == [new.receipt]
        assert _raw(adapter, "HLEN", keys.data) == 1
        st = adapter.stats(queue)
        assert (st.ready, st.in_flight, st.dead) == (0, 1, 0)
        other.ack([new])
        assert _raw(adapter, "HLEN", keys.data) == 0
    finally:
        other.close()


# -- delays --------------------------------------------------------------------------------


def test_countdown_of_ten_lease_lengths_runs_once_and_not_early(redis_url: str) -> None:
    lease = 0.4
    countdown = 10 * lease
    app = App("redis-countdown", broker=redis_url)
    queue = f"countdown-{uuid.uuid4().hex[:8]}"
    starts: list[float] = []

    @app.task(queue=queue)
    def tick() -> None:
        starts.append(time.time())

    try:
        with run_worker(app, queues=[queue], lease=lease) as worker:
            sent = time.time()
            tick.apply_async(countdown=countdown)
            eventually(lambda: starts, countdown + 10.0, description="the delayed task to run")
            worker.join(10.0)
            time.sleep(2 * lease)  # let a duplicate appear if the lease logic would make one
            report = worker.join(10.0)
        assert len(starts) == 1, f"ran {len(starts)} times"
        assert starts[0] >= sent + countdown - 0.05, (
            f"ran {sent + countdown - starts[0]:.3f}s early"
        )
        assert len(report.succeeded) == 1
    finally:
        app.close()


# -- idle receive blocks instead of polling ------------------------------------------------


def _calls(adapter: Adapter, command: str) -> int:
    info = _raw(adapter, "INFO", "commandstats")
    assert isinstance(info, bytes)
    for line in info.decode().splitlines():
        if line.startswith(f"cmdstat_{command}:"):
            return int(line.split("calls=", 1)[1].split(",", 1)[0])
    return 0


def test_idle_receive_blocks_on_redis_instead_of_polling(
    adapter: Adapter, queue: str, redis_url: str
) -> None:
    waiter = open_adapter(redis_url)
    waiter.open()
    try:
        before = _calls(adapter, "evalsha")
        start = time.monotonic()
        assert waiter.receive(queue, max_messages=10, wait=1.0, lease=5.0) == []
        assert time.monotonic() - start >= 0.9
        # One receive script, one BLPOP, one more receive script: no polling loop.
        assert _calls(adapter, "evalsha") - before <= 4
        # A publish wakes a blocked receiver at once.
        got: list[object] = []
        thread = threading.Thread(
            target=lambda: got.extend(waiter.receive(queue, max_messages=1, wait=5.0, lease=5.0))
        )
        thread.start()
        eventually(lambda: _blocked_clients(adapter) >= 1, 5.0)
        published = time.monotonic()
        adapter.publish(queue, [Outgoing("wake", b"x")])
        thread.join(5.0)
        assert [d.message_id for d in got] == ["wake"]  # type: ignore[attr-defined]
        assert time.monotonic() - published < 0.5
    finally:
        waiter.close()


def _blocked_clients(adapter: Adapter) -> int:
    info = _raw(adapter, "INFO", "clients")
    assert isinstance(info, bytes)
    for line in info.decode().splitlines():
        if line.startswith("blocked_clients:"):
            return int(line.split(":")[1])
    return 0


# -- keys ----------------------------------------------------------------------------------


def test_every_key_of_a_queue_shares_its_hash_tag(adapter: Adapter, queue: str) -> None:
    adapter.publish(queue, [Outgoing("a", b"a"), Outgoing("b", b"b", delay=60.0)])
    (d,) = adapter.receive(queue, max_messages=1, wait=1.0, lease=30.0)
    adapter.publish(queue, [Outgoing("c", b"c")])
    adapter.dead_letter(d, reason="failed")
    prefix = adapter.settings.prefix  # type: ignore[attr-defined]
    tag = f"{{{prefix}:{queue}}}:".encode()
    keys = _raw(adapter, "KEYS", f"*{queue}*")
    assert isinstance(keys, list) and len(keys) >= 6
    assert all(k.startswith(tag) for k in keys), keys
    adapter.purge(queue)
    adapter.delete_dead(queue)


def test_the_in_flight_and_early_ack_sets_are_skiplists_from_their_first_member(
    adapter: Adapter, queue: str
) -> None:
    # Redis keeps a sorted set of up to 128 short members as a listpack, which every ZADD and
    # ZMSCORE reads end to end: the in-flight set of a draining worker (about its prefetch
    # window) cost 4.4 µs of Redis CPU a message to lease, and the queue's drain ~1.4x slower.
    k = adapter.keys(queue)  # type: ignore[attr-defined]
    adapter.publish(queue, [Outgoing(f"m{i}", b"x") for i in range(4)])
    late = adapter.receive(queue, max_messages=2, wait=0, lease=30)
    assert _raw(adapter, "OBJECT", "ENCODING", k.inflight) == b"skiplist"
    more = adapter.receive(queue, max_messages=2, wait=0, lease=30)  # into the existing set
    members = _raw(adapter, "ZRANGE", k.inflight, 0, -1)
    assert isinstance(members, list)
    assert sorted(members) == sorted(d.receipt for d in late + more)  # no seed left
    adapter.ack_before_start(more)
    assert _raw(adapter, "OBJECT", "ENCODING", k.early) == b"skiplist"
    assert _raw(adapter, "ZCARD", k.early) == 2
    adapter.ack(late)
    assert _raw(adapter, "EXISTS", k.inflight) == 0  # emptied: gone, and made anew next time
    adapter.publish(queue, [Outgoing("again", b"x")])
    adapter.receive(queue, max_messages=1, wait=0, lease=30)
    assert _raw(adapter, "OBJECT", "ENCODING", k.inflight) == b"skiplist"


# -- maxmemory-policy -----------------------------------------------------------------------


def test_eviction_policy_warns_and_strict_refuses(
    own_redis: BrokerHandle, caplog: pytest.LogCaptureFixture
) -> None:
    probe = open_adapter(own_redis.url)
    probe.open()
    _raw(probe, "CONFIG", "SET", "maxmemory-policy", "noeviction")
    probe.close()
    with caplog.at_level(logging.WARNING, logger="ackwise_redis"):
        quiet = open_adapter(own_redis.url)
        quiet.open()
        quiet.close()
    assert not [r for r in caplog.records if "maxmemory-policy" in r.getMessage()]

    probe.open()
    _raw(probe, "CONFIG", "SET", "maxmemory-policy", "allkeys-lru")
    probe.close()
    with caplog.at_level(logging.WARNING, logger="ackwise_redis"):
        warned = open_adapter(own_redis.url)
        warned.open()  # opens, but says why it is dangerous
        warned.close()
    messages = [r.getMessage() for r in caplog.records if "maxmemory-policy" in r.getMessage()]
    assert messages and "allkeys-lru" in messages[0] and "noeviction" in messages[0]

    strict = open_adapter(own_redis.url + "?strict=true")
    with pytest.raises(PermanentAdapterError, match=r"allkeys-lru.*strict=true"):
        strict.open()
    assert not strict._server.link.is_open  # type: ignore[attr-defined]


def test_config_command_disabled_is_tolerated(own_redis: BrokerHandle) -> None:
    # A managed Redis often renames CONFIG away; simulate the refusal with an ACL rule.
    admin = open_adapter(own_redis.url)
    admin.open()
    _raw(admin, "ACL", "SETUSER", "app", "on", ">app-pw", "~*", "+@all", "-config")
    admin.close()
    host, port = own_redis.host, own_redis.port
    adapter = open_adapter(f"redis://app:app-pw@{host}:{port}/0?strict=true")
    adapter.open()  # cannot check the policy: not refused
    queue = f"acl-{uuid.uuid4().hex[:8]}"
    adapter.declare(QueueSpec(queue))
    adapter.publish(queue, [Outgoing("m", b"x")])
    assert [d.message_id for d in adapter.receive(queue, max_messages=1, wait=1, lease=5)] == ["m"]
    adapter.close()


# -- an early ack asked again after a lost answer ----------------------------------------------
def test_an_early_ack_asked_again_after_its_answer_was_lost_is_known_as_done(
    adapter: Adapter, queue: str
) -> None:
    # Defect (found by the chaos soak): a cut connection swallowed the answer of an early ack
    # that Redis had carried out; the worker asked again after reconnecting, got "stale", and
    # never ran the task: an at-most-once task lost with no crash of anything.
    adapter.publish(queue, [Outgoing("e1", b"one"), Outgoing("e2", b"two")])
    first, second = adapter.receive(queue, max_messages=2, wait=0, lease=30)
    _answer_lost(adapter, [first])  # Redis acked it; the worker never heard
    adapter.extend([first, second], lease=30)  # the worker renews what it holds meanwhile
    adapter.ack_before_start([first, second])  # asked again: both are this delivery's acks
    st = adapter.stats(queue)
    assert (st.ready, st.in_flight) == (0, 0)


def _answer_lost(adapter: Adapter, deliveries: list[Delivery]) -> None:
    """An early ack that Redis carried out and whose answer never reached ``adapter``: sent
    on a connection of its own, so ``adapter`` learns nothing of it."""
    other = open_adapter(str(adapter.url))
    other.open()
    other.ack_before_start(deliveries)
    other.close()


def test_an_early_ack_is_known_as_done_after_an_outage_longer_than_the_lease(
    adapter: Adapter, queue: str
) -> None:
    # Defect (found by the 100k chaos soak): a broker restart kept a worker away for 3.2 s,
    # longer than its 3 s lease; the memory of its early acks, kept only as long as the lease,
    # was gone when it asked again, so it dropped the batch as stale: 8 at-most-once tasks
    # acked and never run with no crash of any worker or executor.
    adapter.publish(queue, [Outgoing("e1", b"one")])
    [d] = adapter.receive(queue, max_messages=1, wait=0, lease=0.3)
    _answer_lost(adapter, [d])
    time.sleep(0.6)  # the outage outlasts the lease
    adapter.ack_before_start([d])  # asked again after reconnecting: no StaleReceipt
    adapter.extend([d], lease=30)  # nor on the renewal that may come first


def test_an_answered_early_ack_is_forgotten_by_the_next_one(adapter: Adapter, queue: str) -> None:
    # The memory costs nothing in the steady state: it holds what lost its answer and the
    # last batch of each adapter.
    adapter.publish(queue, [Outgoing(f"e{i}", b"x") for i in range(30)])
    got = adapter.receive(queue, max_messages=30, wait=0, lease=30)
    for d in got:
        adapter.ack_before_start([d])
    early = adapter.keys(queue).early  # type: ignore[attr-defined]
    assert _raw(adapter, "ZCARD", early) == 1


def test_an_early_ack_of_a_delivery_whose_lease_moved_on_is_still_stale(
    adapter: Adapter, queue: str
) -> None:
    adapter.publish(queue, [Outgoing("e1", b"one")])
    [old] = adapter.receive(queue, max_messages=1, wait=0, lease=0.2)
    time.sleep(0.3)
    [new] = adapter.receive(queue, max_messages=1, wait=0, lease=30)
    adapter.ack_before_start([new])
    with pytest.raises(StaleReceipt) as caught:
        adapter.ack_before_start([old])
    assert list(caught.value.deliveries) == [old]
    with pytest.raises(StaleReceipt):
        adapter.extend([old], lease=30)
    with pytest.raises(StaleReceipt):  # a late ack is never taken for an early one
        adapter.ack([new])


def test_a_waiting_receive_gets_a_message_published_while_it_waits_after_a_script_flush(
    adapter: Adapter, queue: str, redis_url: str
) -> None:
    # The wait and the receive script go out together; when the script was flushed from
    # Redis meanwhile, the receive loads it again and still returns what was published.
    got: list[Sequence[Delivery]] = []
    waiting = threading.Thread(
        target=lambda: got.append(adapter.receive(queue, max_messages=5, wait=5.0, lease=30.0))
    )
    started = time.monotonic()
    waiting.start()
    time.sleep(0.3)  # the receive is blocked in its wait by now
    other = open_adapter(redis_url)
    other.open()
    raw = other._server.link.connection()  # type: ignore[attr-defined]
    raw.send_command("SCRIPT", "FLUSH")
    raw.read_response()
    other.publish(queue, [Outgoing("m1", b"body")])
    waiting.join(10)
    other.close()
    assert [d.message_id for d in got[0]] == ["m1"]
    assert time.monotonic() - started < 3.0  # woken by the publish, not at the end of its wait


# -- a receive whose answer is read later ----------------------------------------------------
def test_receive_later_after_a_script_flush_loads_the_script_and_answers(
    adapter: Adapter, queue: str
) -> None:
    adapter.publish(queue, [Outgoing("m1", b"one"), Outgoing("m2", b"two")])
    _raw(adapter, "SCRIPT", "FLUSH")  # the script is unknown when it is asked for
    answer = adapter.receive_later(queue, max_messages=5, lease=30.0)
    assert answer is not None
    got = answer()
    assert [d.message_id for d in got] == ["m1", "m2"]
    adapter.ack(got)
    assert adapter.stats(queue).in_flight == 0


def test_receive_later_whose_answer_was_lost_reports_a_transient_loss(
    adapter: Adapter, queue: str
) -> None:
    adapter.publish(queue, [Outgoing("m1", b"one")])
    answer = adapter.receive_later(queue, max_messages=1, lease=0.5)
    assert answer is not None
    ahead = adapter._server.ahead.connection()  # type: ignore[attr-defined]
    ahead.disconnect()  # the connection breaks before the answer is read
    with pytest.raises(TransientAdapterError):
        answer()
    # Redis leased it when asked: it comes back once the lease ran out, on a new connection.
    deadline = time.monotonic() + 10
    got: Sequence[Delivery] = []
    while not got and time.monotonic() < deadline:
        again = adapter.receive_later(queue, max_messages=1, lease=30.0)
        assert again is not None
        got = again()
        time.sleep(0.05)
    assert [(d.message_id, d.attempt) for d in got] == [("m1", 2)]
    adapter.ack(got)


def test_receive_later_asked_again_before_its_answer_was_read_stays_in_step(
    adapter: Adapter, queue: str
) -> None:
    # The unread answer is read and dropped first: the second answer is its own.
    adapter.publish(queue, [Outgoing("m1", b"one"), Outgoing("m2", b"two")])
    assert adapter.receive_later(queue, max_messages=1, lease=30.0) is not None
    second = adapter.receive_later(queue, max_messages=1, lease=30.0)
    assert second is not None
    got = second()
    assert [d.message_id for d in got] == ["m2"]
    adapter.ack(got)
