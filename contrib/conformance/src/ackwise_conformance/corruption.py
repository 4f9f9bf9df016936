"""Storage corruption: malformed records among valid messages must not cost a valid one.

An adapter's own test writes records straight into the broker's storage (its keys, rows or
queues) and lets :func:`drain_among_corrupt` do the rest: valid tasks of every delivery mode
are published around the records, a real worker (threads pool, in this process) drains the
queue, and the outcome is checked:

- every valid message ran exactly once, in every mode (no fault is injected);
- every corrupt record ended in the dead-letter store with a reason, its bytes kept as
  written where the adapter's test says what they are;
- the dead-letter store holds nothing else, and the worker never stopped.

Used with hypothesis, one example per queue::

    @given(st.lists(records(), min_size=1, max_size=4))
    @settings(max_examples=15, deadline=None)
    def test_corrupt_records_never_cost_a_valid_message(url, records):
        drain_among_corrupt(url, records, write=lambda queue, record: ...)
"""

from __future__ import annotations

import collections
import logging
import threading
import time
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

from ackwise import Ack, App, DeadLetter, open_adapter
from ackwise.errors import AdapterError
from ackwise.spi import QueueSpec
from ackwise.testing import InProcessWorker

__all__ = ["REASONS", "CorruptionOutcome", "drain_among_corrupt"]

T = TypeVar("T")

log = logging.getLogger(__name__)

#: Dead-letter reasons a malformed record may end with: its framing is broken
#: (``corrupt_record``), or it is framed but its body is no envelope (``decode_error``), or it
#: is an envelope that no task of the workload could run.
REASONS = frozenset({"corrupt_record", "decode_error", "unknown_envelope_version", "unknown_task"})


@dataclass
class CorruptionOutcome:
    """What one drain left behind, for checks of the adapter's own."""

    queue: str
    valid: dict[str, Ack]  # message id -> mode
    runs: collections.Counter[str]  # message id -> executions
    dead: list[DeadLetter]


def drain_among_corrupt(
    url: str,
    records: Sequence[T],
    write: Callable[[str, T], bytes | None],
    *,
    valid_between: int = 2,
    reasons: frozenset[str] = REASONS,
    lease: float = 5.0,
    timeout: float = 30.0,
) -> CorruptionOutcome:
    """Publish valid tasks with ``records`` written among them; drain; check the outcome.

    :param url: the broker.  A queue of its own is declared for this call and deleted after
        (:meth:`~ackwise.Adapter.delete_queue`; an adapter without its own ``delete_queue``
        gets the default, which empties the queue and its dead letters, and one whose
        ``delete_queue`` fails leaves the queue behind, as a conformance case does).  Its
        worker announces itself to an in-process registry: nothing of it is left on the broker.
    :param write: writes one record into the storage of the queue it is given, the way a
        foreign or broken writer would; returns the bytes the record's dead letter must
        carry, or ``None`` when that cannot be said (e.g. a record with no body at all).
    :param valid_between: valid tasks published before each record and after the last.
    :raises AssertionError: naming what went wrong.
    """
    queue = f"corrupt-{uuid.uuid4().hex[:12]}"
    runs: collections.Counter[str] = collections.Counter()
    lock = threading.Lock()
    app = App(
        f"corruption-{queue}",
        broker=url,
        default_queue=queue,
        worker_registry=f"memory://{queue}",
    )
    tasks: dict[Ack, Any] = {}
    for mode in Ack:

        def run(ctx: Any, n: int) -> None:
            with lock:
                runs[ctx.id] += 1

        tasks[mode] = app.task(name=f"corruption.{mode.value}", ack=mode, bind=True)(run)
    adapter = open_adapter(url)
    adapter.open()
    valid: dict[str, Ack] = {}
    expected_bodies: list[bytes] = []
    modes = list(Ack)
    worker: InProcessWorker | None = None
    try:
        adapter.declare(QueueSpec(queue))

        def publish_valid(count: int) -> None:
            for _ in range(count):
                mode = modes[len(valid) % len(modes)]
                mid = tasks[mode].delay(len(valid))
                valid[mid] = mode

        for record in records:
            publish_valid(valid_between)
            body = write(queue, record)
            if body is not None:
                expected_bodies.append(body)
        publish_valid(valid_between)

        worker = InProcessWorker(app, queues=[queue], concurrency=2, lease=lease).start()
        deadline = time.monotonic() + timeout
        dead: list[DeadLetter] = []
        while True:
            with lock:
                done = all(runs[mid] >= 1 for mid in valid)
            dead = list(adapter.dead_letters(queue, limit=10_000))
            stats = adapter.stats(queue)
            settled = stats.ready == 0 and stats.in_flight == 0 and worker.worker.held == 0
            if done and settled and len(dead) >= len(records):
                break
            _alive(worker)
            if time.monotonic() >= deadline:
                with lock:
                    missing = sorted(mid for mid in valid if not runs[mid])
                raise AssertionError(
                    f"queue {queue} not drained after {timeout:.0f}s: {len(missing)} valid "
                    f"message(s) never ran {missing[:5]}, {len(dead)} of {len(records)} corrupt "
                    f"record(s) dead-lettered; broker says {stats}"
                )
            time.sleep(0.02)
        time.sleep(0.1)  # anything that should not happen has its chance
        _alive(worker)
        dead = list(adapter.dead_letters(queue, limit=10_000))
        with lock:
            twice = {mid: n for mid, n in runs.items() if n > 1}
            strangers = sorted(set(runs) - set(valid))
        assert not twice, f"valid messages ran more than once (no fault was injected): {twice}"
        assert not strangers, f"messages nobody published as valid ran: {strangers}"
        valid_dead = [d for d in dead if d.message_id in valid]
        assert not valid_dead, "valid messages were dead-lettered: " + ", ".join(
            f"{d.message_id} ({d.reason})" for d in valid_dead
        )
        assert len(dead) == len(records), (
            f"{len(records)} corrupt record(s) written, {len(dead)} dead letter(s): "
            + ", ".join(f"{d.message_id}:{d.reason}:{d.body[:40]!r}" for d in dead)
        )
        odd = [d for d in dead if d.reason not in reasons]
        assert not odd, "unexpected dead-letter reasons: " + ", ".join(
            f"{d.message_id}: {d.reason}" for d in odd
        )
        bodies = collections.Counter(d.body for d in dead)
        unmatched = collections.Counter(expected_bodies) - bodies
        assert not unmatched, (
            f"dead letters do not keep the corrupt records byte for byte: missing "
            f"{list(unmatched)[:3]!r}; stored {[d.body[:60] for d in dead][:5]!r}"
        )
        status = worker.stop()
        worker = None
        assert status == 0, f"the worker stopped with status {status}"
        with lock:
            counted = collections.Counter(runs)
        return CorruptionOutcome(queue, valid, counted, dead)
    finally:
        if worker is not None:
            worker.worker.request_stop(cold=True)
            worker.stop()
        try:
            adapter.delete_queue(queue)
        except AdapterError as exc:
            log.warning("could not delete queue %s (it is left on the broker): %s", queue, exc)
        finally:
            adapter.close()
            app.close()


def _alive(worker: InProcessWorker) -> None:
    if worker.error is not None:
        raise AssertionError(f"the worker stopped on {worker.error!r}") from worker.error
    assert worker.is_alive(), "the worker stopped"
