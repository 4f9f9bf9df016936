"""Tasks and their calls: ``Task`` (what ``@app.task`` registers), ``Signature`` (a call not
yet sent), the retry policy and the context a bound task receives."""

from __future__ import annotations

import datetime as dt
import inspect
import math
import random
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Generic, ParamSpec, TypeVar

from ackwise.app._handle import TaskHandle
from ackwise.contract._semantics import Ack
from ackwise.errors import ConfigurationError, TransientAdapterError
from ackwise.stores._ratelimit import parse_rate

if TYPE_CHECKING:
    from ackwise.app._app import App
    from ackwise.contract._envelope import Envelope

__all__ = ["TRANSIENT_ERRORS", "Retry", "RetryPolicy", "Signature", "Task", "TaskContext"]

TRANSIENT_ERRORS: tuple[type[BaseException], ...] = (
    ConnectionError,
    TimeoutError,
    TransientAdapterError,
)
"""What ``autoretry_for`` retries by default: errors where trying again later may succeed.
Everything else (a bug, bad input) is dead-lettered at once."""

P = ParamSpec("P")
R = TypeVar("R")


class Retry(Exception):
    """Raise inside a task to run it again after ``delay`` seconds (default: the backoff)."""

    def __init__(self, delay: float | None = None, *, exc: BaseException | None = None) -> None:
        self.delay = delay
        self.exc = exc
        super().__init__(f"retry requested (delay={delay})")


@dataclass(frozen=True)
class RetryPolicy:
    """When and how soon a failed task runs again (docs/failure-handling.md)."""

    autoretry_for: tuple[type[BaseException], ...] = ()
    dont_autoretry_for: tuple[type[BaseException], ...] = ()
    max_retries: int = 3
    backoff: float = 1.0
    backoff_max: float = 600.0
    jitter: bool = True

    def __post_init__(self) -> None:
        if self.max_retries < 0:
            raise ConfigurationError(f"max_retries must be >= 0, got {self.max_retries}")
        if not (math.isfinite(self.backoff) and self.backoff >= 0):
            raise ConfigurationError(
                f"retry_backoff must be a finite number >= 0, got {self.backoff}"
            )
        if not (math.isfinite(self.backoff_max) and self.backoff_max >= self.backoff):
            raise ConfigurationError(
                f"retry_backoff_max ({self.backoff_max}) must be finite and >= retry_backoff "
                f"({self.backoff})"
            )

    def bound(self, retries_done: int) -> float:
        """Upper bound of the delay before retry number ``retries_done + 1``."""
        return min(self.backoff_max, self.backoff * (2.0 ** min(retries_done, 62)))

    def delay_for(self, retries_done: int, rng: Callable[[], float] = random.random) -> float:
        """The delay before the next retry: exponential, capped, full jitter by default."""
        cap = self.bound(retries_done)
        return cap * rng() if self.jitter else cap

    def retry_delay(self, exc: BaseException, retries_done: int) -> float | None:
        """Return the delay of the retry due after ``exc``, or ``None`` when none is due."""
        if retries_done >= self.max_retries:
            return None
        if isinstance(exc, Retry):
            return self.delay_for(retries_done) if exc.delay is None else exc.delay
        if self.dont_autoretry_for and isinstance(exc, self.dont_autoretry_for):
            return None
        if self.autoretry_for and isinstance(exc, self.autoretry_for):
            return self.delay_for(retries_done)
        return None


@dataclass(frozen=True)
class TaskContext:
    """What a bound task (``bind=True``) receives as its first argument."""

    task: Task[..., Any]
    id: str
    attempt: int
    retries: int
    queue: str
    headers: dict[str, Any]
    #: The delivery's receipt as text (opaque; for journals and logs).
    receipt: str = ""

    def retry(self, delay: float | None = None, *, exc: BaseException | None = None) -> Retry:
        """Return a :class:`Retry` to raise: ``raise self.retry(delay=5)``."""
        return Retry(delay, exc=exc)


@dataclass(frozen=True)
class Signature:
    """A task call not yet sent; see :meth:`App.send_many`.

    ``task`` is a task of the app, or a task's name (:meth:`App.signature`).
    """

    task: Task[..., Any] | str
    args: tuple[Any, ...] = ()
    kwargs: dict[str, Any] = field(default_factory=dict)
    options: dict[str, Any] = field(default_factory=dict)

    def set(self, **options: Any) -> Signature:
        """The same call with more send options: ``task.s(1).set(queue="slow", countdown=5)``."""
        return Signature(self.task, self.args, self.kwargs, {**self.options, **options})


