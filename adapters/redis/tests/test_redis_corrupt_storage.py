"""Corrupt storage in Redis never costs a valid message nor stops a worker.

Records are written straight into a queue's keys with a raw redis-py client, among valid
messages, the way a foreign writer, a hand edit or a damaged restore would leave them; a real
worker drains the queue.  Covered: malformed ready / delayed / in-flight entries, entries
without data, data values without ackwise's framing, framed bodies that are no envelope,
malformed dead letters, and keys of the wrong Redis type (renamed aside).  Also pinned: no
script of the adapter fails after its first write (Redis would keep those writes).
"""

from __future__ import annotations

import logging
import math
import time
import uuid
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import redis
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from ackwise import App, open_adapter
from ackwise.spi import Outgoing, QueueSpec
from ackwise.testing import InProcessWorker, run_worker
from ackwise_conformance.corruption import drain_among_corrupt
from ackwise_redis import _adapter as redis_adapter
from ackwise_redis._adapter import _KEY_TYPES, RedisAdapter, _Keys, _keys, _pack
from ackwise_redis._connection import load_script

# -- helpers -------------------------------------------------------------------------------


def _raw_client(url: str) -> redis.Redis:
    """A plain redis-py client on the broker behind ``url`` (to write what ackwise never does)."""
    adapter = open_adapter(url)
    assert isinstance(adapter, RedisAdapter)
    s = adapter.settings
    return redis.Redis(host=s.host, port=s.port, db=s.db, username=s.username, password=s.password)


@pytest.fixture
def adapter(redis_url: str) -> Iterator[RedisAdapter]:
    a = open_adapter(redis_url)
    assert isinstance(a, RedisAdapter)
    a.open()
    yield a
    a.close()


@pytest.fixture
def raw(redis_url: str) -> Iterator[redis.Redis]:
    client = _raw_client(redis_url)
    yield client
    client.close()


class Recorder:
    """An app with one task that records its argument, on a queue of its own."""

    def __init__(self, url: str) -> None:
        self.queue = f"corrupt-{uuid.uuid4().hex[:10]}"
        self.app = App(f"app-{self.queue}", broker=url, default_queue=self.queue)
        self.ran: list[int] = []

        @self.app.task(name="corrupt.record")
        def record(n: int) -> None:
            self.ran.append(n)

        self.record = record

    def send(self, numbers: range) -> None:
        for n in numbers:
            self.record.delay(n)


@pytest.fixture
def recorder(redis_url: str, adapter: RedisAdapter) -> Iterator[Recorder]:
    r = Recorder(redis_url)
    adapter.declare(QueueSpec(r.queue))
    yield r
    r.app.close()


def _drain(r: Recorder) -> None:
    """Run a worker until the queue is idle; it must still be running, and stop with 0."""
    worker = InProcessWorker(r.app, queues=[r.queue]).start()
    try:
        worker.join(15.0)
        assert worker.is_alive(), "the worker stopped"
    finally:
        status = worker.stop()
    assert status == 0, f"the worker stopped with status {status}"


# -- regressions: each failed on the adapter before corrupt records were handled -----------


def test_a_malformed_ready_entry_costs_no_valid_message_and_stops_no_worker(
    recorder: Recorder, adapter: RedisAdapter, raw: redis.Redis
) -> None:
    # Defect: receive.lua failed on the entry after popping the batch; Redis kept the pop, so
    # all six valid messages were gone (not ready, not in flight, not dead) and the worker
    # exited with status 2.
    recorder.send(range(3))
    raw.rpush(adapter.keys(recorder.queue).ready, b"not-a-seq")
    recorder.send(range(3, 6))
    _drain(recorder)
    assert sorted(recorder.ran) == list(range(6))
    [dead] = adapter.dead_letters(recorder.queue)
    assert (dead.reason, dead.body) == ("corrupt_record", b"not-a-seq")
    assert dead.message_id.startswith("corrupt-")
    st_ = adapter.stats(recorder.queue)
    assert (st_.ready, st_.delayed, st_.in_flight, st_.dead) == (0, 0, 0, 1)


