"""The suite's moto server changes moto's speed, never its answers.

``ackwise_sqs._moto_server`` replaces some of moto's SQS bookkeeping with versions whose
cost does not grow with the queue's depth.  Each replacement is checked here against moto's own
code on generated queues (messages visible, in flight, delayed, at the exact boundaries; receipt
handles current, old and unknown; a handle index that is right, stale or missing) at a frozen
clock.  The moto classes of this process are not
patched: both versions are called side by side.
"""

from __future__ import annotations

import contextlib
import itertools
from collections.abc import Iterator
from typing import Any
from unittest import mock

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ackwise_sqs import _moto_server as moto_server

models = pytest.importorskip("moto.sqs.models")

NOW_MS = 1_800_000_000_000.0  # a fixed instant, in moto's milliseconds
_ids = itertools.count()

offsets = st.one_of(st.sampled_from([0.0, -1.0, 1.0, -0.5, 0.5]), st.floats(-5e6, 5e6))


@st.composite
def messages(draw: st.DrawFn) -> Any:
    m = models.Message(f"m{next(_ids)}", "body")
    m.visible_at = draw(st.one_of(st.just(0.0), offsets.map(lambda x: NOW_MS + x)))
    m.delayed_until = draw(st.one_of(st.just(0.0), offsets.map(lambda x: NOW_MS + x)))
    m.sent_timestamp = int(NOW_MS + draw(st.integers(-(10**9), 0)))
    for _ in range(draw(st.integers(0, 3))):
        m.mark_received(visibility_timeout=0)  # a new handle; the old ones stay known
    return m


queues = st.lists(messages(), max_size=30)


def _originals() -> dict[str, tuple[Any, Any]]:
    return {name: (orig, fast) for name, orig, fast in moto_server.replacements()}


def _call(impl: Any, obj: Any, *args: Any) -> Any:
    return impl.fget(obj) if isinstance(impl, property) else impl(obj, *args)


@contextlib.contextmanager
def frozen() -> Iterator[None]:
    """moto's clock (the module's unix_time / unix_time_millis) stopped at NOW_MS."""
    with (
        mock.patch.object(models, "unix_time_millis", lambda dt=None: NOW_MS),
        mock.patch.object(models, "unix_time", lambda dt=None: NOW_MS / 1000.0),
    ):
        yield


def _queue(backend: Any, retention: int = 345_600) -> Any:
    return backend.create_queue(f"q{next(_ids)}", MessageRetentionPeriod=str(retention))


def test_every_replacement_is_checked_here() -> None:
    assert set(_originals()) == {
        "Message.had_receipt_handle",
        "Message.mark_received",
        "Queue.delete_message",
        "Queue.messages",
        "Queue.approximate_number_of_messages",
        "Queue.approximate_number_of_messages_delayed",
        "Queue.approximate_number_of_messages_not_visible",
        "SQSBackend.is_message_valid_based_on_retention_period",
    }


@settings(max_examples=300, deadline=None)
@given(msgs=queues)
def test_visible_messages_and_counts_match_motos_own(msgs: list[Any]) -> None:
    backend = models.SQSBackend("us-east-1", "123456789012")
    queue = _queue(backend)
    queue._messages = list(msgs)
    impls = _originals()
    with frozen():
        for name in (
            "Queue.messages",
            "Queue.approximate_number_of_messages",
            "Queue.approximate_number_of_messages_delayed",
            "Queue.approximate_number_of_messages_not_visible",
        ):
            orig, fast = impls[name]
            assert _call(fast, queue) == _call(orig, queue), name


@settings(max_examples=300, deadline=None)
@given(msgs=st.lists(messages(), min_size=1, max_size=10), data=st.data())
def test_receipt_handle_lookup_matches_motos_own(msgs: list[Any], data: st.DataObject) -> None:
    orig, fast = _originals()["Message.had_receipt_handle"]
    known = [h for m in msgs for h in m.all_receipt_handles if h is not None]
    unknown = st.just("unknown-handle")
    handle = data.draw(st.one_of(st.sampled_from(known), unknown) if known else unknown)
    for m in msgs:
        assert fast(m, handle) == orig(m, handle)


@settings(max_examples=300, deadline=None)
@given(
    retention=st.integers(60, 1_209_600),
    age=st.one_of(st.sampled_from([0, 1, -1]), st.integers(-(10**6), 10**6)),
)
def test_retention_check_matches_motos_own(retention: int, age: int) -> None:
    backend = models.SQSBackend("us-east-1", "123456789012")
    queue = _queue(backend, retention)
    m = models.Message(f"m{next(_ids)}", "body")
    # age milliseconds past the end of the retention period (negative: still within it)
    m.sent_timestamp = int(NOW_MS - retention * 1000 - age)
    orig, fast = _originals()["SQSBackend.is_message_valid_based_on_retention_period"]
    with frozen():
        assert fast(backend, queue.name, m) == orig(backend, queue.name, m)


