"""The harness a crash scenario drives: a broker, a queue, worker processes, a journal.

One :class:`Harness` serves one (scenario, mode) case.  It publishes journalled tasks, starts
real ``ackwise worker`` processes (or, for the in-process memory broker, in-process workers),
injects faults at barriers, and reads the broker's own view for the checker.  The broker views
live in :mod:`~ackwise_conformance.broker_views`, the process handles in
:mod:`~ackwise_conformance.processes`, the verdict exceptions in
:mod:`~ackwise_conformance.verdicts`; they are importable from here too.
"""

from __future__ import annotations

import os
import signal
import socket
import threading
import time
import uuid
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from ackwise import (
    Ack,
    Adapter,
    App,
    BrokerURL,
    DeadLetter,
    LeaderLock,
    QueueStats,
    chain,
    chord,
    get_plugins,
    open_adapter,
    open_idempotency_store,
    open_result_store,
    open_worker_registry,
)
from ackwise.errors import AdapterError, ConfigurationError, TransientAdapterError
from ackwise.spi import QueueSpec
from ackwise.testing import InProcessWorker
from ackwise_conformance._harness_beat import BeatControl
from ackwise_conformance.broker_views import (
    DEFAULT_PREFIX,
    LEASE,
    Broker,
    OwnStore,
    SimpleBroker,
    WithOptions,
    lease_url,
    own_store,
    own_store_url,
    with_lease_options,
    with_options,
)
from ackwise_conformance.checker import History
from ackwise_conformance.helpers import eventually
from ackwise_conformance.journal import Journal
from ackwise_conformance.processes import BeatHandle, Fire, WorkerHandle, process_stopped
from ackwise_conformance.verdicts import NotApplicable, Pending, ScenarioFailed
from ackwise_conformance.workload import build_app, callback_name, task_name

#: EARLY on a broker without a global in-flight count: how long the journal must stay quiet
#: (before the time scale) before the messages that never started count as lost.
EARLY_QUIET = 10.0

#: Seconds between the drain's counts of finished messages (a read of the whole journal).
DRAIN_PROGRESS_EVERY = 1.0

#: What a scenario's waits raise once its case was closed from another thread.
CLOSED = "the case was closed (the run was interrupted or timed out)"

__all__ = [
    "DEFAULT_PREFIX",
    "LEASE",
    "BeatHandle",
    "Broker",
    "Fire",
    "Harness",
    "NotApplicable",
    "OwnStore",
    "Pending",
    "ScenarioFailed",
    "SimpleBroker",
    "WithOptions",
    "WorkerHandle",
    "expect",
    "lease_url",
    "own_store",
    "process_stopped",
    "with_lease_options",
    "with_options",
]