def test_a_malformed_urgent_entry_costs_no_valid_message(
    recorder: Recorder, adapter: RedisAdapter, raw: redis.Redis
) -> None:
    # The urgent set (ready messages of priority > 0) is read like the ready list.
    k = adapter.keys(recorder.queue)
    recorder.send(range(3))
    raw.zadd(k.urgent, {b"not-a-seq": 1.0, b"ab-1!7#0": 2.0})  # the second has no data
    recorder.send(range(3, 6))
    _drain(recorder)
    assert sorted(recorder.ran) == list(range(6))
    dead = adapter.dead_letters(recorder.queue)
    assert sorted(d.body for d in dead) == [b"ab-1!7#0", b"not-a-seq"]
    assert {d.reason for d in dead} == {"corrupt_record"}
    st_ = adapter.stats(recorder.queue)
    assert (st_.ready, st_.delayed, st_.in_flight, st_.dead) == (0, 0, 0, 2)


def test_an_unframed_data_value_is_dead_lettered_as_it_is_and_its_batch_runs(
    recorder: Recorder, adapter: RedisAdapter, raw: redis.Redis
) -> None:
    # Defect: _deliveries raised ValueError on the value with the whole batch in flight; the
    # next worker took the batch after the lease and died the same way, forever.
    k = adapter.keys(recorder.queue)
    recorder.send(range(3))
    raw.hset(k.data, b"garbage-seq", b"garbage")
    raw.rpush(k.ready, b"garbage-seq#0")
    recorder.send(range(3, 6))
    _drain(recorder)
    assert sorted(recorder.ran) == list(range(6))
    [dead] = adapter.dead_letters(recorder.queue)
    assert (dead.message_id, dead.reason, dead.body) == (
        "corrupt-garbage-seq",
        "corrupt_record",
        b"garbage",
    )


def test_a_ready_entry_without_data_is_dead_lettered_not_dropped(
    recorder: Recorder, adapter: RedisAdapter, raw: redis.Redis
) -> None:
    # Defect: receive.lua popped the entry and skipped it: gone, and nothing recorded it.
    recorder.send(range(2))
    raw.rpush(adapter.keys(recorder.queue).ready, b"no-such-seq#3")
    recorder.send(range(2, 4))
    _drain(recorder)
    assert sorted(recorder.ran) == list(range(4))
    [dead] = adapter.dead_letters(recorder.queue)
    assert (dead.reason, dead.body) == ("corrupt_record", b"no-such-seq#3")


# -- the property: any malformed record, among valid messages ------------------------------
# A record is (kind, where, value): "entry" writes the malformed entry `value`; "nodata" a
# well-formed entry whose data is missing; "data" a well-formed entry whose data value is
# `value`; "body" one whose data frames a message id and the body `value` (no envelope).
_WHERE = ("ready", "delayed", "inflight")


def _huge(chars: list[bytes]) -> st.SearchStrategy[bytes]:
    return st.sampled_from(chars).map(lambda c: c * 200_000)


_seqlike = st.binary(min_size=1, max_size=12).filter(lambda b: b"#" not in b)
_count = st.integers(0, 10**9 - 1).map(lambda n: str(n).encode())
_not_count = st.one_of(
    st.binary(max_size=10).filter(lambda b: not b.isdigit()),
    st.integers(10**9, 10**40).map(lambda n: str(n).encode()),  # huge n
)
_malformed_ready = st.one_of(
    st.binary(max_size=40).filter(lambda b: b"#" not in b),  # no '#' (and empty)
    st.builds(lambda s, n: s + b"#" + n, _seqlike, _not_count),
    st.builds(lambda n: b"a b#" + n, _count),  # whitespace in the seq
    st.builds(lambda s, n: s + b"#" + n + b"#x", _seqlike, _count),  # a token in a ready entry
    _huge([b"x", b"#", b"\xff"]),
)
_malformed_in_flight = st.one_of(
    st.binary(max_size=40).filter(lambda b: b"#" not in b),
    st.builds(lambda s, n: s + b"#" + n, _seqlike, _count),  # no token
    st.builds(lambda s, n: s + b"#" + n + b"#tok", _seqlike, _not_count),
    _huge([b"x", b"#"]),
)


