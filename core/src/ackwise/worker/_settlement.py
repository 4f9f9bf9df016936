"""Carrying out what :func:`settle` decided: the only module that settles with the broker.

:class:`Settler` turns each :data:`Settlement` into adapter calls (``ack_before_start``,
``ack``, ``nack``, ``publish`` of a retry, ``dead_letter`` / ``publish_dead``), keeps the late
acks of successes that wait to share one broker call, writes the attempt history a retry or
a dead letter carries, reports stale receipts and emits the events of all of it.  For tasks
that store results it writes each final record first: a success's with its pending ack (the
results, then the acks), a dead letter's before the dead-letter call (docs/results.md).
Each settlement is a list of steps (:mod:`ackwise.worker._unsettled`): a broker error keeps what
is left of it for :meth:`Settler.flush` after the reconnect.
"""

from __future__ import annotations

import dataclasses
import logging
import time
from collections.abc import Sequence

from ackwise.app._execution import Result
from ackwise.app._followups import CHORD, follow_up, in_workflow, with_attempt
from ackwise.contract import _envelope
from ackwise.contract._semantics import (
    AckMessage,
    DeadLetterMessage,
    Hold,
    LostMessage,
    NackMessage,
    Outcome,
    RetryMessage,
    Settlement,
    settle,
)
from ackwise.contract._spi import Adapter, Delivery, LeaseExtension, Outgoing, QueueSpec
from ackwise.errors import StaleReceipt, TransientAdapterError
from ackwise.stores._results import ResultState, ResultStore, TaskResult
from ackwise.worker._events import DeadLettered, Events, Lost, Retried, Returned, Stale
from ackwise.worker._holdings import Held, WorkerCounters
from ackwise.worker._unsettled import Backlog, Moot, Step, Unsettled, loses, original_settled

log = logging.getLogger("ackwise.worker")

__all__ = ["ACK_BATCH", "ACK_DELAY", "ACK_DELAY_BATCHED", "Settler", "whole_batches"]

#: Late acks of successful tasks are sent together: at most this many, or this many seconds old.
ACK_BATCH = 64
ACK_DELAY = 0.005
#: ... on a broker with a per-request limit (Capabilities.max_batch: SQS), where every request
#: is a round trip (and billed): acks wait longer to fill whole requests while tasks keep
#: finishing.  They still go at once when nothing runs.
ACK_DELAY_BATCHED = 0.05


def whole_batches(n: int, batch: int) -> int:
    """``n`` rounded down to whole broker requests of ``batch`` (``n`` itself below one)."""
    return n if n < batch else n - n % batch


