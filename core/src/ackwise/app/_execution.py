"""Running one task call inside an executor (a thread or a prefork child).

This module is what executors share; it knows nothing about brokers or settlement.
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import functools
import importlib
import signal
import sys
import threading
import time
import traceback
from collections.abc import Callable, Coroutine, Iterator
from dataclasses import dataclass
from types import TracebackType
from typing import TYPE_CHECKING, Any

import msgspec

from ackwise.app import _tracing
from ackwise.app._followups import CHAIN, CHORD, retries_done
from ackwise.app._task import TaskContext
from ackwise.contract import _envelope
from ackwise.errors import ConfigurationError, NotSerializable, SoftTimeLimitExceeded

if TYPE_CHECKING:
    from ackwise.app._app import App
    from ackwise.app._task import Task

OK = 0
FAILED = 1

_TRACEBACK_LIMIT = 16_000


@dataclass(frozen=True, slots=True)
class Job:
    """One delivery handed to an executor."""

    job_id: int
    attempt: int
    body: bytes
    #: The delivery's receipt as text, for bound tasks (empty otherwise).
    receipt: str = ""


@dataclass(frozen=True, slots=True)
class Result:
    """What an executor reports back for a job that ran (or raised)."""

    job_id: int
    status: int  # OK or FAILED
    duration: float
    retry_delay: float | None = None
    error: str | None = None
    traceback: str | None = None
    #: What the task returned, as JSON text (tasks that store results only).
    value: str | None = None

    def to_wire(self) -> list[Any]:
        return [
            self.job_id,
            self.status,
            self.duration,
            self.retry_delay,
            self.error,
            self.traceback,
            self.value,
        ]

    @classmethod
    def from_wire(cls, raw: list[Any]) -> Result:
        return cls(*raw[:7])


#: What an executor calls as the last step before a rate-limited task's function, with the
#: task's name and interval: it returns once the start is recorded in the app's rate limit
#: store (:class:`ackwise.stores._ratelimit.StartGate`).
Gate = Callable[[str, float], None]


class Runner:
    """Runs jobs for one executor thread or process; owns that executor's event loop.

    :param gate: called right before the function of a task with a rate limit (``None``:
        not held, as in eager mode).
    """

    def __init__(self, app: App, gate: Gate | None = None) -> None:
        self.app = app
        self.gate = gate
        self._loop: asyncio.AbstractEventLoop | None = None

    def run(self, job: Job) -> Result:
        start = time.perf_counter()
        env: _envelope.Envelope | None = None
        policy = None
        try:
            env = _envelope.decode(job.body)
            task = self.app.tasks[env.task]
            policy = task.retry_policy
            value = self.call(task, env, job.attempt, job.receipt)
        except BaseException as exc:
            duration = time.perf_counter() - start
            retry_delay: float | None = None
            if policy is not None and env is not None:
                retry_delay = policy.retry_delay(exc, retries_done(env))
            return Result(
                job.job_id,
                FAILED,
                duration,
                retry_delay,
                describe(exc),
                format_traceback(exc),
            )
        return Result(job.job_id, OK, time.perf_counter() - start, value=value)

    def call(
        self, task: Task[..., Any], env: _envelope.Envelope, attempt: int, receipt: str = ""
    ) -> str | None:
        """Call ``task`` with ``env``'s arguments as an executor does: its context first if it
        is bound, under its soft time limit, after its rate limit's gate, traced where
        tracing is on, async tasks on this runner's loop.  Returns its value as JSON where it
        is kept (the task stores results, a chain's next step takes it, a chord's callback
        reads it), else ``None``.

        :raises BaseException: what the task raised; TypeError naming what it returned that
            is not JSON, where its value is kept.
        """
        args: list[Any] = env.args
        if task.bind:
            ctx = TaskContext(
                task, env.id, attempt, retries_done(env), env.queue, env.headers, receipt
            )
            args = [ctx, *args]
        if _tracing.active():
            returned = self._call_traced(task, args, env, attempt)
        else:
            returned = self._call(task, args, env.kwargs)
        # A chain's next step takes the value; a chord's callback reads it from the store.
        if task.store_results or CHAIN in env.headers or CHORD in env.headers:
            return json_value(task.name, returned)
        return None

    def _call(self, task: Task[..., Any], args: list[Any], kwargs: dict[str, Any]) -> Any:
        soft = task.soft_time_limit
        begin: Callable[[], None] | None = None
        if self.gate is not None and task.rate_interval is not None:
            begin = functools.partial(self.gate, task.name, task.rate_interval)
        if task.is_async:
            coro = task.fn(*args, **kwargs)  # not begun yet: that is the loop's first step
            if begin is not None:
                coro = _gated(begin, coro)
            return self._run_async(_soft_limited(coro, soft) if soft else coro)
        # The gate is the last step before the function: whatever held this thread back
        # until then (a late wake-up, a tracer, a soft limit's timer) delays the recorded
        # start, and the next start counts from it.
        if soft:
            with _soft_limit(soft):
                if begin is not None:
                    begin()
                return task.fn(*args, **kwargs)
        if begin is not None:
            begin()
        return task.fn(*args, **kwargs)

    def _call_traced(
        self, task: Task[..., Any], args: list[Any], env: _envelope.Envelope, attempt: int
    ) -> Any:
        with _tracing.process_span(
            scheme=self.app.broker.scheme,
            queue=env.queue,
            message_id=env.id,
            task=task.name,
            mode=task.ack.value,
            attempt=attempt,
            headers=env.headers,
        ) as span:
            try:
                returned = self._call(task, args, env.kwargs)
            except BaseException as exc:
                _tracing.finish(span, "failed", exc)
                raise
            _tracing.finish(span, "succeeded")
            return returned

    def _run_async(self, coro: Any) -> Any:
        if self._loop is None:
            self._loop = asyncio.new_event_loop()
        return self._loop.run_until_complete(coro)

    def close(self) -> None:
        if self._loop is not None:
            self._loop.close()
            self._loop = None


def json_value(task: str, value: Any) -> str:
    """The return value as JSON text, or :class:`NotSerializable` naming what is not JSON
    (the task then fails: its result could not be stored)."""
    if value is not None:
        try:
            _envelope.check_json(task, "value", value)
        except NotSerializable as exc:
            raise TypeError(
                f"{task} returned {exc.path} of type {exc.type_name}, which is not JSON: its "
                "result cannot be stored (return str, int, float, bool, None, list or dict)"
            ) from None
    return msgspec.json.encode(value).decode()


def format_traceback(exc: BaseException) -> str:
    """The traceback from the task's own frames on (the runner's frame is noise).

    Python 3.11 parses each line of a traceback to place its ``^^^`` marks, and its AST
    constructor keeps one recursion depth for all threads (python/cpython#106905): two
    threads formatting at once (tasks of a thread pool failing together) can make it raise
    ``SystemError``.  That is retried, then the traceback is written without the marks: a
    failure is never lost to the formatting of its traceback.
    """
    tb = exc.__traceback__
    if tb is not None and tb.tb_next is not None:
        tb = tb.tb_next
    for _ in range(3):
        try:
            text = "".join(traceback.format_exception(type(exc), exc, tb))
            break
        except SystemError:
            continue
    else:
        text = _plain_traceback(exc, tb)
    return text[-_TRACEBACK_LIMIT:]


def _plain_traceback(exc: BaseException, tb: TracebackType | None) -> str:
    """A traceback as :func:`traceback.format_exception` writes it, without ``^^^`` marks
    (nothing here parses source)."""
    lines = ["Traceback (most recent call last):\n"]
    for frame in traceback.extract_tb(tb):
        lines.append(f'  File "{frame.filename}", line {frame.lineno}, in {frame.name}\n')
        if frame.line:
            lines.append(f"    {frame.line.strip()}\n")
    lines += traceback.format_exception_only(type(exc), exc)
    return "".join(lines)


async def _gated(begin: Callable[[], None], coro: Coroutine[Any, Any, Any]) -> Any:
    """Run ``coro`` once ``begin`` returned (on this executor's own loop, which runs nothing
    else meanwhile: blocking it is waiting for the start)."""
    try:
        begin()
    except BaseException:
        coro.close()  # never begun: no "never awaited" warning
        raise
    return await coro


async def _soft_limited(coro: Any, seconds: float) -> Any:
    try:
        return await asyncio.wait_for(coro, seconds)
    except TimeoutError:
        raise SoftTimeLimitExceeded(f"soft time limit of {seconds}s exceeded") from None


_async_exc = ctypes.pythonapi.PyThreadState_SetAsyncExc
_async_exc.argtypes = [ctypes.c_ulong, ctypes.py_object]


@contextlib.contextmanager
def _soft_limit(seconds: float) -> Iterator[None]:
    """Raise SoftTimeLimitExceeded in this thread after ``seconds`` (in Python code).

    The main thread (a prefork child) uses SIGALRM; other threads get an asynchronous
    exception from a timer, cleared again if the task finished first.
    """
    message = f"soft time limit of {seconds}s exceeded"
    if threading.current_thread() is threading.main_thread():

        def on_alarm(signum: int, frame: object) -> None:
            raise SoftTimeLimitExceeded(message)

        previous = signal.signal(signal.SIGALRM, on_alarm)
        signal.setitimer(signal.ITIMER_REAL, seconds)
        try:
            yield
        finally:
            signal.setitimer(signal.ITIMER_REAL, 0)
            signal.signal(signal.SIGALRM, previous)
        return
    tid = threading.get_ident()
    lock = threading.Lock()
    state = {"done": False, "fired": False}

    def fire() -> None:
        with lock:
            if not state["done"]:
                state["fired"] = True
                _async_exc(tid, ctypes.py_object(SoftTimeLimitExceeded))

    timer = threading.Timer(seconds, fire)
    timer.daemon = True
    timer.start()
    try:
        yield
    finally:
        with lock:
            state["done"] = True
            timer.cancel()
            if state["fired"]:
                _async_exc(tid, ctypes.py_object())  # NULL: drop it if still pending


def describe(exc: BaseException) -> str:
    name = type(exc).__qualname__
    text = str(exc)
    return f"{name}: {text}" if text else name


def load_app(path: str) -> App:
    """Import ``module:attribute`` (or ``module`` holding a single App) and return the App."""
    from ackwise.app._app import App

    module_name, _, attr = path.partition(":")
    if not module_name:
        raise ConfigurationError(f"app path {path!r}: expected 'module:app', e.g. 'proj.tasks:app'")
    if "" not in sys.path and "." not in sys.path:
        sys.path.insert(0, "")  # like `python -m`: the current directory is importable
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise ConfigurationError(
            f"app path {path!r}: cannot import {module_name!r}: {exc}"
        ) from exc
    if attr:
        obj = module
        for part in attr.split("."):
            try:
                obj = getattr(obj, part)
            except AttributeError:
                raise ConfigurationError(
                    f"app path {path!r}: module {module_name!r} has no attribute {attr!r}"
                ) from None
        if not isinstance(obj, App):
            raise ConfigurationError(
                f"app path {path!r}: {attr!r} is {type(obj).__name__}, not an App"
            )
        return obj
    apps = [v for v in vars(module).values() if isinstance(v, App)]
    if len(apps) != 1:
        raise ConfigurationError(
            f"app path {path!r}: found {len(apps)} App objects in {module_name!r}; name one, "
            f"e.g. '{module_name}:app'"
        )
    return apps[0]
