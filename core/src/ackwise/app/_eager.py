"""Eager mode (docs/testing.md): calls sent through an app run at once, in the sending
thread, with no broker and no worker.

:func:`eager` turns it on for an app.  A call is checked and encoded exactly as a real
publish encodes it (the same errors, before anything runs); eager mode takes the encoded
message instead of the broker (the app's :attr:`~ackwise.App.diversion`), decodes it and runs
the task as a worker would, with the worker's own parts (a :class:`Runner` calls it, and
:mod:`ackwise.app._followups` decides what follows it: bound context, async tasks, retries
without their delays, chain and chord steps, results, idempotency keys).  Calls sent while a task runs are queued and run after it returns, before
the outermost send returns.  It tests what your code sends and what the tasks do with it,
never delivery: there are no acks, leases, crashes or redeliveries.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import logging
import threading
import time
from collections import deque
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

from ackwise.app._app import App
from ackwise.app._execution import Runner, describe, format_traceback
from ackwise.app._followups import follow_up, in_workflow, retries_done, with_attempt
from ackwise.app._task import Task, claim_key
from ackwise.contract import _envelope
from ackwise.contract._envelope import Envelope
from ackwise.contract._spi import Outgoing
from ackwise.errors import ConfigurationError
from ackwise.stores._results import ResultState, ResultStore, TaskResult

__all__ = ["EagerFailure", "EagerMode", "eager"]

log = logging.getLogger("ackwise.testing")

T = TypeVar("T")

#: The calls waiting to run in this context while a send runs its call (and what that call
#: sends in turn), each with the eager mode that took it; ``None``: no send is running.
_pending: contextvars.ContextVar[deque[tuple[EagerMode, Envelope]] | None] = contextvars.ContextVar(
    "ackwise_eager_pending", default=None
)


@dataclass(frozen=True)
class EagerFailure:
    """A call that raised in eager mode: its envelope as it ran, and what it raised."""

    envelope: Envelope
    error: BaseException


class EagerMode:
    """Eager mode of one app (what :func:`eager` yields): what was sent and how it went.

    Every list is in order.  A call that succeeded is in :attr:`sent` only (its value is on
    its handle where its task stores results).
    """

    def __init__(self, app: App, *, propagate: bool = True) -> None:
        #: The app whose sends run here.
        self.app = app
        #: Whether a call that fails for good raises from the send that ran it.
        self.propagate = propagate
        #: Every message sent, decoded from the bytes a broker would have been given: the
        #: calls your code sent and those the "worker" sent (a chain's next step, a chord's
        #: callback).  Retries are runs, not sends: they are in :attr:`retried`.
        self.sent: list[Envelope] = []
        #: Messages of tasks this app does not know (sent by name): accepted, as a real
        #: publish accepts them, and not run.
        self.not_run: list[Envelope] = []
        #: Messages not run because their idempotency key was done by an earlier call.
        self.skipped: list[Envelope] = []
        #: Every failed run that was retried (at once: backoff delays are not waited).
        self.retried: list[EagerFailure] = []
        #: Calls that failed for good (no retry left, or not retryable).
        self.failures: list[EagerFailure] = []
        self._results = _EagerResults(app)
        #: What the app hands its sends to while this mode is on.
        self._diversion = _Diversion(self)
        self._done_keys: set[str] = set()
        #: A runner (and event loop, for async tasks) per sending thread.
        self._local = threading.local()
        self._runners: list[Runner] = []

    def __repr__(self) -> str:
        return (
            f"<EagerMode {self.app.name}: {len(self.sent)} sent, {len(self.failures)} failed, "
            f"{len(self.not_run)} not run, {len(self.skipped)} skipped>"
        )

    @property
    def results(self) -> ResultStore:
        """The store eager mode keeps results in (``app.results()`` is this store while
        eager mode is on, if the app has a result store at all)."""
        return self._results

    @property
    def tasks_sent(self) -> list[str]:
        """The task names of :attr:`sent`, in order."""
        return [e.task for e in self.sent]

    # -- what the app hands over instead of publishing ---------------------------------------
    def _publish(self, messages: Sequence[Outgoing]) -> None:
        """Run ``messages`` (encoded as a publish encodes them), or queue them behind the call
        that is running; return once every call queued meanwhile has run.

        :raises BaseException: with ``propagate``, the first error of a call that failed for
            good, once the queue is empty.
        """
        envelopes = [_envelope.decode(m.body) for m in messages]
        self.sent.extend(envelopes)
        pending = _pending.get()
        if pending is not None:  # sent from inside a running call: it runs after that call
            for env in envelopes:
                self._results.notes[env.id] = (
                    "sent while another call ran; eager mode runs it after that call returns"
                )
            pending.extend((self, env) for env in envelopes)
            return
        pending = deque((self, env) for env in envelopes)
        token = _pending.set(pending)
        first: BaseException | None = None
        try:
            while pending:
                mode, env = pending.popleft()
                error = mode._run(env)
                if error is not None and first is None and mode.propagate:
                    first = error
        finally:
            pending.clear()  # a KeyboardInterrupt leaves nothing queued for a later send
            _pending.reset(token)
        if first is not None:
            raise first

    def _close(self) -> None:
        for runner in self._runners:
            runner.close()
        self._runners.clear()

    def _runner(self) -> Runner:
        """This thread's runner."""
        runner: Runner | None = getattr(self._local, "runner", None)
        if runner is None:
            runner = self._local.runner = Runner(self.app)
            self._runners.append(runner)
        return runner

    # -- one call ------------------------------------------------------------------------------
    def _run(self, env: Envelope) -> BaseException | None:
        """Run one call to its end (retries included); return its final error, if any."""
        self._results.notes.pop(env.id, None)
        task = self.app.tasks.get(env.task)
        if task is None:
            self.not_run.append(env)
            self._results.notes[env.id] = (
                f"not run: no task named {env.task!r} is registered on app {self.app.name!r} "
                "(eager mode runs only the app's own tasks)"
            )
            log.info("eager: message %s of unknown task %s not run", env.id, env.task)
            return None
        try:
            key = self._key_of(task, env)
        except Exception as exc:  # as a worker: dead-lettered without running, no retry
            return self._failed(task, env, exc)
        if key is not None and key in self._done_keys:
            self.skipped.append(env)
            self._results.notes[env.id] = f"not run: its idempotency key {key} is done"
            return None
        while True:
            try:
                value = self._call(task, env)
            except Exception as exc:
                if task.retry_policy.retry_delay(exc, retries_done(env)) is None:
                    return self._failed(task, env, exc)
                self.retried.append(EagerFailure(env, exc))
                env = self._again(env, exc)
                continue
            if key is not None:
                self._done_keys.add(key)
            self._succeeded(task, env, value)
            return None

    def _key_of(self, task: Task[..., Any], env: Envelope) -> str | None:
        """The call's idempotency key, as a worker claims it (none without a store)."""
        if self.app.idempotency_store_url is None:
            return None
        return claim_key(task, env)

    def _call(self, task: Task[..., Any], env: Envelope) -> str | None:
        """Call the task as a worker's executor does (:meth:`Runner.call`); return its value
        as JSON where a worker would keep it (results, a chain's next step, a chord)."""
        if task.is_async and _loop_running():
            # This thread's loop is busy (an async test): the task gets a loop of its own on a
            # thread that the send waits for.
            return _in_thread(lambda: self._call_fresh(task, env))
        return self._runner().call(task, env, 1)

    def _call_fresh(self, task: Task[..., Any], env: Envelope) -> str | None:
        """:meth:`_call` with a runner (and event loop) of its own, closed after."""
        runner = Runner(self.app)
        try:
            return runner.call(task, env, 1)
        finally:
            runner.close()

    def _again(self, env: Envelope, exc: BaseException) -> Envelope:
        """The retry's envelope: the attempt added to its history, encoded and decoded again."""
        error, trace = describe(exc), format_traceback(exc)
        again = with_attempt(env, 1, "retry", error, trace, "eager")
        return _envelope.decode(_envelope.encode(again))

    # -- outcomes ------------------------------------------------------------------------------
    def _succeeded(self, task: Task[..., Any], env: Envelope, value: str | None) -> None:
        record = self._record(task, env, ResultState.SUCCEEDED, value=value)
        self._follow_up(task, env, record)
        if task.store_results:
            self._put(record)

    def _failed(self, task: Task[..., Any], env: Envelope, exc: BaseException) -> BaseException:
        self.failures.append(EagerFailure(env, exc))
        record = self._record(
            task, env, ResultState.FAILED, error=describe(exc), traceback=format_traceback(exc)
        )
        self._follow_up(task, env, record)
        if task.store_results:
            self._put(record)
        return exc

    def _follow_up(self, task: Task[..., Any], env: Envelope, record: TaskResult) -> None:
        """What follows the call's end in a workflow, as a worker does it (docs/workflows.md):
        records where a worker would store them (only if the app has a result store; a chord
        member then is not counted, as a worker logs), messages sent as the worker sends them."""
        if in_workflow(env):
            results = self._results if self.app.result_store_url is not None else None
            follow_up(
                env, task.name, env.id, record, results, lambda queue, out: self._publish([out])
            )

    def _record(
        self, task: Task[..., Any], env: Envelope, state: ResultState, **fields: str | None
    ) -> TaskResult:
        return TaskResult(
            id=env.id, state=state.value, task=task.name, attempt=1, at=time.time(), **fields
        )

    def _put(self, record: TaskResult) -> None:
        """Keep a record where a worker would store it: only if the app has a result store."""
        if self.app.result_store_url is not None:
            self._results.put([record])