def _is_framed(value: bytes) -> bool:
    """Is ``value`` "<len(id)>:<id><body>" with a non-empty UTF-8 id (what ackwise writes)?"""
    head, colon, rest = value.partition(b":")
    if not (colon and head.isdigit() and 0 < int(head) <= len(rest)):
        return False
    try:
        rest[: int(head)].decode()
    except UnicodeDecodeError:
        return False
    return True


_malformed_data = st.one_of(
    st.binary(max_size=40).filter(lambda b: not _is_framed(b)),  # no framing
    st.builds(
        lambda rest, extra: b"%d:%s" % (len(rest) + extra, rest),
        st.binary(max_size=20),
        st.integers(1, 10**6),
    ),  # truncated: the id runs past the end
    st.builds(lambda body: b"3:\xff\xfe\xfd" + body, st.binary(max_size=20)),  # id not UTF-8
    st.builds(lambda body: b"0:" + body, st.binary(max_size=20)),  # empty id
    _huge([b"x", b"\xff", b":"]),
)
_not_envelopes = st.one_of(
    st.binary(max_size=40),
    st.just(b'{"v": 1, "task": '),  # truncated JSON
    st.just(b'{"v": 99, "id": "x", "task": "t", "args": [], "kwargs": {}}'),
    _huge([b"x", b"\x00"]),
)
records = st.one_of(
    st.tuples(st.just("entry"), st.sampled_from(["ready", "delayed"]), _malformed_ready),
    st.tuples(st.just("entry"), st.just("inflight"), _malformed_in_flight),
    st.tuples(st.just("nodata"), st.sampled_from(_WHERE), st.just(b"")),
    st.tuples(st.just("data"), st.sampled_from(_WHERE), _malformed_data),
    st.tuples(st.just("body"), st.sampled_from(_WHERE), _not_envelopes),
)
Record = tuple[str, str, bytes]


def _writer(client: redis.Redis, prefix: str) -> Callable[[str, Record], bytes]:
    def write(queue: str, record: Record) -> bytes:
        kind, where, value = record
        k = _keys(prefix, queue)
        if kind == "entry":
            _place(client, k, where, value)
            return value
        seq = f"foreign-{uuid.uuid4().hex[:8]}".encode()
        entry = seq + (b"#2#lost-token" if where == "inflight" else b"#0")
        if kind == "data":
            client.hset(k.data, seq, value)
        elif kind == "body":
            client.hset(k.data, seq, _pack(Outgoing(f"id-{seq.decode()}", value)))
        _place(client, k, where, entry)
        return entry if kind == "nodata" else value

    return write


def _place(client: redis.Redis, k: _Keys, where: str, entry: bytes) -> None:
    """Put an entry where receive finds it now: ready, due, or with its lease expired."""
    if where == "ready":
        client.rpush(k.ready, entry)
    else:
        client.zadd(k.delayed if where == "delayed" else k.inflight, {entry: 0})


