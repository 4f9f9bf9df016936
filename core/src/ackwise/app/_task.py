"""Tasks and their calls: ``Task`` (what ``@app.task`` registers) and its options
(:class:`TaskOptions`), ``Signature`` (a call not yet sent) and a call's options
(:class:`SendOptions`), the retry policy, the context a bound task receives, and
:class:`TaskApp`: what all of them need of their App."""

from __future__ import annotations

import dataclasses
import datetime as dt
import inspect
import math
import random
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Generic, ParamSpec, Protocol, TypeVar

from ackwise.app._handle import TaskHandle
from ackwise.contract._envelope import check_json, check_queue_name
from ackwise.contract._semantics import Ack
from ackwise.errors import ConfigurationError, InvalidSchedule, TransientAdapterError
from ackwise.stores._ratelimit import parse_rate

if TYPE_CHECKING:
    from ackwise.contract._envelope import Envelope
    from ackwise.contract._spi import BrokerURL
    from ackwise.plugins._manager import Plugins

__all__ = [
    "NO_OPTIONS",
    "TRANSIENT_ERRORS",
    "Retry",
    "RetryPolicy",
    "SendOptions",
    "Signature",
    "Task",
    "TaskApp",
    "TaskContext",
    "TaskOptions",
    "schedule_delay",
]

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
class TaskOptions:
    """The options of ``@app.task`` (see :meth:`App.task`), with its defaults, checked as the
    decorator is applied: a bad one raises :class:`ConfigurationError` before any function
    is registered.

    ``name``, ``queue`` and ``priority`` are checked when the function is registered (the
    name's default is the function's, the queue's the app's, and a priority above 0 needs a
    broker with priorities), as is ``rate_limit`` (its error names the task).
    """

    name: str | None = None
    ack: Ack = Ack.LATE
    queue: str | None = None
    max_deliveries: int = 5
    bind: bool = False
    autoretry_for: tuple[type[BaseException], ...] = TRANSIENT_ERRORS
    dont_autoretry_for: tuple[type[BaseException], ...] = ()
    max_retries: int = 3
    retry_backoff: float = 1.0
    retry_backoff_max: float = 600.0
    retry_jitter: bool = True
    time_limit: float | None = None
    soft_time_limit: float | None = None
    idempotency_key: Callable[..., str] | None = None
    store_results: bool | None = None
    track_started: bool = False
    rate_limit: str | None = None
    priority: int = 0
    #: The retry policy of ``autoretry_for`` … ``retry_jitter``, made (and checked) here.
    retry: RetryPolicy = field(init=False)

    def __post_init__(self) -> None:
        if self.idempotency_key is not None and not callable(self.idempotency_key):
            raise ConfigurationError(
                f"idempotency_key must be a callable taking the task's arguments, got "
                f"{self.idempotency_key!r}"
            )
        for label, value in (
            ("time_limit", self.time_limit),
            ("soft_time_limit", self.soft_time_limit),
        ):
            if value is not None and (
                isinstance(value, bool)
                or not isinstance(value, int | float)
                or not math.isfinite(value)
                or value <= 0
            ):
                raise ConfigurationError(f"{label} must be a number of seconds > 0, got {value!r}")
        hard, soft = self.time_limit, self.soft_time_limit
        if hard is not None and soft is not None and soft >= hard:
            raise ConfigurationError(
                f"soft_time_limit ({soft}s) must be shorter than time_limit "
                f"({hard}s): the soft limit is the task's chance to clean up first"
            )
        for label, classes in (
            ("autoretry_for", self.autoretry_for),
            ("dont_autoretry_for", self.dont_autoretry_for),
        ):
            if not all(isinstance(c, type) and issubclass(c, BaseException) for c in classes):
                raise ConfigurationError(
                    f"{label} must be a tuple of exception classes, got {classes!r}"
                )
        if not isinstance(self.ack, Ack):
            raise ConfigurationError(f"ack must be an ackwise.Ack member, got {self.ack!r}")
        if not (isinstance(self.max_deliveries, int) and self.max_deliveries >= 1):
            raise ConfigurationError(
                f"max_deliveries must be an int >= 1, got {self.max_deliveries!r}"
            )
        policy = RetryPolicy(
            tuple(self.autoretry_for),
            tuple(self.dont_autoretry_for),
            self.max_retries,
            float(self.retry_backoff),
            float(self.retry_backoff_max),
            bool(self.retry_jitter),
        )
        object.__setattr__(self, "retry", policy)
        # As the task holds them: seconds as floats, flags as bools.
        if hard is not None:
            object.__setattr__(self, "time_limit", float(hard))
        if soft is not None:
            object.__setattr__(self, "soft_time_limit", float(soft))
        object.__setattr__(self, "track_started", bool(self.track_started))


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