class Settler:
    """Settles deliveries with ``adapter`` for one worker.

    :param batch: messages per broker request (``Capabilities.max_batch``, else 1): late acks
        are sent in whole requests.
    """

    def __init__(
        self,
        adapter: Adapter,
        events: Events,
        counters: WorkerCounters,
        worker_id: str,
        *,
        batch: int = 1,
        push_window: bool = False,
        results: ResultStore | None = None,
    ) -> None:
        self.adapter = adapter
        #: Where the records of tasks that store results go (``None``: no task does).
        self.results = results
        #: Records of successes whose acks are pending: written before those acks.
        self.pending_results: list[TaskResult] = []
        #: Queues this worker declared to publish a chain's next step to.
        self._declared: set[str] = set()
        self.events = events
        self.counters = counters
        self.worker_id = worker_id
        self.batch = batch
        self.push_window = push_window
        self.ack_delay = ACK_DELAY if batch == 1 else ACK_DELAY_BATCHED
        #: Successes' late acks not sent yet, and when they are due at the latest.
        self.pending: list[Delivery] = []
        self.due = 0.0
        #: Settlements a broker error cut short: :meth:`flush` goes on with them.
        self.unsettled = Backlog()
        #: A delivery ends with its connection (RabbitMQ): after a reconnect the broker has
        #: every unsettled one back, and delivers it again.
        self._connection_leases = adapter.capabilities.lease_extension is LeaseExtension.CONNECTION

    # -- settlements -----------------------------------------------------------------------
    def carry_out(
        self,
        decision: Settlement,
        d: Delivery,
        task: str | None,
        env: _envelope.Envelope | None,
        *,
        label: str,
        error: str | None = None,
        traceback: str | None = None,
        keep: bool = False,
    ) -> None:
        """Do what ``decision`` says about ``d``; ``label`` names the outcome in events.

        :param keep: a broker error keeps the steps not done yet for :meth:`flush` after the
            reconnect (the caller holds the delivery no more), before it is raised.
        """
        steps = self._steps(decision, d, task, env, label, error, traceback)
        self.unsettled.carry(Unsettled(d, task, steps, loses(decision)), keep=keep)

    def _steps(
        self,
        decision: Settlement,
        d: Delivery,
        task: str | None,
        env: _envelope.Envelope | None,
        label: str,
        error: str | None,
        traceback: str | None,
    ) -> list[Step]:
        """The broker calls of ``decision`` about ``d``, in order."""
        if isinstance(decision, AckMessage):
            if decision.batch:
                return [lambda again: self._queue_ack(d)]
            return [self._reporting_stale("ack", lambda again: self.adapter.ack([d]))]
        if isinstance(decision, NackMessage):

            def nack(again: bool) -> None:
                if again and self._given_back(decision, d, "returned"):
                    raise Moot
                self.adapter.nack(d, delay=decision.delay)
                self.counters.returned += 1
                self.events.emit(Returned(task, *_where(d), reason=label, delay=decision.delay))

            return [self._reporting_stale("nack", nack)]
        if isinstance(decision, RetryMessage):
            assert env is not None, "a retry republishes the envelope"
            return self._retry(decision, d, task, env, error, traceback)
        if isinstance(decision, DeadLetterMessage):
            return [
                lambda again: self._dead_letter(decision, d, task, env, error or label, traceback)
            ]
        if isinstance(decision, LostMessage):

            def lost(again: bool) -> None:
                self.counters.lost += 1
                self.events.emit(Lost(task, *_where(d), reason=decision.reason))

            return [lost]
        assert isinstance(decision, Hold)
        return []

    def _reporting_stale(self, operation: str, step: Step) -> Step:
        """``step``, its stale receipt reported, not raised."""

        def reporting(again: bool) -> None:
            try:
                step(again)
            except StaleReceipt as exc:
                self.report_stale(exc, operation)

        return reporting

    def _given_back(self, decision: Settlement, d: Delivery, what: str) -> bool:
        """After a reconnect: whether what is left of ``decision`` about ``d`` is moot.

        So it is for a retry or a return (``nack``) of a delivery that ended with its
        connection (RabbitMQ): the broker has the message back already and delivers it
        again, which is what the decision asked for, less its delay (a retry published too
        would run it twice, and the original's ack would be a stale receipt).  A success's
        ack, or a dead letter, is still sent: its stale receipt says that the message will
        run again.
        """
        if not (
            self._connection_leases
            and isinstance(decision, RetryMessage | NackMessage)
            and not original_settled(decision)
        ):
            return False
        log.info(
            "message %s (queue %s): not %s after the reconnect: the broker has it back (its "
            "delivery ended with the connection) and delivers it again",
            d.message_id,
            d.queue,
            what,
        )
        return True

    def settle_held(
        self,
        h: Held,
        outcome: Outcome,
        *,
        label: str,
        result: Result | None = None,
        retry_delay: float | None = None,
        reason: str | None = None,
        detail: str | None = None,
        keep: bool = False,
    ) -> None:
        """Ask :func:`settle` about a held delivery and have its answer carried out.

        :param keep: as :meth:`carry_out`'s.
        """
        decision = settle(
            h.task.ack,
            outcome,
            attempt=h.delivery.attempt,
            max_deliveries=h.task.max_deliveries,
            retry_delay=retry_delay,
            reason=reason,
        )
        d = h.delivery

        def before(again: bool) -> None:
            """What goes before the delivery is settled: what follows it in a workflow (a
            chord's count, a chain's next step: before this one's ack too), the result record
            (docs/workflows.md, docs/results.md)."""
            what = "retried" if isinstance(decision, RetryMessage) else "returned"
            if again and self._given_back(decision, d, what):
                raise Moot
            stores = self.results is not None and h.task.store_results
            workflow = in_workflow(h.envelope)
            if not (stores or workflow):
                return
            record = _record(h, outcome, decision, result, detail)
            if record is None:
                return  # retried or returned: not finished, nothing follows yet
            if workflow:
                self._follow_up(h, record)
            if self.results is not None and stores:
                if isinstance(decision, AckMessage) and decision.batch:
                    self.pending_results.append(record)  # written with the ack (flush)
                else:
                    self.results.put([record])

        steps = self._steps(
            decision,
            d,
            h.task.name,
            h.envelope,
            label,
            result.error if result else detail,
            result.traceback if result else None,
        )
        self.unsettled.carry(
            Unsettled(d, h.task.name, [before, *steps], loses(decision)), keep=keep
        )

    def _follow_up(self, h: Held, record: TaskResult) -> None:
        """What follows a finished call in a workflow (:func:`follow_up`), published here."""
        if CHORD in h.envelope.headers and self.results is None:
            log.error(
                "chord member %s (%s) finished, but app has no result store: the chord "
                "cannot count it; set App(result_store=URL)",
                h.task.name,
                h.delivery.message_id,
            )
        follow_up(
            h.envelope, h.task.name, h.delivery.message_id, record, self.results, self._publish_to
        )

    def _priority(self, env: _envelope.Envelope | None) -> int:
        """The priority a message sent again keeps (0 where the broker has none: a message
        from a producer on another broker is not refused for its priority)."""
        if env is None or not self.adapter.capabilities.priorities:
            return 0
        return env.priority

    def _publish_to(self, queue: str, out: Outgoing) -> None:
        if out.priority and not self.adapter.capabilities.priorities:
            out = dataclasses.replace(out, priority=0)
        if queue not in self._declared:
            self.adapter.declare(QueueSpec(queue))
            self._declared.add(queue)
        self.adapter.publish(queue, [out])

    def ack_starting(self, batch: Sequence[Held]) -> tuple[set[int], set[int]]:
        """Ack what :func:`settle` says to ack as ``batch`` starts (at most once).

        Returns the ids of the deliveries acked and of those whose receipt was stale.
        """
        early = [
            h.delivery
            for h in batch
            if isinstance(
                settle(
                    h.task.ack,
                    Outcome.STARTING,
                    attempt=h.delivery.attempt,
                    max_deliveries=h.task.max_deliveries,
                ),
                AckMessage,
            )
        ]
        stale = self.ack_before_start(early)
        return {id(d) for d in early}, stale

    def reject(
        self, d: Delivery, reason: str, detail: str, env: _envelope.Envelope | None = None
    ) -> None:
        """Dead-letter a delivery that cannot become a task (the body kept as it is).

        The task log's ``dead_lettered`` line says why (``detail``).
        """
        decision = settle(
            None, Outcome.REJECTED, attempt=d.attempt, max_deliveries=1, reason=reason
        )
        self.carry_out(decision, d, None, env, label=reason, error=detail)

    def record_dead(self, d: Delivery, task: str, reason: str, detail: str) -> None:
        """Write the dead record of a message dead-lettered before it became a task (an
        unknown task), where there is a result store: a handle on it ends now, not at its
        timeout.  The caller decides whether the app stores such records."""
        if self.results is not None:
            self.results.put(
                [
                    TaskResult(
                        id=d.message_id,
                        state=ResultState.DEAD.value,
                        task=task,
                        attempt=d.attempt,
                        at=time.time(),
                        error=detail,
                        reason=reason,
                    )
                ]
            )

    def ack_before_start(self, deliveries: Sequence[Delivery]) -> set[int]:
        """Early-ack ``deliveries`` (at most once); return the ids of the stale ones."""
        if not deliveries:
            return set()
        try:
            self.adapter.ack_before_start(deliveries)
        except StaleReceipt as exc:
            self.report_stale(exc, "early ack")
            return {id(d) for d in exc.deliveries}
        return set()

    def _retry(
        self,
        decision: RetryMessage,
        d: Delivery,
        task: str | None,
        env: _envelope.Envelope,
        error: str | None,
        traceback: str | None,
    ) -> list[Step]:
        """Publish the retry, then ack the original: a crash in between duplicates, never
        loses.  A broker error in the publish publishes it after the reconnect; one in the
        ack acks it then (the retry is not published twice)."""
        # A failure's retry is recorded as "retry" (it counts against max_retries); a wait
        # for a busy idempotency key as "key_busy" (it does not).
        new = self._annotated(env, d, "retry" if decision.counts else "key_busy", error, traceback)
        new.eta = time.time() + decision.delay if decision.delay else None
        out = Outgoing(env.id, _envelope.encode(new), decision.delay, self._priority(env))

        def publish(again: bool) -> None:
            if again and self._given_back(decision, d, "retried"):
                raise Moot
            self.adapter.publish(d.queue, [out])
            if decision.counts:
                self.counters.retried += 1
                self.events.emit(Retried(task, *_where(d), delay=decision.delay, error=error))
            else:
                self.events.emit(
                    Returned(task, *_where(d), reason="idempotency_busy", delay=decision.delay)
                )

        if decision.original_settled:
            return [publish]
        return [publish, self._reporting_stale("ack", lambda again: self.adapter.ack([d]))]

    def _dead_letter(
        self,
        decision: DeadLetterMessage,
        d: Delivery,
        task: str | None,
        env: _envelope.Envelope | None,
        error: str | None,
        traceback: str | None,
    ) -> None:
        body = None
        if env is not None:
            body = _envelope.encode(self._annotated(env, d, decision.reason, error, traceback))
        try:
            if decision.original_settled:
                dead = Outgoing(d.message_id, body or d.body, priority=self._priority(env))
                self.adapter.publish_dead(d.queue, [dead], reason=decision.reason)
            else:
                self.adapter.dead_letter(d, reason=decision.reason, body=body)
        except StaleReceipt as exc:  # the lease moved on: the message is another's now
            self.report_stale(exc, "dead_letter")
            return
        self.counters.dead_lettered += 1
        by_reason = self.counters.by_reason
        by_reason[decision.reason] = by_reason.get(decision.reason, 0) + 1
        name = task if task is not None else (env.task if env is not None else None)
        self.events.emit(DeadLettered(name, *_where(d), reason=decision.reason, error=error))

    def _annotated(
        self,
        env: _envelope.Envelope,
        d: Delivery,
        outcome: str,
        error: str | None,
        traceback: str | None,
    ) -> _envelope.Envelope:
        return with_attempt(env, d.attempt, outcome, error, traceback, self.worker_id)

    # -- late acks of successes, batched ---------------------------------------------------
    def _queue_ack(self, d: Delivery) -> None:
        if not self.pending:
            self.due = time.monotonic() + self.ack_delay
        self.pending.append(d)

    def before_receive(self) -> None:
        """The loop is about to ask the broker for more: send the pending acks first, where
        the broker counts them in the worker's window (``Capabilities.push_window``) or where
        every request is a round trip that may take long (``max_batch``: SQS).

        RabbitMQ counts the message of an unsent ack in the window; asking for the room the
        ack freed would grow the window past the prefetch budget (C18: more duplicates than
        two windows).  On SQS a ReceiveMessage that botocore retries, or a slow endpoint,
        can outlast what is left of a pending ack's lease, and nothing renews a completed
        task's lease: its ack then finds the receipt stale and the task runs again (C18 on
        SQS under load).  Elsewhere an extra ack call per receive only costs (Redis drain at
        concurrency 8: 0.94x).
        """
        if self.pending and (self.push_window or self.batch > 1):
            self.flush()

    def flush(self, keep: int = 0) -> None:
        """Go on with the settlements a broker error cut short (after the reconnect), then
        send the pending late acks but the last ``keep``, which stay pending; every pending
        result is written first."""
        self.unsettled.resume()
        if self.pending_results:
            assert self.results is not None
            self.results.put(self.pending_results)  # raises: kept for after reconnecting
            self.pending_results = []
        if not self.pending:
            return
        cut = len(self.pending) - keep
        batch = self.pending[:cut]
        del self.pending[:cut]
        try:
            self.adapter.ack(batch)
        except StaleReceipt as exc:
            self.report_stale(exc, "ack")
        except TransientAdapterError:
            self.pending[:0] = batch  # settle them after reconnecting
            raise

    def flush_due(self, now: float, *, at_once: bool, budget: int) -> None:
        """Send pending acks that are due: all when old enough or ``at_once`` (nothing runs, a stop is under way); else whole
        broker requests once they hold half the ``budget``.

        Unsent acks still hold their slots in a broker's window (RabbitMQ's ``basic.qos``)
        and are messages that may still run again: they never wait past that.
        """
        if not self.pending:
            return
        if now >= self.due or at_once:
            self.flush()
            return
        n = len(self.pending)
        if n >= whole_batches(max(1, min(ACK_BATCH, budget // 2)), self.batch):
            # Whole requests where one is full; the rest waits for more (or its delay).
            self.flush(keep=n - whole_batches(n, self.batch))
            if self.pending:
                self.due = now + self.ack_delay

    def drop_unsettled(self) -> None:
        """The worker stops (a cold stop: it gave up on its broker) with settlements a broker
        error cut short.  A message acked as it started whose retry or dead letter was not
        published yet is lost, and counted so; the others are still at the broker and come
        back when their lease runs out."""
        for u in self.unsettled.drop():
            d = u.delivery
            log.warning(
                "message %s (queue %s): its settlement was not carried out (the broker could "
                "not be reached)%s",
                d.message_id,
                d.queue,
                ": it is lost" if u.lost_if_dropped else "; it comes back when its lease runs out",
            )
            if u.lost_if_dropped:
                self.counters.lost += 1
                self.events.emit(Lost(u.task, *_where(d), reason="broker_unreachable"))

    # -- reports ---------------------------------------------------------------------------
    def report_stale(self, exc: StaleReceipt, operation: str) -> None:
        """Count and report receipts the broker refused (the task log says what it means).

        An early ack asked again after a broker error may have gone through the first time
        (the answer was lost): the broker cannot always tell that from a lease gone, and the
        task log's ``stale receipt`` line of an ``early ack`` says so.
        """
        self.counters.stale += len(exc.deliveries)
        for d in exc.deliveries:
            self.events.emit(Stale(None, *_where(d), operation=operation))


def _record(
    h: Held, outcome: Outcome, decision: Settlement, result: Result | None, detail: str | None
) -> TaskResult | None:
    """The result record a settlement writes, if any: successes, dead letters, losses."""
    d = h.delivery

    def record(state: ResultState, **fields: str | None) -> TaskResult:
        return TaskResult(
            id=d.message_id,
            state=state.value,
            task=h.task.name,
            attempt=d.attempt,
            at=time.time(),
            **fields,
        )

    if outcome is Outcome.SUCCEEDED:
        return record(ResultState.SUCCEEDED, value=result.value if result is not None else None)
    text = result.error if result is not None else detail
    trace = result.traceback if result is not None else None
    if isinstance(decision, DeadLetterMessage):
        if decision.reason == "failed":
            return record(ResultState.FAILED, error=text or "failed", traceback=trace)
        return record(
            ResultState.DEAD, error=text or decision.reason, traceback=trace, reason=decision.reason
        )
    if isinstance(decision, LostMessage):
        return record(
            ResultState.DEAD,
            error=f"lost: acked before it started (Ack.EARLY) and did not complete "
            f"({decision.reason})",
            reason="lost",
        )
    return None


def _where(d: Delivery) -> tuple[str, str, int]:
    return d.message_id, d.queue, d.attempt