class _Diversion:
    """What the app hands its sends to in eager mode (:class:`ackwise.app._ports.Diversion`):
    the mode's records, and the mode's run of the messages."""

    def __init__(self, mode: EagerMode) -> None:
        self._mode = mode

    @property
    def results(self) -> ResultStore:
        return self._mode.results

    def publish(self, messages: Sequence[Outgoing]) -> None:
        self._mode._publish(messages)


class _EagerResults(ResultStore):
    """The records of one eager mode, in memory.  Waiting never waits: by the time a send
    returns its call has run, so a record that is not final will not become final."""

    scheme = "eager"

    def __init__(self, app: App) -> None:
        super().__init__(app.broker)
        self._app = app
        self._lock = threading.Lock()
        self._records: dict[str, TaskResult] = {}
        self._chords: dict[str, set[int]] = {}
        #: Why a message id has no final record yet (queued, not run, skipped).
        self.notes: dict[str, str] = {}

    def open(self) -> None:
        """Nothing to open."""

    def close(self) -> None:
        """Nothing to close."""

    def put(self, records: Sequence[TaskResult]) -> None:
        """Store each record where :meth:`TaskResult.replaces` lets it."""
        with self._lock:
            for r in records:
                if r.replaces(self._records.get(r.id)):
                    self._records[r.id] = r

    def get(self, message_id: str) -> TaskResult | None:
        """The record of ``message_id``, or ``None``."""
        with self._lock:
            return self._records.get(message_id)

    def forget(self, message_ids: Sequence[str]) -> None:
        """Delete these records and chord counts."""
        with self._lock:
            for mid in message_ids:
                self._records.pop(mid, None)
                self._chords.pop(mid, None)

    def join(self, chord_id: str, member: int) -> int:
        """Count ``member`` as finished in ``chord_id``; return how many have finished."""
        with self._lock:
            members = self._chords.setdefault(chord_id, set())
            members.add(member)
            return len(members)

    def wait(self, message_id: str, timeout: float | None) -> TaskResult | None:
        """The final record at once.

        :raises TimeoutError: there is none (waiting would not bring one), saying why.
        """
        record = self.get(message_id)
        if record is not None and record.final:
            return record
        why = self.notes.get(message_id) or (
            "nothing stored: eager mode runs a call as it is sent, so this id was not sent "
            "while eager mode was on"
        )
        state = "pending" if record is None else record.state
        raise TimeoutError(
            f"message {message_id} has no final state in eager mode ({state}): {why}"
        )