class Harness(BeatControl):
    """Everything one (scenario, mode) case needs."""

    def __init__(
        self,
        broker: Broker,
        mode: Ack | None,
        workdir: Path,
        *,
        time_scale: float = 1.0,
        multi_process: bool | None = None,
        prefix: str = DEFAULT_PREFIX,
    ) -> None:
        self.broker = broker
        #: Starts the name of every queue, beat app and idempotency key the case creates.
        self.prefix = prefix
        self.mode = mode or Ack.LATE
        self.workdir = workdir
        workdir.mkdir(parents=True, exist_ok=True)
        self.scale = time_scale
        self.lease = LEASE * time_scale
        self.queue = f"{prefix}{uuid.uuid4().hex[:12]}"
        self.journal = Journal(workdir / "journal.jsonl")
        self.gates = workdir / "gates"
        self.gates.mkdir(exist_ok=True)
        self.adapter: Adapter = open_adapter(broker.url)
        self.adapter.open()
        self.adapter.declare(QueueSpec(self.queue, max_deliveries=3))
        caps = self.adapter.capabilities
        self.capabilities = caps
        self.multi_process = caps.multi_process if multi_process is None else multi_process
        self._env = {
            **os.environ,
            "ACKWISE_BROKER_URL": broker.url,
            "ACKWISE_CONFORMANCE_JOURNAL": str(self.journal.path),
            "ACKWISE_CONFORMANCE_GATES": str(self.gates),
            "ACKWISE_LOGLEVEL": os.environ.get("ACKWISE_CONFORMANCE_LOGLEVEL", "INFO"),
            # The journal records every execution: the task log's routine lines (two a task,
            # ~15 µs each) would only load the host the concurrent cases share.  Its warnings
            # (stale receipts, failures) stay.
            "ACKWISE_TASK_LOGLEVEL": os.environ.get("ACKWISE_CONFORMANCE_TASK_LOGLEVEL", "WARNING"),
        }
        # A broker without an idempotency store of its own (SQS) keeps the case's keys in a
        # SQLite file: what its users configure (App(idempotency_store=…), docs/idempotency.md).
        store: str | None = None
        if get_plugins().adapters.idempotency_store(BrokerURL.parse(broker.url).scheme) is None:
            store = f"sqlite:///{workdir / 'idempotency.db'}"
            self._env["ACKWISE_CONFORMANCE_IDEMPOTENCY_STORE"] = store
        self._store_url = store
        # The case's records in the broker's own stores are named like its queue where the
        # store has namespaces (Redis: ``{<prefix>:<queue>}:workers``), and deleted when it
        # closes (forget).
        #: Where this case's chords count their members and workers given ``results=`` store
        #: results: the broker's own result store where its adapter has one, else a SQLite
        #: file of the case (the workers share the host).
        self.result_store_url = (
            own_store_url("result", broker.url, self.queue) or f"sqlite:///{workdir / 'results.db'}"
        )
        #: Where the case's workers announce themselves: the broker's own registry, or none.
        self.worker_registry_url = own_store_url("worker registry", broker.url, self.queue)
        if self.worker_registry_url is not None:
            self._env["ACKWISE_CONFORMANCE_WORKER_REGISTRY"] = self.worker_registry_url
        # The producer's app: no result is stored by sending, the URL lets it send chords.
        self.app: App = build_app(
            broker.url, idempotency_store=store, result_store=self.result_store_url
        )
        self.workers: list[WorkerHandle] = []
        self.beats: list[BeatHandle] = []
        self._beat_app = f"{prefix}beat-{uuid.uuid4().hex[:12]}"
        self._lock: LeaderLock | None = None
        self._fires: dict[str, list[Fire]] = {}
        self._extra_queues: set[str] = set()
        self._beat_groups: set[str] = set()  # each group of beats has a lock of its own
        self._published: dict[str, str] = {}  # message id -> key
        self._idempotency_keys: dict[str, str] = {}  # message id -> its idempotency key
        self._store_keys: set[str] = set()  # as the idempotency store holds them
        self._result_ids: set[str] = set()  # records this case's chords leave in the store
        self._stores_results = False  # a worker was given results=: records of any message
        self._probe: Adapter | None = None
        self._probe_thread: threading.Thread | None = None
        self._closed = False
        self._closed_event = threading.Event()
        self._close_lock = threading.Lock()
        # Held while the scenario makes something on the broker or starts a process, and by
        # the close (from another thread) once the case is marked closed: what the close
        # deletes cannot be made again behind it.
        self._gate = threading.Lock()

    # -- time ------------------------------------------------------------------------------
    def t(self, seconds: float) -> float:
        """``seconds`` scaled by the suite's time scale."""
        return seconds * self.scale

    @property
    def patience(self) -> float:
        return 30.0 * self.scale

    # -- requirements ----------------------------------------------------------------------
    def require_processes(self, why: str = "worker processes") -> None:
        if not self.multi_process:
            raise NotApplicable(
                f"needs {why}: the {self.broker.name} broker lives in one process "
                "(capability multi_process=False)"
            )

    # -- publishing ------------------------------------------------------------------------
    @property
    def task(self) -> Any:
        return self.app.tasks[task_name(self.mode)]

    def publish(
        self,
        keys: Sequence[str],
        plan: dict[str, Any] | None = None,
        *,
        countdown: float | None = None,
        mode: Ack | None = None,
        headers: dict[str, Any] | None = None,
    ) -> list[str]:
        """Publish one task per key (one batch), journalling invoke / ok / failed."""
        task = self.app.tasks[task_name(mode or self.mode)]
        options: dict[str, Any] = {"queue": self.queue}
        if countdown is not None:
            options["countdown"] = countdown
        if headers:
            options["headers"] = headers
        calls = []
        for key in keys:
            sig = task.s(key, plan or {})
            calls.append(type(sig)(sig.task, sig.args, sig.kwargs, options))
        self.journal.write("publish-invoke", keys=list(keys))
        try:
            with self._gate:
                self._check_open()
                ids = self.app.send_many(calls)
        except AdapterError as exc:
            kind = "publish-indeterminate" if exc.transient else "publish-failed"
            self.journal.write(kind, keys=list(keys), error=str(exc))
            raise
        except Exception as exc:
            self.journal.write("publish-failed", keys=list(keys), error=str(exc))
            raise
        for key, mid in zip(keys, ids, strict=True):
            self._published[mid] = key
            if headers and headers.get("idempotency_key"):
                self._idempotency_keys[mid] = str(headers["idempotency_key"])
                self._store_keys.add(f"{task.name}:{headers['idempotency_key']}")
        self.journal.write("publish-ok", ids=ids, keys=list(keys))
        return [str(i) for i in ids]

    def publish_chord(
        self,
        keys: Sequence[str],
        plans: Mapping[str, dict[str, Any]] | None = None,
        *,
        callback: str = "",
    ) -> tuple[list[str], str]:
        """Send a chord of one workload task per key (``plans``: by key, default none) whose
        callback is the mode's :func:`callback_name` task; return the members' ids and the
        callback's.

        The members are published messages of the case; the callback is one too when it has
        a key (``callback``: it must run), else it must never run (checked as unexpected).
        Their records and the callback's idempotency key are forgotten when the case closes.
        """
        task = self.app.tasks[task_name(self.mode)]
        collect = self.app.tasks[callback_name(self.mode)]
        ids = [uuid.uuid4().hex for _ in keys]
        callback_id = uuid.uuid4().hex
        members = [
            task.s(key, (plans or {}).get(key, {})).set(queue=self.queue, id=mid)
            for key, mid in zip(keys, ids, strict=True)
        ]
        flow = chord(
            members,
            collect.s(callback or "callback").set(queue=self.queue, id=callback_id),
            app=self.app,
        )
        self.journal.write("publish-invoke", keys=list(keys))
        with self._gate:
            self._check_open()
            self._result_ids.update([*ids, callback_id])
            self._store_keys.add(f"{collect.name}:chord:{callback_id}")
            flow.apply_async()
        self._published.update(zip(ids, keys, strict=True))
        if callback:
            self._published[callback_id] = callback
        self.journal.write("publish-ok", ids=ids, keys=list(keys))
        return ids, callback_id

    def publish_chain(self, keys: Sequence[str]) -> list[str]:
        """Send a chain: the mode's workload task under the first key, then the mode's
        :func:`callback_name` task under each other key (it takes the previous value first);
        return the steps' ids, all published messages of the case."""
        first = self.app.tasks[task_name(self.mode)]
        then = self.app.tasks[callback_name(self.mode)]
        ids = [uuid.uuid4().hex for _ in keys]
        steps = [first.s(keys[0], {}).set(queue=self.queue, id=ids[0])]
        steps += [
            then.s(key).set(queue=self.queue, id=mid)
            for key, mid in zip(keys[1:], ids[1:], strict=True)
        ]
        self.journal.write("publish-invoke", keys=list(keys))
        with self._gate:
            self._check_open()
            self._result_ids.update(ids)
            self._store_keys.update(f"{then.name}:chain:{mid}" for mid in ids[1:])
            chain(*steps, app=self.app).apply_async()
        self._published.update(zip(ids, keys, strict=True))
        self.journal.write("publish-ok", ids=ids, keys=list(keys))
        return ids

    def idempotency_key(self, name: str) -> str:
        """A new idempotency key of this run (its prefix, ``name``, a unique part)."""
        return f"{self.prefix}{name}-{uuid.uuid4().hex[:8]}"

    @property
    def published(self) -> dict[str, str]:
        return dict(self._published)

    # -- workers ---------------------------------------------------------------------------
    def worker(
        self,
        *,
        pool: str = "prefork",
        concurrency: int = 1,
        prefetch: int | None = None,
        lease: float | None = None,
        grace: float | None = None,
        url: str | None = None,
        wait_ready: bool = True,
        extra_args: Sequence[str] = (),
        env: Mapping[str, str] | None = None,
        results: str | None = None,
    ) -> WorkerHandle:
        """Start a worker on the case's queue (``env``: more environment for its process;
        ``results``: the result store URL its tasks store their results in)."""
        self._check_open()
        self._stores_results |= results is not None
        lease = self.lease if lease is None else lease
        index = len(self.workers)
        if not self.multi_process:
            if url is not None:
                raise NotApplicable("an in-process broker cannot be reached through a proxy")
            app = build_app(
                self.broker.url,
                idempotency_store=self._store_url,
                journal=str(self.journal.path),
                gates=str(self.gates),
                result_store=results,
                worker_registry=self.worker_registry_url,
            )
            with self._gate:
                self._check_open()
                ipw = InProcessWorker(
                    app,
                    queues=[self.queue],
                    concurrency=concurrency,
                    lease=lease,
                    prefetch=prefetch or 0,
                ).start()
                handle = WorkerHandle(self, index, [], {}, in_process=ipw)
                self.workers.append(handle)
            return handle
        args = ["-Q", self.queue, "--pool", pool, "-c", str(concurrency), "--lease", str(lease)]
        if prefetch is not None:
            args += ["--prefetch", str(prefetch)]
        if grace is not None:
            args += ["--grace", str(grace)]
        args += list(extra_args)
        env = {**self._env, **(env or {})}
        if results is not None:
            env["ACKWISE_CONFORMANCE_RESULT_STORE"] = results
        if url is not None:
            env["ACKWISE_BROKER_URL"] = url
        with self._gate:
            self._check_open()
            handle = WorkerHandle(self, index, args, env)
            self.workers.append(handle)
        if wait_ready:
            handle.wait_ready(self.patience * 2)
        return handle

    # -- barriers --------------------------------------------------------------------------
    def open_gate(self, name: str) -> None:
        (self.gates / name).touch()

    def wait_for(
        self, event: str, *, count: int = 1, timeout: float | None = None, **match: Any
    ) -> list[dict[str, Any]]:
        """Wait until the journal holds ``count`` records of ``event`` matching ``match``."""

        def enough() -> list[dict[str, Any]]:
            self._check_open()
            recs = self.journal.records(ev=event, **match)
            return recs if len(recs) >= count else []

        return eventually(
            enough,
            self.patience if timeout is None else timeout,
            description=f"{count} journal record(s) {event} {match}",
        )

    def kill_pid(self, pid: int) -> None:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass

    def write_gets_through(self, timeout: float) -> bool:
        """Whether a write to the broker (a ``declare``) completes within ``timeout`` seconds.

        A process frozen inside a SQLite write transaction holds every other writer of the
        file until it runs again.  The probe runs on a thread of its own with an adapter of
        its own; one that did not get through finishes once the writer runs again.  While an
        earlier probe still waits, the answer is no (waiting on it here would keep the whole
        store frozen for as long as its busy timeout).
        """
        if self._probe_thread is not None:
            self._probe_thread.join(timeout)
            if self._probe_thread.is_alive():
                return False
        if self._probe is None:
            self._probe = open_adapter(self.broker.url)
            self._probe.open()
        probe = self._probe

        def write() -> None:
            try:
                probe.declare(QueueSpec(self.queue, max_deliveries=3))
            except AdapterError:
                pass  # a write that failed did not get through either

        thread = threading.Thread(target=write, name="write-probe", daemon=True)
        thread.start()
        thread.join(timeout)
        if thread.is_alive():
            self._probe_thread = thread
            return False
        self._probe_thread = None
        return True

    # -- the broker's view -----------------------------------------------------------------
    # Reads take the gate too: an adapter may declare a queue it is asked about and does not
    # know (SQS resolves a queue by declaring it when it is missing), and a read racing the
    # close from another thread would make the case's queue again behind its deletion.
    def stats(self) -> QueueStats:
        with self._gate:
            self._check_open()
            return self.adapter.stats(self.queue)

    def dead_letters(self) -> list[DeadLetter]:
        with self._gate:
            self._check_open()
            return list(self.adapter.dead_letters(self.queue, limit=10_000))

    @property
    def counts_in_flight(self) -> bool:
        """Whether ``stats().in_flight`` counts what every consumer holds.

        RabbitMQ without its management API counts only the suite's own connection: what the
        workers hold is then known from the journal only (see :meth:`settled`).
        """
        return self.capabilities.global_in_flight

    def settled(self, *, delayed: bool = True) -> bool:
        """Nothing ready (or delayed) on the case's queue and nothing held by a worker."""
        st = self.stats()
        if st.ready or (delayed and st.delayed):
            return False
        if self.counts_in_flight and st.in_flight:
            return False
        # The journal must agree even where the broker counts everything: its totals can lag
        # (RabbitMQ's management API: messages published a moment ago not counted yet).
        if self.accounted():
            return True
        # EARLY, on a broker that cannot count what the workers hold: a message whose early
        # ack was recorded while its answer was lost never starts (the worker does not run
        # what it cannot vouch for) and is gone from the broker.  Once nothing has been
        # journalled for a while, what has not started will not: it is lost (the checker
        # bounds how many may be).
        return self.mode is Ack.EARLY and self._journal_quiet_for(self.t(EARLY_QUIET))

    def _journal_quiet_for(self, seconds: float) -> bool:
        try:
            last = self.journal.path.stat().st_mtime
        except FileNotFoundError:
            return False
        return time.time() - last >= seconds

    def accounted(self) -> bool:
        """Every published message ended, is a dead letter, or (``EARLY``) started.

        What a broker that cannot count the workers' deliveries leaves to the journal: a
        message neither ready nor delayed that has not ended is still held by a worker.  A
        message skipped for its idempotency key counts once another one with that key ended;
        an early-acked task that started may be lost (the checker decides).
        """
        records = self.journal.records()
        ended, done = self._done(records)
        started = {r.get("id") for r in records if r["ev"] == "start"}
        if self.mode is Ack.EARLY:
            done |= started
        keys_done = {k for mid, k in self._idempotency_keys.items() if mid in ended}
        return all(
            mid in done or self._idempotency_keys.get(mid) in keys_done for mid in self._published
        )

    def drain(self, timeout: float | None = None) -> None:
        """Wait until nothing is ready, delayed or in flight on the case's queue, and the
        journal has gone quiet (an early-acked task is no longer in flight at the broker but
        may still be running: its end must be in the journal before the checker reads it).

        Fails once ``timeout`` seconds (default twice the patience) pass in which no further
        message finished: a slow broker that keeps finishing messages is not a lost one.
        """
        limit = self.patience * 2 if timeout is None else timeout
        started = time.monotonic()
        finished, last_progress = self._finished_or(0), started
        next_count = started + DRAIN_PROGRESS_EVERY
        pause = 0.005
        while True:
            if self._settled_or_unknown():
                size = self._journal_size()
                time.sleep(0.25)
                if (
                    self._journal_size() == size
                    and self._settled_or_unknown()
                    and self._stays_settled()
                ):
                    return
            now = time.monotonic()
            if now >= next_count:
                count, next_count = self._finished_or(finished), now + DRAIN_PROGRESS_EVERY
                if count > finished:
                    finished, last_progress = count, now
            if now - last_progress >= limit:
                self._not_drained(now - started, limit)
            time.sleep(min(pause, max(0.0, last_progress + limit - now)))
            pause = min(pause * 2, 0.2)

    def _stays_settled(self) -> bool:
        """Whether the broker stays settled for one lease, where the journal cannot tell.

        On a broker that cannot count what the workers hold (``global_in_flight=False``), a
        message id that ended can still have a copy in a worker's hands: a chain step or a
        chord callback sent again by a redelivered step, or a message whose idempotency key
        another one holds, about to be acked as a no-op or published again to wait for the
        key (neither runs the task, so neither is journalled); and a late ack, with the
        result written before it, follows the end the journal shows.  A case that sent such
        messages watches the broker for one lease: a copy published again shows as ready or
        delayed.  Elsewhere the broker's in-flight count already says it.
        """
        if self.counts_in_flight or not (self._idempotency_keys or self._result_ids):
            return True
        until = time.monotonic() + self.lease
        while time.monotonic() < until:
            if not self._settled_or_unknown():
                return False
            time.sleep(0.05)
        return True

    # The suite's own reads while it waits may meet a broker still recovering (after a failover
    # a queue's new leader is still being elected: RabbitMQ answers "nodedown"): such a read
    # counts as no news, and the drain's patience bounds the wait as for a slow broker.
    def _settled_or_unknown(self) -> bool:
        try:
            return self.settled()
        except TransientAdapterError:
            return False

    def _finished_or(self, known: int) -> int:
        try:
            return self._finished()
        except TransientAdapterError:
            return known

    def _finished(self) -> int:
        """How many of the published messages ended or are dead letters (the drain's progress)."""
        self._check_open()
        return len(self._published.keys() & self._done(self.journal.records())[1])

    def _done(self, records: list[dict[str, Any]]) -> tuple[set[Any], set[Any]]:
        """The ids that ended (journal), and those plus the dead letters' (broker)."""
        ended = {r.get("id") for r in records if r["ev"] == "end"}
        return ended, ended | {d.message_id for d in self.dead_letters()}

    def _journal_size(self) -> int:
        try:
            return self.journal.path.stat().st_size
        except FileNotFoundError:
            return 0

    def _not_drained(self, waited: float, stalled: float) -> None:
        """Fail naming the messages that never finished, and what the journal shows of them."""
        history = self.history()
        unfinished = [
            f for f in history.fates.values() if f.published and f.status in ("lost", "duplicated")
        ]
        unfinished.sort(key=lambda f: f.status != "lost")
        stats = self.stats()
        held = stats.ready + stats.delayed + (stats.in_flight if self.counts_in_flight else 0)
        if held and not any(f.status == "lost" for f in unfinished):
            raise ScenarioFailed(
                f"a settlement did not remove its message: every message completed or was "
                f"dead-lettered, yet after {waited:.0f}s the broker still holds {held} (ready "
                f"{stats.ready}, delayed {stats.delayed}, in flight {stats.in_flight}) in queue "
                f"{self.queue}; summary {history.summary()}"
            )
        history.fail(
            f"queue {self.queue} did not drain: no message finished for {stalled:.0f}s "
            f"({waited:.0f}s in all); {len(unfinished)} message(s) unfinished, the broker "
            f"shows {stats}",
            *unfinished,
        )

    def quiet(self, seconds: float) -> None:
        """Let ``seconds`` pass so that anything that should not happen has had its chance."""
        self._closed_event.wait(seconds)
        self._check_open()

    # -- checking --------------------------------------------------------------------------
    def history(self) -> History:
        return History.build(self)

    # -- cleanup ---------------------------------------------------------------------------
    @property
    def closed(self) -> bool:
        """Whether :meth:`close` ran (the case finished, timed out or was interrupted)."""
        return self._closed

    def _check_open(self) -> None:
        """Raise in the scenario's thread once the case was closed from another one: its
        waits end at their next poll instead of at their timeout."""
        if self._closed:
            raise ScenarioFailed(CLOSED)

    def close(self) -> None:
        """Stop every process of the case and delete what it made on the broker (once; from
        any thread: an interrupted run closes the cases still running)."""
        with self._close_lock:
            if self._closed:
                return
            self._closed = True
            self._closed_event.set()
            with self._gate:
                self._close()

    def _close(self) -> None:
        handles: list[WorkerHandle | BeatHandle] = [*self.workers, *self.beats]
        for w in handles:
            try:
                w.close()
            except Exception:
                pass
        # Stopped workers write no more: their records go, and the result records of every
        # message of the case (read before its queues, which hold its dead letters, go).
        self._forget_workers()
        self._forget_results()
        if self._beat_groups:
            try:
                for group in sorted(self._beat_groups):
                    self.beat_lock.delete(self.beat_lock_name(group))
            except (AdapterError, ConfigurationError):
                pass
        if self._lock is not None:
            try:
                self._lock.close()
            except AdapterError:
                pass
        if self._probe is not None:
            if self._probe_thread is not None:
                self._probe_thread.join(30)
            try:
                self._probe.close()
            except AdapterError:
                pass
        for queue in (self.queue, *sorted(self._extra_queues)):
            try:
                self.adapter.delete_queue(queue)
            except AdapterError:
                pass
        if self._store_keys:
            try:
                store = open_idempotency_store(self._store_url or self.broker.url)
                try:
                    store.forget(sorted(self._store_keys))
                finally:
                    store.close()
            except (AdapterError, ConfigurationError):
                pass
        try:
            self.adapter.close()
        finally:
            self.app.close()

    def _forget_workers(self) -> None:
        """Delete the registry records of the case's workers (by ``host:pid``)."""
        if self.worker_registry_url is None or not self.workers:
            return
        host = socket.gethostname()
        ids = sorted(
            {
                w.in_process.worker.worker_id if w.in_process else f"{host}:{w.pid}"
                for w in self.workers
            }
        )
        try:
            registry = open_worker_registry(self.worker_registry_url)
            try:
                registry.forget(ids)
            finally:
                registry.close()
        except (AdapterError, ConfigurationError):
            pass

    def _forget_results(self) -> None:
        """Delete the result records (and chord counts) of every message of the case: those
        it published or sent in a chord or chain, those the journal saw run (retries, beat
        fires) and its dead letters (a message published past the app, C16's).  Only records
        a chord, a chain or a worker given ``results=`` may have written: other cases wrote
        none."""
        if not (self._stores_results or self._result_ids):
            return
        ids = set(self._published) | self._result_ids
        try:
            ids |= {str(r["id"]) for r in self.journal.records() if r.get("id")}
        except (OSError, ValueError):
            pass  # what could be read is forgotten
        for queue in (self.queue, *sorted(self._extra_queues)):
            try:
                ids |= {d.message_id for d in self.adapter.dead_letters(queue, limit=10_000)}
            except AdapterError:
                pass
        if not ids:
            return
        try:
            results = open_result_store(self.result_store_url)
            try:
                results.forget(sorted(ids))
            finally:
                results.close()
        except (AdapterError, ConfigurationError):
            pass


def expect(condition: object, message: str, harness: Harness | None = None, *ids: str) -> None:
    """Raise :class:`ScenarioFailed` with ``message`` (and the journal lines of ``ids``)."""
    if condition:
        return
    details = ""
    if harness is not None:
        for mid in ids:
            lines = harness.journal.lines_for(mid)
            details += f"\n  journal of {mid}:\n    " + "\n    ".join(lines or ["(nothing)"])
    raise ScenarioFailed(message + details)


Check = Callable[[Harness], None]