@given(corrupt=st.lists(records, min_size=1, max_size=4, unique=True))
@example(corrupt=[("entry", "ready", b"not-a-seq")])
@example(corrupt=[("data", "ready", b"garbage"), ("nodata", "inflight", b"")])
@example(corrupt=[("entry", "ready", b""), ("entry", "delayed", b""), ("entry", "inflight", b"")])
@example(corrupt=[("data", "delayed", b"0:"), ("body", "inflight", b"")])
@settings(
    max_examples=15, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
def test_corrupt_records_never_cost_a_valid_message_nor_the_worker(
    redis_url: str, corrupt: list[Record]
) -> None:
    client = _raw_client(redis_url)
    prefix = open_adapter(redis_url).settings.prefix  # type: ignore[attr-defined]
    try:
        drain_among_corrupt(redis_url, corrupt, _writer(client, prefix))
    finally:
        client.close()


# -- corrupt records after the worker: redelivery, replay, listing, stats ------------------


def test_a_corrupt_record_is_recognized_again_when_its_lease_expires(
    adapter: RedisAdapter, raw: redis.Redis
) -> None:
    queue = f"again-{uuid.uuid4().hex[:8]}"
    k = adapter.keys(queue)
    raw.rpush(k.ready, b"not-a-seq")
    raw.hset(k.data, b"s1", b"12:short")
    raw.rpush(k.ready, b"s1#0")
    first = {d.body: d for d in adapter.receive(queue, max_messages=10, wait=0, lease=0.2)}
    time.sleep(0.3)  # a worker that took them died: the leases expire
    again = {d.body: d for d in adapter.receive(queue, max_messages=10, wait=0, lease=30.0)}
    assert set(first) == set(again) == {b"not-a-seq", b"12:short"}
    for body, d in again.items():
        assert (d.message_id, d.attempt) == (first[body].message_id, first[body].attempt + 1)
    assert "ready entry b'not-a-seq' is not <seq>#<n>" in (again[b"not-a-seq"].corrupt or "")
    assert "runs past the end" in (again[b"12:short"].corrupt or "")
    assert again[b"12:short"].message_id == "corrupt-s1"


def test_a_corrupt_records_dead_letter_is_replayed_and_deleted_by_its_stand_in_id(
    recorder: Recorder, adapter: RedisAdapter, raw: redis.Redis
) -> None:
    raw.rpush(adapter.keys(recorder.queue).ready, b"\x00raw#")
    with run_worker(recorder.app, queues=[recorder.queue]) as worker:
        worker.join()
        [dead] = adapter.dead_letters(recorder.queue)
        assert (dead.reason, dead.body) == ("corrupt_record", b"\x00raw#")
        assert adapter.requeue_dead(recorder.queue, [dead.message_id]) == 1
        worker.join()
    [again] = adapter.dead_letters(recorder.queue)  # now framed: its body is no envelope
    assert (again.message_id, again.reason, again.body) == (
        dead.message_id,
        "decode_error",
        b"\x00raw#",
    )
    assert adapter.delete_dead(recorder.queue, [dead.message_id]) == 1
    assert adapter.stats(recorder.queue).dead == 0


def test_dead_letter_listing_survives_malformed_records_which_go_by_their_stand_in_id(
    adapter: RedisAdapter, raw: redis.Redis
) -> None:
    queue = f"dead-{uuid.uuid4().hex[:8]}"
    k = adapter.keys(queue)
    rows = {
        b"d1": (b"garbage", b"\xff\xfe|\xff"),  # unframed data, info not UTF-8
        b"d2": (None, b"many|failed"),  # no data, attempt not a number
        b"d3": (b"3:\xff\xfe\xfdbody", None),  # id not UTF-8, no info
        b"d4": (b"1:xbody", b"2"),  # a good record, info without a reason
    }
    for i, (seq, (data, info)) in enumerate(rows.items()):
        raw.zadd(k.dead, {seq: 1000.0 + i})
        if data is not None:
            raw.hset(k.data, seq, data)
        if info is not None:
            raw.hset(k.dead_info, seq, info)
    listed = adapter.dead_letters(queue)
    assert [(d.message_id, d.body, d.reason, d.attempt, d.dead_at) for d in listed] == [
        ("corrupt-d1", b"garbage", "\ufffd", 0, 1000.0),
        ("corrupt-d2", b"", "failed", 0, 1001.0),
        ("corrupt-d3", b"3:\xff\xfe\xfdbody", "unknown", 0, 1002.0),
        ("x", b"body", "unknown", 2, 1003.0),
    ]
    assert adapter.delete_dead(queue, ["corrupt-d2"]) == 1
    assert adapter.requeue_dead(queue, ["corrupt-d1", "corrupt-d3"]) == 2
    assert [d.message_id for d in adapter.dead_letters(queue)] == ["x"]
    requeued = adapter.receive(queue, max_messages=10, wait=0, lease=30.0)
    assert sorted(d.body for d in requeued) == [b"3:\xff\xfe\xfdbody", b"garbage"]
    assert all(d.corrupt for d in requeued)


def test_stats_survive_entries_ackwise_did_not_write(
    adapter: RedisAdapter, raw: redis.Redis
) -> None:
    queue = f"stats-{uuid.uuid4().hex[:8]}"
    k = adapter.keys(queue)
    for entry in (b"f" * 100_000 + b"-1#0", b"", b"zz-1#0", b"\xff#x"):
        raw.rpush(k.ready, entry)
    raw.zadd(k.delayed, {b"fffffffffffffffffffff-1#0": 0, b"later": 2**60})
    raw.zadd(k.inflight, {b"0x10-1#1#t": 0, b"held": 2**60})
    raw.zadd(k.dead, {b"any": 1.0})
    for head in range(3):
        st_ = adapter.stats(queue)
        assert (st_.ready, st_.delayed, st_.in_flight, st_.dead) == (6 - head, 1, 1, 1)
        assert st_.oldest_age >= 0.0 and math.isfinite(st_.oldest_age)
        raw.lpop(k.ready)


def test_swept_entries_not_taken_go_back_in_order_and_malformed_ones_wait_their_turn(
    adapter: RedisAdapter, raw: redis.Redis
) -> None:
    queue = f"order-{uuid.uuid4().hex[:8]}"
    k = adapter.keys(queue)
    for seq in (b"e1", b"e2", b"r1", b"d1"):
        raw.hset(k.data, seq, b"2:" + seq)
    raw.zadd(k.inflight, {b"e1#1#t": 1, b"bad-lease": 2, b"e2#1#t": 3})
    raw.rpush(k.ready, b"r1#0")
    raw.zadd(k.delayed, {b"d1#0": 1})
    got = adapter.receive(queue, max_messages=1, wait=0, lease=30.0)
    assert [(d.message_id, d.attempt) for d in got] == [("e1", 2)]
    # e2 went back to the head, d1 to the tail; the malformed lease stays until it is taken
    assert raw.lrange(k.ready, 0, -1) == [b"e2#1", b"r1#0", b"d1#0"]
    assert raw.zrange(k.inflight, 0, 0) == [b"bad-lease"]
    first, *rest = adapter.receive(queue, max_messages=10, wait=0, lease=30.0)
    assert (first.body, first.corrupt) == (
        b"bad-lease",
        "in-flight entry b'bad-lease' is not <seq>#<n>#<token>",
    )
    assert [(d.message_id, d.corrupt) for d in rest] == [("e2", None), ("r1", None), ("d1", None)]


# -- keys of the wrong Redis type ----------------------------------------------------------
_WRONG_VALUES: dict[str, Callable[[redis.Redis, bytes], Any]] = {
    "a string": lambda c, key: c.set(key, b"not mine"),
    "a list": lambda c, key: c.rpush(key, b"not mine"),
    "a hash": lambda c, key: c.hset(key, b"not", b"mine"),
    "a string that is no count": lambda c, key: c.set(key, b"twelve"),
}
_WRONG_KEYS = [
    ("ready", "a string"),
    ("delayed", "a string"),
    ("inflight", "a list"),
    ("data", "a string"),
    ("seq", "a list"),
    ("seq", "a string that is no count"),
    ("notify", "a string"),
    ("dead", "a list"),
    ("dead_info", "a string"),
    ("dead_ids", "a list"),
]


@pytest.mark.parametrize(("name", "wrong"), _WRONG_KEYS)
def test_a_wrong_typed_key_is_renamed_aside_once_and_the_queue_goes_on(
    recorder: Recorder,
    adapter: RedisAdapter,
    raw: redis.Redis,
    caplog: pytest.LogCaptureFixture,
    name: str,
    wrong: str,
) -> None:
    key = getattr(adapter.keys(recorder.queue), name)
    raw.delete(key)
    _WRONG_VALUES[wrong](raw, key)
    held = raw.dump(key)
    with caplog.at_level(logging.ERROR, logger="ackwise_redis"):
        recorder.send(range(3))
        raw.rpush(adapter.keys(recorder.queue).ready, b"not-a-seq")  # to reach the dead keys
        _drain(recorder)
    assert sorted(recorder.ran) == [0, 1, 2]
    [dead] = adapter.dead_letters(recorder.queue)
    assert dead.body == b"not-a-seq"
    [aside] = raw.keys(key + b":quarantined:*")
    assert raw.dump(aside) == held
    lines = [r.getMessage() for r in caplog.records if key.decode() in r.getMessage()]
    assert len(lines) == 1 and aside.decode() in lines[0], lines


def test_a_corrupt_seq_counter_restarts_above_every_stored_seq(
    adapter: RedisAdapter, raw: redis.Redis
) -> None:
    queue = f"counter-{uuid.uuid4().hex[:8]}"
    k = adapter.keys(queue)
    adapter.publish(queue, [Outgoing("a", b"a")])
    raw.set(k.seq, b"-1")
    adapter.publish(queue, [Outgoing("b", b"b"), Outgoing("c", b"c", delay=0.01)])
    restarted = int(raw.get(k.seq) or b"0")
    assert restarted > time.time() * 1_000_000 - 60_000_000  # the server's time, in us
    time.sleep(0.05)
    got = adapter.receive(queue, max_messages=10, wait=0, lease=30.0)
    assert [d.message_id for d in got] == ["a", "b", "c"]


def test_a_wrong_typed_queue_registry_is_renamed_aside(
    adapter: RedisAdapter, raw: redis.Redis
) -> None:
    registry = f"{{{adapter.settings.prefix}}}:queues".encode()
    raw.set(registry, b"not a set")
    adapter.declare(QueueSpec("q1"))
    assert adapter.queues() == ["q1"]
    assert raw.keys(registry + b":quarantined:*")


# -- no script fails after its first write -------------------------------------------------
# Each script runs against a populated queue with one of its keys replaced by a wrong-typed
# value: it either succeeds or fails without changing anything, with an error the adapter
# recognizes (WRONGTYPE or ACKWISE_CORRUPT), so the quarantine can set the key aside.


def _populated(adapter: RedisAdapter) -> tuple[_Keys, str, bytes]:
    """A queue with ready (one of priority 4), delayed, in-flight (one expired), dead messages;
    a live receipt."""
    queue = f"atomic-{uuid.uuid4().hex[:8]}"
    k = adapter.keys(queue)
    adapter.publish(queue, [Outgoing("dead", b"d"), Outgoing("held", b"h")])
    adapter.publish(queue, [Outgoing("expired", b"e"), Outgoing("later", b"l", delay=600.0)])
    dead, held = adapter.receive(queue, max_messages=2, wait=0, lease=600.0)
    adapter.dead_letter(dead, reason="failed")
    adapter.receive(queue, max_messages=1, wait=0, lease=0.001)
    adapter.publish(queue, [Outgoing("ready", b"r"), Outgoing("urgent", b"u", priority=4)])
    time.sleep(0.01)
    return k, queue, held.receipt


def _calls(receipt: bytes) -> list[tuple[str, tuple[str, ...], tuple[Any, ...]]]:
    """(script, the names of its keys, args) for every queue script."""
    packed = _pack(Outgoing("new", b"n"))
    settle = ("inflight", "ready", "delayed", "notify", "urgent")
    dead = ("dead", "dead_info", "dead_ids", "data")
    publish = ("ready", "delayed", "data", "seq", "notify", "urgent")
    return [
        (
            "receive",
            ("ready", "delayed", "inflight", "data", "notify", "urgent"),
            (10, "30.0", "t.1", 1000),
        ),
        ("publish", publish, (b"1", packed, "0", packed, "9")),
        ("publish", publish, (b"2", packed, "0", "3", packed, "9", "0", packed, "0", "0")),
        ("ack", ("inflight", "data", "early"), ("late", receipt)),
        ("ack", ("inflight", "data", "early"), ("early", 120, 0, receipt)),
        ("ack", ("inflight", "data", "early"), ("early", 120, 1, b"old#1#t", b"gone#1#t", receipt)),
        ("extend", ("inflight", "early"), ("30.0", receipt)),
        ("extend", ("inflight", "early"), ("30.0", b"gone#1#t", receipt)),
        ("nack", settle, (receipt, "0")),
        ("nack", settle, (receipt, "5")),
        (
            "dead_letter",
            ("inflight", "data", "dead", "dead_info", "dead_ids"),
            (receipt, "held", "failed", packed),
        ),
        (
            "publish_dead",
            ("data", "dead", "dead_info", "dead_ids", "seq"),
            ("r", "new", packed, "0", "new", packed, "5"),
        ),
        ("requeue_dead", (*dead, "ready", "seq", "notify", "urgent"), ("dead",)),
        ("delete_dead", dead, ("=", "dead")),
        ("delete_dead", dead, ("*",)),
        ("purge", ("ready", "delayed", "data", "urgent"), (1000,)),
        ("stats", ("ready", "delayed", "inflight", "dead", "urgent"), ()),
        ("dead_letters", ("dead", "data", "dead_info"), (100,)),
    ]


def _snapshot(client: redis.Redis, tag: bytes) -> dict[bytes, bytes | None]:
    return {key: client.dump(key) for key in client.keys(tag + b"*")}


#: Wrong values tried for a key, by what it must hold.
_WRONG_FOR = {
    "list": ["a string", "a hash"],
    "zset": ["a string", "a list"],
    "hash": ["a string", "a list"],
    "counter": ["a list", "a string that is no count"],
}


def _break(client: redis.Redis, key: bytes, wrong: str) -> None:
    client.delete(key)
    _WRONG_VALUES[wrong](client, key)


def test_no_queue_script_fails_after_its_first_write(
    adapter: RedisAdapter, raw: redis.Redis
) -> None:
    cases = [
        (i, broken, wrong)
        for i, (_, names, _) in enumerate(_calls(b""))
        for broken in names
        for wrong in _WRONG_FOR[_KEY_TYPES[broken]]
    ]
    failures = []
    for i, broken, wrong in cases:
        k, queue, receipt = _populated(adapter)
        name, names, args = _calls(receipt)[i]
        keys = [getattr(k, n) for n in names]
        _break(raw, getattr(k, broken), wrong)
        tag = f"{{{adapter.settings.prefix}:{queue}}}".encode()
        before = _snapshot(raw, tag)
        try:
            raw.eval(getattr(redis_adapter, f"_{name.upper()}").source, len(keys), *keys, *args)
        except redis.ResponseError as exc:
            where = f"{name} with {broken} as {wrong}"
            if _snapshot(raw, tag) != before:
                failures.append(f"{where}: failed after writing ({exc})")
            if "WRONGTYPE" not in str(exc) and "ACKWISE_CORRUPT" not in str(exc):
                failures.append(f"{where}: an error the adapter does not recognize: {exc}")
    assert not failures, "\n".join(failures)


def test_no_lock_or_idempotency_script_fails_after_its_first_write(raw: redis.Redis) -> None:
    failures = []
    for name, n_keys, args in [  # keys: the lock, its fence (or fires), its schedules, fences
        ("lock_acquire", 2, ["tok", 5000, "host:1"]),
        ("lock_renew", 1, ["tok", 5000]),
        ("lock_release", 1, ["tok"]),
        ("lock_claim", 4, ["tok", "sched", 123, 64]),
        ("lock_info", 1, []),
        ("idem_claim", 1, ["holder", 5000]),
        ("idem_extend", 1, ["holder", 5000]),
        ("idem_complete", 1, [5000]),
        ("idem_release", 1, ["holder"]),
    ]:
        source = load_script(name).source
        for broken in range(n_keys):
            for wrong in ("a string", "a list"):
                tag = f"{{atomic-{uuid.uuid4().hex[:8]}}}".encode()
                keys = [tag + b":one", tag + b":two", tag + b":three", tag + b":four"][:n_keys]
                if name == "lock_claim":  # held by "tok", so that the claim writes
                    raw.hset(keys[0], mapping={"token": "tok", "owner": "o", "fence": 1})
                if name in ("idem_extend", "idem_release"):
                    raw.hset(keys[0], mapping={"status": "running", "holder": "holder"})
                _break(raw, keys[broken], wrong)
                before = _snapshot(raw, tag)
                try:
                    raw.eval(source, n_keys, *keys, *args)
                except redis.ResponseError as exc:
                    if _snapshot(raw, tag) != before:
                        failures.append(f"{name}, key {broken + 1} {wrong}: wrote, then {exc}")
                raw.delete(*keys)
    assert not failures, "\n".join(failures)


_BAD_ARGS = [  # (script, key names, arguments the adapter never sends)
    ("receive", ("ready", "delayed", "inflight", "data", "notify"), (10, "nan", "t.1", 1000)),
    ("receive", ("ready", "delayed", "inflight", "data", "notify"), (10, "30.0", "t#1", 1000)),
    ("publish", ("ready", "delayed", "data", "seq", "notify"), (b"1", b"4:abcd", "nan")),
    ("publish", ("ready", "delayed", "data", "seq", "notify"), (b"1", b"4:abcd")),
    ("extend", ("inflight", "early"), ("nan", "s#1#t")),
    ("ack", ("inflight", "data", "early"), ("soon", "s#1#t")),
    ("ack", ("inflight", "data", "early"), ("early", "long", 0, "s#1#t")),
    ("ack", ("inflight", "data", "early"), ("early", 120, 5, "s#1#t")),
    ("nack", ("inflight", "ready", "delayed", "notify"), ("s#1#t", "nan")),
    ("publish_dead", ("data", "dead", "dead_info", "dead_ids", "seq"), ("r", "id")),
    ("purge", ("ready", "delayed", "data"), ("many",)),
    ("lock_acquire", ("one", "two"), ("tok", "soon", "host:1")),
    ("lock_claim", ("one", "two", "three", "four"), ("tok", "sched", "noon", 64)),
    ("idem_claim", ("one",), ("holder", "1.5")),
    ("idem_complete", ("one",), ("forever",)),
]


@pytest.mark.parametrize(("name", "names", "args"), _BAD_ARGS)
def test_scripts_refuse_bad_arguments_before_writing(
    adapter: RedisAdapter,
    raw: redis.Redis,
    name: str,
    names: tuple[str, ...],
    args: tuple[Any, ...],
) -> None:
    k, queue, _ = _populated(adapter)
    tag = f"{{{adapter.settings.prefix}:{queue}}}".encode()
    if name.startswith(("lock", "idem")):
        source = load_script(name).source
        keys = [tag + b":" + n.encode() for n in names]
        raw.hset(keys[0], mapping={"token": "tok", "owner": "o", "fence": 1})
    else:
        source = getattr(redis_adapter, f"_{name.upper()}").source
        keys = [getattr(k, n) for n in names]
    before = _snapshot(raw, tag)
    with pytest.raises(redis.ResponseError):
        raw.eval(source, len(keys), *keys, *args)
    assert _snapshot(raw, tag) == before