def _loop_running() -> bool:
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return False
    return True


def _in_thread(fn: Callable[[], T]) -> T:
    """``fn()`` on a new thread (in a copy of this context), waited for; its value or error."""
    context = contextvars.copy_context()
    values: list[T] = []
    errors: list[BaseException] = []

    def target() -> None:
        try:
            values.append(context.run(fn))
        except BaseException as exc:
            errors.append(exc)

    thread = threading.Thread(target=target, name="ackwise-eager-async")
    thread.start()
    thread.join()
    if errors:
        raise errors[0]
    return values[0]


@contextlib.contextmanager
def eager(app: App, *, propagate: bool = True) -> Iterator[EagerMode]:
    """Run every call sent through ``app`` at once, in the sending thread, while the block
    runs (docs/testing.md).

    Sends are checked and encoded exactly as a real publish (the same errors, before anything
    runs), then decoded and run; nothing reaches the broker.  A call sent from inside a running
    task runs after that task returns, before the outermost send returns.  Not a test of
    delivery: no acks, leases, crashes, redeliveries, delays or priorities.

    :param app: the app to run eagerly (its broker is never connected to).
    :param propagate: a call that fails for good (no retry left, or an error not retried)
        raises its exception from the send that ran it, once every call queued behind it has
        run; ``False``: it is only recorded (:attr:`EagerMode.failures`, and the ``failed``
        result where the task stores results).
    :raises ConfigurationError: the app is in eager mode already.
    """
    if app.diversion is not None:
        raise ConfigurationError(f"app {app.name!r} is in eager mode already")
    mode = EagerMode(app, propagate=propagate)
    app.diversion = mode._diversion
    try:
        yield mode
    finally:
        app.diversion = None
        mode._close()