@st.composite
def delete_cases(draw: st.DrawFn) -> Any:
    """A queue's messages as (id, handles, pending), handles to delete, and the index's view."""
    n = draw(st.integers(0, 8))
    specs = [
        (f"m{i}", [f"h{i}-{j}" for j in range(draw(st.integers(0, 3)))], draw(st.booleans()))
        for i in range(n)
    ]
    handles = [h for _, hs, _ in specs for h in hs]
    pool = st.one_of(st.sampled_from(handles), st.just("unknown")) if handles else st.just("x")
    deletes = draw(st.lists(pool, max_size=6))
    # The index may know a handle (right), point it at a message of another queue, or miss it.
    index = {h: draw(st.sampled_from(["right", "elsewhere", "missing"])) for h in handles}
    return specs, deletes, index


def _build(specs: list[tuple[str, list[str], bool]]) -> Any:
    backend = models.SQSBackend("us-east-1", "123456789012")
    queue = _queue(backend)
    for mid, handles, pending in specs:
        m = models.Message(mid, "body")
        if handles:
            m._old_receipt_handles = [None, *handles[:-1]]
            m.receipt_handle = handles[-1]
        queue._messages.append(m)
        if pending:
            queue.pending_messages.add(m)
    return queue


def _state(queue: Any) -> Any:
    return (
        [m.id for m in queue._messages],
        sorted(m.id for m in queue.pending_messages),
        sorted(str(h) for h in queue.deleted_messages),
    )


@settings(max_examples=400, deadline=None)
@given(case=delete_cases())
def test_delete_by_handle_matches_motos_own(case: Any) -> None:
    specs, deletes, index = case
    orig, fast = _originals()["Queue.delete_message"]
    mine, theirs = _build(specs), _build(specs)
    other = _build(specs)  # the same handles on another queue's messages
    saved = dict(moto_server._BY_HANDLE)
    try:
        moto_server._BY_HANDLE.clear()
        for h, where in index.items():
            source = {"right": mine, "elsewhere": other}.get(where)
            if source is not None:
                moto_server._BY_HANDLE[h] = next(
                    m for m in source._messages if h in m.all_receipt_handles
                )
        for h in deletes:
            outcomes = []
            for impl, queue in ((fast, mine), (orig, theirs)):
                try:
                    impl(queue, h)
                    outcomes.append("ok")
                except Exception as exc:
                    outcomes.append(type(exc).__name__)
            assert outcomes[0] == outcomes[1], (h, outcomes)
            assert _state(mine) == _state(theirs), h
    finally:
        moto_server._BY_HANDLE.clear()
        moto_server._BY_HANDLE.update(saved)


@settings(max_examples=100, deadline=None)
@given(visibility=st.one_of(st.none(), st.integers(0, 43_200)), receives=st.integers(1, 4))
def test_receiving_records_the_handle_and_changes_what_motos_own_does(
    visibility: int | None, receives: int
) -> None:
    orig, fast = _originals()["Message.mark_received"]
    mine, theirs = models.Message("m", "body"), models.Message("m", "body")
    for i in range(receives):
        handle = f"h{i}"
        for impl, m in ((fast, mine), (orig, theirs)):
            with frozen(), mock.patch.object(models, "generate_receipt_handle", lambda h=handle: h):
                impl(m, visibility_timeout=visibility)
        assert vars(mine) == vars(theirs)
        assert moto_server._BY_HANDLE.get(f"h{i}") is mine


def test_request_routing_keeps_motos_answers() -> None:
    """moto's module list and host -> backend routing, kept instead of worked out per request."""
    from moto.moto_server.werkzeug_app import DomainDispatcherApplication

    modules = moto_server.ORIGINALS["backends.list_of_moto_modules"]
    assert moto_server._list_of_moto_modules() == tuple(modules())
    route = moto_server.ORIGINALS["DomainDispatcherApplication.get_backend_for_host"]
    app = DomainDispatcherApplication(lambda service: None)
    hosts = [
        None,
        "moto_api",
        "sqs",
        "127.0.0.1:5000",
        "localhost",
        "sqs.us-east-1.amazonaws.com",
        "sqs.eu-west-1.amazonaws.com",
        "s3.amazonaws.com",
    ]
    for host in hosts * 2:  # the second round answers from the kept routes
        assert moto_server._get_backend_for_host(app, host) == route(app, host), host


_RETAINED = """
import gc, weakref, sys
from moto.sqs import models
from ackwise_sqs import _moto_server
if sys.argv[1] == "patched":
    _moto_server.patch()
backend = models.SQSBackend("us-east-1", "123456789012")
queue = backend.create_queue("q")
sent = [backend.send_message("q", f"body {i}") for i in range(50)]
refs = [weakref.ref(m) for m in sent]
got = backend.receive_message("q", 10, 0, 30)
for m in got:
    backend.delete_message("q", m.receipt_handle)
backend.delete_queue("q")
del sent, got, queue
gc.collect()
print(sum(r() is not None for r in refs))
"""


@pytest.mark.parametrize(("mode", "retained"), [("stock", "50"), ("patched", "0")])
def test_the_server_keeps_no_message_it_no_longer_holds(mode: str, retained: str) -> None:
    """moto tracks every queue and message it ever created (for its dashboard) and never lets one
    go: in a long run its server's full garbage collections walked ~40,000 dead messages and
    stalled every request (CI: the renewals of two crash cases went stale in the same second)."""
    import subprocess
    import sys

    out = subprocess.run(
        [sys.executable, "-c", _RETAINED, mode], capture_output=True, text=True, check=True
    )
    assert out.stdout.strip() == retained, out.stderr
