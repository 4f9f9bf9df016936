"""Sending a task by name (``app.send``, ``app.signature``): the producer never imports it."""

from __future__ import annotations

import datetime as dt
import json
import uuid
from pathlib import Path

import pytest

import ackwise
from ackwise import App
from ackwise.errors import ConfigurationError, NotSerializable, PublishError
from ackwise.spi import QueueSpec
from ackwise.testing import run_worker


def _apps(tmp_path: Path) -> tuple[App, App, list[tuple[int, int]]]:
    """A producer with no tasks, and a worker's app on the same broker with ``billing.charge``."""
    broker = f"sqlite:///{tmp_path / 'q.db'}"
    producer, consumer = App("front", broker=broker), App("billing", broker=broker)
    calls: list[tuple[int, int]] = []

    @consumer.task(name="billing.charge")
    def charge(order: int, cents: int = 0) -> None:
        calls.append((order, cents))

    return producer, consumer, calls


def _stats(app: App, queue: str) -> ackwise.QueueStats:
    adapter = app.adapter()
    adapter.open()
    try:
        adapter.declare(QueueSpec(queue))
        return adapter.stats(queue)
    finally:
        adapter.close()


def test_a_producer_without_the_task_sends_it_by_name_and_a_worker_runs_it(tmp_path):
    producer, consumer, calls = _apps(tmp_path)
    mid = producer.send("billing.charge", args=[7], kwargs={"cents": 250})
    assert isinstance(mid, str) and len(mid) == 32
    with run_worker(consumer) as w:
        report = w.join(timeout=20)
    assert calls == [(7, 250)]
    assert [e.message_id for e in report.succeeded] == [mid]
    producer.close()


def test_send_many_mixes_signatures_of_tasks_and_of_names(tmp_path):
    producer, consumer, calls = _apps(tmp_path)

    @producer.task(name="front.audit")
    def audit(n: int) -> None:
        calls.append((-n, 0))

    consumer.tasks["front.audit"] = audit  # the worker knows both
    ids = producer.send_many(
        [
            producer.signature("billing.charge", [1]),
            audit.s(2),
            producer.signature("billing.charge", (3,), {"cents": 5}),
        ]
    )
    assert len(set(ids)) == 3
    with run_worker(consumer) as w:
        w.join(timeout=20)
    assert sorted(calls) == [(-2, 0), (1, 0), (3, 5)]
    producer.close()


def test_the_queue_is_the_given_one_else_the_known_tasks_else_the_apps_default(tmp_path):
    broker = f"sqlite:///{tmp_path / 'q.db'}"
    app = App("front", broker=broker, default_queue="front")

    @app.task(name="known", queue="slow")
    def known() -> None: ...

    app.send("known")
    app.send("unknown.here")
    app.send("unknown.here", queue="elsewhere")
    assert [_stats(app, q).ready for q in ("slow", "front", "elsewhere")] == [1, 1, 1]
    app.close()


def test_countdown_and_eta_hold_a_send_by_name_back(tmp_path):
    producer, _, _ = _apps(tmp_path)
    producer.send("billing.charge", args=[1], countdown=30)
    producer.send("billing.charge", args=[2], eta=dt.datetime.now(dt.UTC) + dt.timedelta(hours=1))
    st = _stats(producer, "default")
    assert (st.ready, st.delayed) == (0, 2)
    producer.close()


@pytest.mark.parametrize(
    "name", ["", " billing.charge", "billing.charge\n", "a\x00b", "x" * 256, 42, None]
)
def test_an_invalid_task_name_is_one_clear_error_and_nothing_is_published(tmp_path, name):
    producer, _, _ = _apps(tmp_path)
    with pytest.raises(PublishError) as info:
        producer.send(name)
    message = str(info.value)
    assert "invalid task name" in message and "\n" not in message
    with pytest.raises(PublishError):
        producer.signature(name)
    assert _stats(producer, "default").ready == 0
    producer.close()


def test_one_bad_call_in_send_many_publishes_none_of_them(tmp_path):
    producer, _, _ = _apps(tmp_path)
    with pytest.raises(NotSerializable):
        producer.send_many(
            [
                producer.signature("billing.charge", [1]),
                producer.signature("billing.charge", [{1, 2}]),
            ]
        )
    assert _stats(producer, "default").ready == 0
    producer.close()


def test_a_name_no_worker_knows_is_dead_lettered_unknown_task_not_lost(tmp_path):
    producer, consumer, calls = _apps(tmp_path)
    mid = producer.send("billing.refund", args=[1])
    with run_worker(consumer) as w:
        report = w.join(timeout=20)
    assert calls == []
    assert [(e.message_id, e.info["reason"]) for e in report.dead_lettered] == [
        (mid, "unknown_task")
    ]
    [letter] = _dead_letters(producer)
    assert (letter.message_id, letter.reason) == (mid, "unknown_task")
    assert json.loads(letter.body)["task"] == "billing.refund"
    producer.close()


def _dead_letters(app: App) -> list[ackwise.DeadLetter]:
    adapter = app.adapter()
    adapter.open()
    try:
        return list(adapter.dead_letters("default"))
    finally:
        adapter.close()


def test_the_message_names_the_task_as_sent(tmp_path):
    producer, _, _ = _apps(tmp_path)
    name = f"reports.{uuid.uuid4().hex}.build"
    mid = producer.send(name, args=[1, "a"], kwargs={"k": None})
    adapter = producer.adapter()
    adapter.open()
    try:
        [d] = adapter.receive("default", max_messages=1, wait=0, lease=5)
    finally:
        adapter.close()
    body = json.loads(d.body)
    assert (body["id"], body["task"], body["args"], body["kwargs"]) == (
        mid,
        name,
        [1, "a"],
        {"k": None},
    )
    producer.close()


def test_a_periodic_signature_by_name_needs_the_task_registered(tmp_path):
    producer, consumer, _ = _apps(tmp_path)
    p = consumer.periodic(consumer.signature("billing.charge", [9]), every=60, name="nightly")
    assert (p.task, p.args) == ("billing.charge", (9,))
    with pytest.raises(ConfigurationError, match=r"no task named 'billing\.refund'"):
        producer.periodic(producer.signature("billing.refund"), every=60)
