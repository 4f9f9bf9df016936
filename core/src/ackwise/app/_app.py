"""The App: a broker, its tasks, and publishing their calls."""

from __future__ import annotations

import contextlib
import datetime as dt
import os
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import TYPE_CHECKING, Any, ParamSpec, TypeVar, overload

from ackwise.app import _tracing
from ackwise.app._handle import TaskHandle
from ackwise.app._policy import check_priority, check_publish
from ackwise.app._requirements import check_app, check_app_options, check_task, missing_store
from ackwise.app._schedule import Periodic, Schedule, declare, make_schedule
from ackwise.app._task import TRANSIENT_ERRORS, SendOptions, Signature, Task, TaskOptions
from ackwise.app._transaction import current as current_transaction
from ackwise.app._transaction import enlist
from ackwise.contract import _envelope
from ackwise.contract._envelope import check_queue_name
from ackwise.contract._semantics import Ack
from ackwise.contract._spi import Adapter, BrokerURL, Capabilities, Outgoing, QueueSpec
from ackwise.errors import ConfigurationError
from ackwise.plugins._manager import Plugins, get_plugins, open_result_store
from ackwise.stores._results import RESULT_TTL, ResultStore

if TYPE_CHECKING:
    from ackwise.app._ports import Diversion

__all__ = ["App"]

P = ParamSpec("P")
R = TypeVar("R")

DEFAULT_BROKER = "sqlite:///ackwise.db"