class Task(Generic[P, R]):
    """A registered task.  Calling it runs the function here; ``delay`` sends it."""

    def __init__(
        self,
        app: App,
        fn: Callable[P, R],
        *,
        name: str,
        ack: Ack,
        queue: str,
        max_deliveries: int,
        bind: bool,
        retry: RetryPolicy,
        time_limit: float | None = None,
        soft_time_limit: float | None = None,
        idempotency_key: Callable[..., str] | None = None,
        store_results: bool | None = None,
        track_started: bool = False,
        rate_limit: str | None = None,
        priority: int = 0,
    ) -> None:
        self.app = app
        #: Its calls' priority unless a call gives one (0 to 9; docs/priorities.md).
        self.priority = priority
        #: ``"N/s"``, ``"N/m"`` or ``"N/h"``: starts shared by every worker (docs/rate-limits.md).
        self.rate_limit = rate_limit
        #: Seconds between two starts of this task, or ``None`` (no limit).
        self.rate_interval = parse_rate(rate_limit, f"task {name!r}: rate_limit")
        self._store_results = store_results
        self.track_started = track_started
        self.fn = fn
        self.name = name
        self.ack = ack
        self.queue = queue
        self.max_deliveries = max_deliveries
        self.bind = bind
        self.retry_policy = retry
        self.time_limit = time_limit
        self.soft_time_limit = soft_time_limit
        self.idempotency_key = idempotency_key
        self.is_async = inspect.iscoroutinefunction(fn)
        self.__doc__ = fn.__doc__
        self.__wrapped__ = fn

    def __repr__(self) -> str:
        return f"<Task {self.name} ack={self.ack.value} queue={self.queue}>"

    @property
    def store_results(self) -> bool:
        """Whether workers store what this task returns (the task's setting, else the app's)."""
        return self.app.store_results if self._store_results is None else self._store_results

    def __call__(self, *args: P.args, **kwargs: P.kwargs) -> R:
        return self.fn(*args, **kwargs)

    def delay(self, *args: P.args, **kwargs: P.kwargs) -> TaskHandle:
        """Send the task with these arguments; return its handle (the message id)."""
        return self.apply_async(args, kwargs)

    def apply_async(
        self,
        args: Sequence[Any] | None = None,
        kwargs: dict[str, Any] | None = None,
        *,
        countdown: float | None = None,
        eta: dt.datetime | None = None,
        queue: str | None = None,
        headers: dict[str, Any] | None = None,
        id: str | None = None,
        priority: int | None = None,
    ) -> TaskHandle:
        """Send the task; return its handle (a ``str``: the message id; see docs/results.md).

        :param countdown: seconds from now before it may run (``>= 0``).
        :param eta: an aware datetime before which it does not run (not with ``countdown``).
        :param priority: 0 (lowest) to 9, this call's instead of the task's (docs/priorities.md).
        :raises InvalidPriority: a priority out of range, or any above 0 on a broker without
            priorities; nothing was published.
        :raises NotSerializable: an argument or header is not JSON; nothing was published.
        :raises InvalidSchedule: negative countdown, naive eta, or both given.
        """
        return self.app._send_one(
            self,
            args,
            kwargs,
            countdown=countdown,
            eta=eta,
            queue=queue,
            headers=headers,
            id=id,
            priority=priority,
        )

    def s(self, *args: Any, **kwargs: Any) -> Signature:
        """Return a signature of this call, for :meth:`App.send_many`."""
        return Signature(self, args, kwargs)

    def map(self, calls: Iterable[Sequence[Any]]) -> list[TaskHandle]:
        """Send one message per argument tuple, batched per queue; return the ids."""
        return self.app.send_many(Signature(self, tuple(a)) for a in calls)


def claim_key(task: Task[..., Any], env: Envelope) -> str | None:
    """The idempotency key a call of ``task`` is claimed under: the message's own
    ``idempotency_key`` header, else the task's ``idempotency_key`` of its arguments, else
    none; prefixed with the task's name (docs/idempotency.md)."""
    header = env.headers.get("idempotency_key")
    if isinstance(header, str) and header:
        return f"{task.name}:{header}"
    if task.idempotency_key is None:
        return None
    return f"{task.name}:{task.idempotency_key(*env.args, **env.kwargs)}"