@dataclass(frozen=True, slots=True, init=False)
class SendOptions:
    """The options of one call, as given: :meth:`Task.apply_async`'s and :meth:`App.send`'s
    keyword arguments, a signature's (:meth:`Signature.set`, :meth:`App.signature`).
    :meth:`checked` refuses what cannot be sent.

    ``priority`` is checked with the task's default and the broker's capabilities
    (:func:`ackwise.app._policy.check_priority`), ``id`` is the message id (a new one if
    ``None``).
    """

    countdown: float | None = None
    eta: dt.datetime | None = None
    queue: str | None = None
    headers: dict[str, Any] | None = None
    id: str | None = None
    priority: int | None = None

    def __init__(
        self,
        countdown: float | None = None,
        eta: dt.datetime | None = None,
        queue: str | None = None,
        headers: dict[str, Any] | None = None,
        id: str | None = None,
        priority: int | None = None,
    ) -> None:
        # The dataclass's own __init__, at about half its cost (one is made per apply_async
        # or send with options): each slot is set through its descriptor, as a frozen
        # class must, rather than through object.__setattr__.
        _set_countdown(self, countdown)
        _set_eta(self, eta)
        _set_queue(self, queue)
        _set_headers(self, headers)
        _set_id(self, id)
        _set_priority(self, priority)

    @classmethod
    def of(cls, options: Mapping[str, Any]) -> SendOptions:
        """A signature's options (a mapping of the names above).

        :raises TypeError: a name that is not a send option.
        """
        return cls(**options) if options else NO_OPTIONS

    def with_headers(self, headers: Mapping[str, Any]) -> SendOptions:
        """These options with ``headers`` added to (or replacing) theirs."""
        return dataclasses.replace(self, headers={**(self.headers or {}), **headers})

    def checked(self, what: str, default_queue: str, now: float) -> tuple[str, float]:
        """The queue a call of ``what`` (a task name) goes to, and the delay from ``now``
        before it may run; nothing is published when they are refused.

        :raises NotSerializable: a header is not JSON.
        :raises InvalidSchedule: see :func:`schedule_delay`.
        :raises PublishError: an invalid queue name.
        """
        if self.headers:
            check_json(what, "headers", self.headers)
        delay = schedule_delay(what, self.countdown, self.eta, now)
        queue = check_queue_name(self.queue) if self.queue is not None else default_queue
        return queue, delay


_set_countdown, _set_eta, _set_queue, _set_headers, _set_id, _set_priority = (
    vars(SendOptions)[f.name].__set__ for f in dataclasses.fields(SendOptions)
)

#: A call given no options (``delay()``, ``task.s(...)``, ``map``): the task's defaults.
NO_OPTIONS = SendOptions()


def schedule_delay(
    what: str, countdown: float | None, eta: dt.datetime | None, now: float
) -> float:
    """Turn ``countdown`` / ``eta`` into a delay in seconds, refusing what cannot be meant
    (:class:`InvalidSchedule`: both given, a negative or non-finite countdown, a naive eta)."""
    if countdown is not None and eta is not None:
        raise InvalidSchedule(f"{what}: give countdown or eta, not both; nothing was published")
    if countdown is not None:
        if isinstance(countdown, bool) or not isinstance(countdown, int | float):
            raise InvalidSchedule(
                f"{what}: countdown must be a number of seconds, got {type(countdown).__name__}"
            )
        if not math.isfinite(countdown) or countdown < 0:
            raise InvalidSchedule(
                f"{what}: countdown must be a finite number of seconds >= 0, got {countdown!r}; "
                "nothing was published"
            )
        return float(countdown)
    if eta is not None:
        if not isinstance(eta, dt.datetime):
            raise InvalidSchedule(f"{what}: eta must be a datetime, got {type(eta).__name__}")
        if eta.tzinfo is None or eta.utcoffset() is None:
            raise InvalidSchedule(
                f"{what}: eta {eta.isoformat()} is naive; give an aware datetime, e.g. "
                "datetime.now(timezone.utc) + timedelta(minutes=5); nothing was published"
            )
        return max(0.0, eta.timestamp() - now)
    return 0.0


class TaskApp(Protocol):
    """What a task, its calls and the workflows made of them need of the App they belong to.

    :class:`ackwise.App` is one.  Package-internal: the methods below are ackwise's own
    (workflows, tasks, eager mode), not part of the API; they are here so that this module,
    and those below the App, need not import it.
    """

    @property
    def name(self) -> str: ...

    @property
    def broker(self) -> BrokerURL: ...

    @property
    def plugins(self) -> Plugins: ...

    @property
    def store_results(self) -> bool: ...

    @property
    def result_store_url(self) -> str | None: ...

    def send_call(
        self,
        task: Task[..., Any] | str,
        args: Sequence[Any] | None,
        kwargs: dict[str, Any] | None,
        options: SendOptions,
    ) -> TaskHandle: ...

    def send_many(self, calls: Iterable[Signature]) -> list[TaskHandle]: ...

    def handle(self, message_id: str, task: Task[..., Any] | str) -> TaskHandle: ...

    def target(self, task: Task[..., Any] | str) -> tuple[str, str]: ...

    def call_priority(self, task: Task[..., Any] | str, priority: int | None) -> int: ...


class Task(Generic[P, R]):
    """A registered task.  Calling it runs the function here; ``delay`` sends it."""

    def __init__(
        self,
        app: TaskApp,
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
        return self.app.send_call(self, args, kwargs, NO_OPTIONS)

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
        options = SendOptions(countdown, eta, queue, headers, id, priority)
        return self.app.send_call(self, args, kwargs, options)

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