class App:
    """An ackwise application: a broker URL and the tasks registered on it.

    :param broker: the broker URL; default ``$ACKWISE_BROKER_URL``, else
        ``sqlite:///ackwise.db`` (the embedded default).  An unknown scheme is an error.
    :param idempotency_store: URL of the idempotency key store (``sqlite:///…``,
        ``postgresql://…``, ``redis://…``); default: the broker's own where it has one.
    :param rate_limit_store: URL of the store of rate limits (``sqlite:///…``,
        ``redis://…``); default: the broker's own where it has one (docs/rate-limits.md).
    :param worker_registry: URL of the store where workers announce themselves
        (``sqlite:///…``, ``redis://…``, ``postgresql://…``); default: the broker's own where
        it has one (docs/workers.md).
    """

    def __init__(
        self,
        name: str,
        broker: str | None = None,
        *,
        default_queue: str = "default",
        plugins: Plugins | None = None,
        idempotency_store: str | None = None,
        result_store: str | None = None,
        store_results: bool = False,
        result_ttl: float = RESULT_TTL,
        rate_limit_store: str | None = None,
        worker_registry: str | None = None,
    ) -> None:
        self.name = name
        self.broker_url = broker or os.environ.get("ACKWISE_BROKER_URL") or DEFAULT_BROKER
        self.plugins = plugins or get_plugins()
        parsed = BrokerURL.parse(self.broker_url)
        # Fail now on an unknown scheme: never fall back to another broker.
        self._adapter_cls = self.plugins.adapters.get(parsed.scheme).load()
        self._broker = parsed
        #: Where idempotency keys live: the given URL, else the broker's own store if its
        #: adapter provides one (SQLite: the same file; memory: in-process).
        self.idempotency_store_url = self._own("idempotency", idempotency_store)
        #: Where task results live: the given URL, else the broker's own store if its adapter
        #: provides one (SQLite: the same file; memory: in-process; Redis: the same server).
        self.result_store_url = self._own("result", result_store)
        #: Where rate-limited tasks reserve and record their starts: the given URL, else the
        #: broker's own limiter if its adapter provides one (memory, SQLite, Redis).
        self.rate_limit_store_url = self._own("rate limit", rate_limit_store)
        #: Where workers announce themselves (``ackwise workers``): the given URL, else the
        #: broker's own registry if its adapter provides one (memory, SQLite, Redis, PostgreSQL).
        self.worker_registry_url = self._own("worker registry", worker_registry)
        if not (isinstance(result_ttl, int | float) and result_ttl > 0):
            raise ConfigurationError(
                f"result_ttl must be a number of seconds > 0, got {result_ttl!r}"
            )
        self.store_results = bool(store_results)
        self.result_ttl = float(result_ttl)
        self._results: ResultStore | None = None
        self.default_queue = check_queue_name(default_queue)
        self.tasks: dict[str, Task[..., Any]] = {}
        self._schedules: dict[str, Periodic] = {}
        self._producer: Adapter | None = None
        self._capabilities: Capabilities | None = None
        self._declared: set[str] = set()
        self._lock = threading.Lock()
        # Eager mode (``ackwise.testing.eager``): sends run there instead of being published.
        self._diversion: Diversion | None = None
        #: The first send checks the app and its tasks as a worker's start does
        #: (:func:`ackwise.app._requirements.check_app`); later sends need not.
        self._checked = False
        # What a worker would refuse at start, refused here (registry lookups only).
        check_app_options(self)

    def __repr__(self) -> str:
        return f"<App {self.name} broker={self._broker}>"

    def _own(self, kind: str, given: str | None) -> str | None:
        """``given``, else the broker's URL where its adapter's plugin has a ``kind`` store."""
        if given:
            return given
        own = self.plugins.adapters.store_class(kind, self._broker.scheme)
        return self.broker_url if own is not None else None

    # -- tasks -----------------------------------------------------------------------------
    @overload
    def task(self, fn: Callable[P, R], /) -> Task[P, R]: ...

    @overload
    def task(
        self,
        *,
        name: str | None = ...,
        ack: Ack = ...,
        queue: str | None = ...,
        max_deliveries: int = ...,
        bind: bool = ...,
        autoretry_for: tuple[type[BaseException], ...] = ...,
        dont_autoretry_for: tuple[type[BaseException], ...] = ...,
        max_retries: int = ...,
        retry_backoff: float = ...,
        retry_backoff_max: float = ...,
        retry_jitter: bool = ...,
        time_limit: float | None = ...,
        soft_time_limit: float | None = ...,
        idempotency_key: Callable[..., str] | None = ...,
        store_results: bool | None = ...,
        track_started: bool = ...,
        rate_limit: str | None = ...,
        priority: int = ...,
    ) -> Callable[[Callable[P, R]], Task[P, R]]: ...

    def task(  # type: ignore[misc]  # the decorator-factory overload binds P, R late
        self,
        fn: Callable[P, R] | None = None,
        /,
        *,
        name: str | None = None,
        ack: Ack = Ack.LATE,
        queue: str | None = None,
        max_deliveries: int = 5,
        bind: bool = False,
        autoretry_for: tuple[type[BaseException], ...] = TRANSIENT_ERRORS,
        dont_autoretry_for: tuple[type[BaseException], ...] = (),
        max_retries: int = 3,
        retry_backoff: float = 1.0,
        retry_backoff_max: float = 600.0,
        retry_jitter: bool = True,
        time_limit: float | None = None,
        soft_time_limit: float | None = None,
        idempotency_key: Callable[..., str] | None = None,
        store_results: bool | None = None,
        track_started: bool = False,
        rate_limit: str | None = None,
        priority: int = 0,
    ) -> Task[P, R] | Callable[[Callable[P, R]], Task[P, R]]:
        """Register a task.  Usable bare (``@app.task``) or with options.

        :param name: defaults to ``module.function``.
        :param ack: the delivery mode (``Ack.LATE`` by default).
        :param max_deliveries: deliveries of one message before it is dead-lettered.
        :param autoretry_for: exceptions retried with backoff (default: TRANSIENT_ERRORS).
        :param time_limit: seconds after which the executor is killed (prefork only); the
            mode's worker-lost rule applies with reason ``time_limit``.
        :param soft_time_limit: seconds after which SoftTimeLimitExceeded is raised in the task.
        :param idempotency_key: called with the task's arguments, returns the key under which
            the call has one effect (see docs/idempotency.md).
        :param store_results: store what it returns, or why it failed (default: the app's
            ``store_results``); see docs/results.md.
        :param track_started: also record ``started`` when it starts (one more write a task).
        :param rate_limit: ``"N/s"``, ``"N/m"`` or ``"N/h"``: its starts at least ``1/N`` of
            the unit apart across every worker of the broker (docs/rate-limits.md).
        :param priority: 0 (lowest, the default) to 9: its calls' priority unless a call says
            otherwise; refused on a broker without priorities (docs/priorities.md).
        """
        options = TaskOptions(  # what the decorator refuses, refused before any function
            name=name,
            ack=ack,
            queue=queue,
            max_deliveries=max_deliveries,
            bind=bind,
            autoretry_for=autoretry_for,
            dont_autoretry_for=dont_autoretry_for,
            max_retries=max_retries,
            retry_backoff=retry_backoff,
            retry_backoff_max=retry_backoff_max,
            retry_jitter=retry_jitter,
            time_limit=time_limit,
            soft_time_limit=soft_time_limit,
            idempotency_key=idempotency_key,
            store_results=store_results,
            track_started=track_started,
            rate_limit=rate_limit,
            priority=priority,
        )

        def register(f: Callable[P, R]) -> Task[P, R]:
            return self._register(f, options)

        if fn is not None:
            return register(fn)
        return register

    def _register(self, f: Callable[P, R], options: TaskOptions) -> Task[P, R]:
        """Register ``f`` as a task with ``options`` (what :meth:`task` decorates it with)."""
        task_name = options.name or f"{f.__module__}.{f.__qualname__}"
        if task_name in self.tasks and self.tasks[task_name].fn is not f:
            raise ConfigurationError(f"task name {task_name!r} is registered twice")
        check_priority(
            f"task {task_name!r}",
            options.priority,
            lambda: self.capabilities,
            self._broker.scheme,
            ConfigurationError,
        )
        t: Task[P, R] = Task(
            self,
            f,
            name=task_name,
            ack=options.ack,
            queue=check_queue_name(options.queue or self.default_queue),
            max_deliveries=options.max_deliveries,
            bind=options.bind,
            retry=options.retry,
            time_limit=options.time_limit,
            soft_time_limit=options.soft_time_limit,
            idempotency_key=options.idempotency_key,
            store_results=options.store_results,
            track_started=options.track_started,
            rate_limit=options.rate_limit,
            priority=options.priority,
        )
        check_task(self, t)  # what a worker would refuse at start, refused here
        self.tasks[task_name] = t
        return t

    def queues(self) -> list[str]:
        """The queues the registered tasks use."""
        return sorted({t.queue for t in self.tasks.values()} or {self.default_queue})

    # -- adapters --------------------------------------------------------------------------
    def adapter(self) -> Adapter:
        """Return a new, unopened adapter for this app's broker."""
        return self._adapter_cls(self._broker)

    @property
    def capabilities(self) -> Capabilities:
        """What this app's broker can do, as its URL configures it (no connection needed)."""
        if self._capabilities is None:
            self._capabilities = self.adapter().capabilities
        return self._capabilities

    @property
    def adapter_class(self) -> type[Adapter]:
        return self._adapter_cls

    @property
    def broker(self) -> BrokerURL:
        return self._broker

    def close(self) -> None:
        """Close the producer connection and the result store."""
        with self._lock:
            if self._producer is not None:
                self._producer.close()
                self._producer = None
                self._declared.clear()
            if self._results is not None:
                self._results.close()
                self._results = None

    def results(self) -> ResultStore:
        """The app's result store, opened on first use (docs/results.md); in eager mode
        (``ackwise.testing.eager``), that mode's records, in memory, instead.

        :raises ConfigurationError: the app has none (set ``App(result_store=URL)``).
        """
        with self._lock:
            if self._results is None or self._diversion is not None:
                if self.result_store_url is None:
                    raise missing_store(self, "result", f"app {self.name!r}", "reading a result")
                if self._diversion is not None:  # eager mode keeps its results in memory
                    return self._diversion.results
                self._results = open_result_store(
                    self.result_store_url, self.plugins, ttl=self.result_ttl
                )
            return self._results

    # -- publishing ------------------------------------------------------------------------
    @contextlib.contextmanager
    def transaction(self, conn: Any) -> Iterator[None]:
        """Send the calls made inside the block in ``conn``'s database transaction: enqueued
        if and only if it commits (docs/outbox.md).

        ``conn``: a psycopg 3 connection, a SQLAlchemy ``Session`` or ``Connection``
        (``postgresql+psycopg://``) or a Django connection, to PostgreSQL, with a transaction
        open (or opened by its first statement).  On a PostgreSQL broker in that database the
        messages are written as the broker's own rows; on any other broker they go to the
        ``ackwise_outbox`` table there, and ``ackwise relay`` publishes them.  The block does
        not commit: the caller's own transaction handling does.

        In eager mode (``ackwise.testing.eager``) the block does not touch ``conn``: calls
        run as they are sent, whether or not the transaction commits.
        """
        if self._diversion is not None:
            yield
            return
        with enlist(self, conn):
            yield

    def send_many(self, calls: Iterable[Signature]) -> list[TaskHandle]:
        """Send many task calls, one broker round trip per queue; return their handles.

        Every call is checked before anything is published: one bad argument publishes none.
        """
        by_queue: dict[str, list[Outgoing]] = {}
        ids: list[TaskHandle] = []
        with _tracing.send_span(self._broker.scheme, None) as span:
            for sig in calls:
                options = SendOptions.of(sig.options)
                if span is not None:
                    options = options.with_headers(span.headers)
                q, out = self._prepare(sig.task, sig.args, sig.kwargs, options)
                by_queue.setdefault(q, []).append(out)
                ids.append(self.handle(out.id, sig.task))
            for q, outs in by_queue.items():
                self._publish(q, outs)
            if span is not None:
                span.sent(ids)
        return ids

    def send(
        self,
        task: str,
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
        """Send a task by name, without importing it; return its handle (the message id).

        The name is checked only as a message's task name: whether a worker knows the task is
        the worker's to decide (``--unknown-task-delay``).  The queue is ``queue``, else the
        queue of the task of that name if this app has one, else the app's default queue.
        The priority is ``priority``, else that task's, else 0.  The other options are
        :meth:`Task.apply_async`'s.

        :raises PublishError: an invalid task or queue name or priority; nothing was published.
        :raises NotSerializable: an argument or header is not JSON; nothing was published.
        """
        options = SendOptions(countdown, eta, queue, headers, id, priority)
        return self.send_call(task, args, kwargs, options)

    def signature(
        self,
        task: str,
        args: Sequence[Any] = (),
        kwargs: dict[str, Any] | None = None,
        **options: Any,
    ) -> Signature:
        """A call of the task named ``task``, for :meth:`send_many`; ``options`` are
        :meth:`send`'s (``countdown``, ``eta``, ``queue``, ``headers``, ``id``, ``priority``)."""
        self.target(task)
        return Signature(task, tuple(args), dict(kwargs or {}), options)

    # -- for ackwise's own modules (:class:`ackwise.app._task.TaskApp`, app._ports) ----------
    # Not part of the API (docs/versioning.md): the API reference does not list them.
    def send_call(
        self,
        task: Task[..., Any] | str,
        args: Sequence[Any] | None,
        kwargs: dict[str, Any] | None,
        options: SendOptions,
    ) -> TaskHandle:
        """Internal: check, trace and publish one call (:meth:`send`, :meth:`Task.apply_async`,
        a chain's first step); return its handle."""
        _, default_queue = self.target(task)
        with _tracing.send_span(self._broker.scheme, options.queue or default_queue) as span:
            if span is not None:
                options = options.with_headers(span.headers)
            q, out = self._prepare(task, args, kwargs, options)
            self._publish(q, [out])
            if span is not None:
                span.sent([out.id])
        return self.handle(out.id, task)

    def handle(self, message_id: str, task: Task[..., Any] | str) -> TaskHandle:
        """Internal: the handle of the message ``message_id`` of ``task`` (a task or a name)."""
        known = task if isinstance(task, Task) else self.tasks.get(task)
        name = task if isinstance(task, str) else task.name
        return TaskHandle(message_id, self, name, known.store_results if known else None)

    def target(self, task: Task[..., Any] | str) -> tuple[str, str]:
        """Internal: the task's name (checked) and its default queue (a name this app does not
        know: the app's)."""
        if isinstance(task, Task):
            return task.name, task.queue
        name = _envelope.check_task_name(task)
        known = self.tasks.get(name)
        return name, known.queue if known is not None else self.default_queue

    def call_priority(self, task: Task[..., Any] | str, priority: int | None) -> int:
        """Internal: a call's priority: the one given, else its task's, else 0; checked."""
        if priority is None:
            known = task if isinstance(task, Task) else self.tasks.get(task)
            return known.priority if known is not None else 0
        name = task.name if isinstance(task, Task) else task
        return check_priority(name, priority, lambda: self.capabilities, self._broker.scheme)

    def producer(self) -> Adapter:
        """Internal: the app's producer connection, opened on first use (the outbox relay
        publishes on it)."""
        with self._lock:
            if self._producer is None:
                producer = self.adapter()
                producer.open()
                self._producer = producer
            return self._producer

    @property
    def diversion(self) -> Diversion | None:
        """Internal: where this app's sends go instead of its broker, or ``None``: eager
        mode's (``ackwise.testing.eager`` sets it for its block)."""
        return self._diversion

    @diversion.setter
    def diversion(self, to: Diversion | None) -> None:
        self._diversion = to

    def _prepare(
        self,
        task: Task[..., Any] | str,
        args: Sequence[Any] | None,
        kwargs: dict[str, Any] | None,
        options: SendOptions,
    ) -> tuple[str, Outgoing]:
        """One call, checked (nothing is published when it is refused) and encoded."""
        if not self._checked:
            check_app(self)  # as a worker's start does: an app changed since it was made
            self._checked = True
        name, default_queue = self.target(task)
        priority = self.call_priority(task, options.priority)
        id = options.id or _envelope.new_id()
        enlisted = current_transaction(self)
        if (
            enlisted is not None
            and enlisted.outbox
            and not (options.headers or {}).get("idempotency_key")
        ):
            # A relay killed between its publish and its delete publishes again: one effect.
            options = options.with_headers({"idempotency_key": f"outbox:{id}"})
        args = list(args) if args is not None else []
        kwargs = dict(kwargs) if kwargs is not None else {}
        if args:
            _envelope.check_json(name, "args", args)
        if kwargs:
            _envelope.check_json(name, "kwargs", kwargs)
        created = time.time()
        q, delay = options.checked(name, default_queue, created)
        env = _envelope.Envelope(
            v=_envelope.ENVELOPE_VERSION,
            id=id,
            task=name,
            args=args,
            kwargs=kwargs,
            queue=q,
            created_at=created,
            eta=created + delay if delay else None,
            priority=priority,
            headers=options.headers or {},
        )
        body = _envelope.encode(env)
        check_publish(name, self._adapter_cls.capabilities, self._broker.scheme, body, delay)
        return q, Outgoing(env.id, body, delay, priority)

    def _publish(self, queue: str, messages: Sequence[Outgoing]) -> None:
        if self._diversion is not None:  # the messages as the broker would get them, run there
            self._diversion.publish(messages)
            return
        enlisted = current_transaction(self)
        if enlisted is not None:
            enlisted.publish(queue, messages)
            return
        producer = self.producer()
        if queue not in self._declared:
            with self._lock:
                if queue not in self._declared:
                    producer.declare(QueueSpec(queue))
                    self._declared.add(queue)
        if producer.capabilities.concurrent_publish:
            producer.publish(queue, messages)  # threads publishing at once share round trips
            return
        with self._lock:
            producer.publish(queue, messages)

    # -- periodic tasks (docs/periodic.md) -----------------------------------------------------
    @property
    def schedules(self) -> dict[str, Periodic]:
        """The periodic schedules declared on this app, by name (``ackwise beat`` fires them)."""
        return self._schedules

    def periodic(
        self,
        task: Task[..., Any] | Signature | str,
        /,
        *,
        every: float | None = None,
        cron: str | None = None,
        tz: str | dt.tzinfo | None = None,
        name: str | None = None,
        args: Sequence[Any] = (),
        kwargs: dict[str, Any] | None = None,
        queue: str | None = None,
        missed: str = "coalesce",
        catch_up_limit: int | None = None,
    ) -> Periodic:
        """Fire ``task`` on a schedule: ``every`` seconds, or at the times of ``cron``.

        :param task: a task of this app, a signature (``task.s(1, 2)``) or a task name.
        :param every: seconds between fires, counted from the Unix epoch (so every process
            computes the same fire times).
        :param cron: a five-field crontab expression (or ``@daily``, ``@hourly`` …).
        :param tz: the zone ``cron`` is read in (an IANA name; default UTC).
        :param name: the schedule's name (default: the task name); part of each fire's
            idempotency key ``name:fire_time``.
        :param queue: where fires are sent (default: the task's queue).
        :param missed: ticks that passed with no leader to fire them: ``"coalesce"`` fires
            once for all of them, ``"catch_up"`` fires each, at most ``catch_up_limit``
            (default 100) of the newest.
        :raises ConfigurationError: an unclear or impossible schedule.
        """
        resolved: Task[..., Any]
        if isinstance(task, Signature):
            if args or kwargs:
                raise ConfigurationError(
                    "give the arguments either in the signature (task.s(...)) or as "
                    "args=/kwargs=, not both"
                )
            sig = task
            task, args, kwargs = sig.task, sig.args, sig.kwargs
        if isinstance(task, Task):
            resolved = task
        elif isinstance(task, str) and task in self.tasks:
            resolved = self.tasks[task]
        elif isinstance(task, str):
            raise ConfigurationError(
                f"periodic: no task named {task!r} is registered on app {self.name!r}"
            )
        else:
            raise ConfigurationError(
                f"periodic: expected a task, a signature (task.s(...)) or a task name, got {task!r}"
            )
        schedule = make_schedule(every, cron, tz)
        if resolved.app is not self or self.tasks.get(resolved.name) is not resolved:
            raise ConfigurationError(
                f"periodic: task {resolved.name!r} is not registered on app {self.name!r}"
            )
        return self._schedule(
            resolved.name, schedule, name, args, kwargs, queue, missed, catch_up_limit
        )

    def _schedule(
        self,
        task: str,
        schedule: Schedule,
        name: str | None,
        args: Sequence[Any],
        kwargs: dict[str, Any] | None,
        queue: str | None,
        missed: str,
        catch_up_limit: int | None,
    ) -> Periodic:
        """Declare ``task``'s schedule (checked against those declared) and keep it."""
        periodic = declare(
            task,
            schedule,
            app=self.name,
            declared=self._schedules,
            name=name,
            args=args,
            kwargs=kwargs,
            queue=queue,
            missed=missed,
            catch_up_limit=catch_up_limit,
        )
        self._schedules[periodic.name] = periodic
        return periodic

    def periodic_task(
        self,
        *,
        every: float | None = None,
        cron: str | None = None,
        tz: str | dt.tzinfo | None = None,
        args: Sequence[Any] = (),
        kwargs: dict[str, Any] | None = None,
        missed: str = "coalesce",
        catch_up_limit: int | None = None,
        **task_options: Any,
    ) -> Callable[[Callable[P, R]], Task[P, R]]:
        """Register a task and its schedule: ``@app.periodic_task(cron="0 3 * * *")``.

        ``task_options`` go to :meth:`task` (``name``, ``queue``, ``ack`` …); the schedule is
        named like the task.  See :meth:`periodic` for the schedule arguments.
        """
        schedule = make_schedule(every, cron, tz)  # refused before the task is registered

        def register(fn: Callable[P, R]) -> Task[P, R]:
            task: Task[P, R] = self.task(**task_options)(fn)
            self._schedule(task.name, schedule, None, args, kwargs, None, missed, catch_up_limit)
            return task

        return register
