"""The beat part of a case's :class:`~ackwise_conformance.harness.Harness` (B01-B04): start
``ackwise beat`` processes, read the lock store and the fires they enqueued."""

from __future__ import annotations

import datetime as dt
import threading
from pathlib import Path
from typing import Any

from ackwise import (
    Adapter,
    BrokerURL,
    LeaderLock,
    LockInfo,
    QueueStats,
    decode_envelope,
    get_plugins,
    open_lock,
)
from ackwise.errors import UnknownBrokerScheme
from ackwise.spi import QueueSpec
from ackwise_conformance.processes import BeatHandle, Fire
from ackwise_conformance.verdicts import NotApplicable

__all__ = ["BeatControl"]

_EPOCH = dt.datetime(1970, 1, 1, tzinfo=dt.UTC)
_US = dt.timedelta(microseconds=1)


class BeatControl:
    """Mixed into the Harness, whose state it shares (declared here for the type checker)."""

    broker: Any
    queue: str
    workdir: Path
    adapter: Adapter
    beats: list[BeatHandle]
    _env: dict[str, str]
    _gate: threading.Lock
    _beat_app: str
    _beat_groups: set[str]
    _extra_queues: set[str]
    _lock: LeaderLock | None
    _fires: dict[str, list[Fire]]

    @property
    def patience(self) -> float:
        raise NotImplementedError

    def require_processes(self, why: str = "worker processes") -> None:
        raise NotImplementedError

    def _check_open(self) -> None:
        raise NotImplementedError

    def beat(
        self,
        *,
        every: float,
        ttl: float,
        tick: float,
        group: str = "",
        queue: str | None = None,
        lock_url: str | None = None,
        wait_ready: bool = True,
    ) -> BeatHandle:
        """Start an ``ackwise beat`` process firing one interval schedule into ``queue``.

        Beats of one ``group`` share an app name, hence a lock; ``lock_url`` (default: the
        broker's own store) lets one of them reach the lock store through a fault proxy
        while it publishes directly.
        """
        self.require_processes("beat processes")
        self.require_lock_backend()
        queue = queue or self.queue
        with self._gate:
            self._check_open()
            if queue != self.queue and queue not in self._extra_queues:
                self._extra_queues.add(queue)
                self.adapter.declare(QueueSpec(queue))
        env = {
            **self._env,
            "ACKWISE_CONFORMANCE_BEAT_APP": self.beat_app(group),
            "ACKWISE_CONFORMANCE_BEAT_EVERY": repr(every),
            "ACKWISE_CONFORMANCE_BEAT_QUEUE": queue,
        }
        args = ["--ttl", repr(ttl), "--tick", repr(tick)]
        if lock_url is not None:
            args += ["--lock", lock_url]
        with self._gate:
            self._check_open()
            self._beat_groups.add(group)
            handle = BeatHandle(self, len(self.beats), args, env)
            self.beats.append(handle)
        if wait_ready:
            handle.wait_ready(self.patience * 2)
        return handle

    def require_lock_backend(self) -> None:
        """Beat scenarios test the broker's own lock store: n/a where it has none."""
        scheme = BrokerURL.parse(self.broker.url).scheme
        try:
            get_plugins().lock_backends.get(scheme)
        except UnknownBrokerScheme:
            raise NotApplicable(
                f"broker {self.broker.name}: no leader-lock backend serves {scheme}:// "
                "(beats on this broker take their lock elsewhere with --lock)"
            ) from None

    def beat_app(self, group: str = "") -> str:
        return f"{self._beat_app}{group}"

    @property
    def beat_lock(self) -> LeaderLock:
        """The case's own handle on the lock store (direct, never through a proxy)."""
        if self._lock is None:
            lock = open_lock(self.broker.url)
            lock.timeout = 2.0
            lock.open()
            self._lock = lock
        return self._lock

    def leader(self, group: str = "") -> LockInfo | None:
        """Who holds the group's beat lock now, as the store sees it."""
        return self.beat_lock.info(self.beat_lock_name(group))

    def beat_lock_name(self, group: str = "") -> str:
        """The lock the group's beats take (the beat's default: ``ackwise.beat.<app>``)."""
        return f"ackwise.beat.{self.beat_app(group)}"

    def leader_pid(self, group: str = "") -> int | None:
        info = self.leader(group)
        if info is None:
            return None
        return int(info.owner.rpartition(":")[2])

    def fires(self, queue: str | None = None) -> list[Fire]:
        """Every fire enqueued on ``queue`` so far, in fire-time order (read, then acked)."""
        queue = queue or self.queue
        seen = self._fires.setdefault(queue, [])
        while True:
            batch = self.adapter.receive(queue, max_messages=500, wait=0, lease=60)
            if not batch:
                break
            for d in batch:
                env = decode_envelope(d.body)
                beat = env.headers.get("beat") or {}
                fire_time = str(beat.get("fire_time"))
                when = dt.datetime.fromisoformat(fire_time)
                seen.append(
                    Fire(
                        schedule=str(beat.get("schedule")),
                        fire_time=fire_time,
                        fire_us=(when - _EPOCH) // _US,
                        fence=int(beat.get("fence", 0)),
                        key=str(env.headers.get("idempotency_key")),
                        published_at=env.created_at,
                    )
                )
            self.adapter.ack(batch)
        seen.sort(key=lambda f: (f.fire_us, f.published_at))
        return list(seen)

    def fire_count(self, queue: str | None = None) -> int:
        """Fires enqueued on ``queue`` so far (cheap: the broker's count plus those read)."""
        queue = queue or self.queue
        return self.stats_of(queue).ready + len(self._fires.get(queue, []))

    def stats_of(self, queue: str) -> QueueStats:
        return self.adapter.stats(queue)
