"""``ackwise beat``: the periodic-task scheduler, safe to run in N copies (docs/periodic.md).

Every beat process runs the same loop.  Only the holder of the leader lock fires; every fire
is first *claimed* in the lock store, atomically and only with the holder's token, and then
published with the idempotency key ``schedule:fire_time``.  So a leader that was paused past
its TTL, cut off from the store, or simply slow cannot fire a tick that another leader fired:
its claim is refused.  A process that loses the lock steps down and keeps running as a
follower; it never exits because of it.
"""

from __future__ import annotations

import datetime as dt
import logging
import math
import signal
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from ackwise.app._schedule import UTC, Periodic, from_us, to_us
from ackwise.contract._spi import redact_url
from ackwise.errors import AckwiseError, AdapterError, ConfigurationError, UnknownBrokerScheme
from ackwise.plugins._manager import open_lock
from ackwise.stores._locks import Claim, LeaderLock, Leadership

if TYPE_CHECKING:
    from ackwise.app._app import App

__all__ = ["Beat", "BeatConfig"]

log = logging.getLogger("ackwise.beat")

#: Claims one pass of the loop makes at most, so a long catch-up leaves room for the rest of
#: the loop (publish retries, a stop request); the lock is renewed between claims as well.
CLAIMS_PER_PASS = 100
#: Publish attempts of a claimed fire before it is given up (logged as an error).
PUBLISH_ATTEMPTS = 5


@dataclass(frozen=True)
class BeatConfig:
    """How a beat process holds its lock.

    :param lock: URL of the lock store; default: the app's broker URL (its file for SQLite).
    :param ttl: seconds the store keeps the lock without a renewal.  A dead leader is
        replaced within ``ttl + tick``.
    :param tick: the longest the loop sleeps, and how often a follower tries to take the
        lock.  Must be shorter than ``ttl``.
    :param renew: seconds between renewals; default ``ttl / 3``; must be shorter than
        ``ttl / 2``.
    :param lock_name: default ``ackwise.beat.<app name>``: one leader per app.
    :raises ConfigurationError: a combination that cannot keep the lock.
    """

    lock: str | None = None
    ttl: float = 30.0
    tick: float = 1.0
    renew: float | None = None
    lock_name: str | None = None

    def __post_init__(self) -> None:
        for label, value in (("ttl", self.ttl), ("tick", self.tick)):
            if (
                isinstance(value, bool)
                or not isinstance(value, int | float)
                or not math.isfinite(value)
                or value <= 0
            ):
                raise ConfigurationError(f"{label} must be a number of seconds > 0, got {value!r}")
        if self.tick >= self.ttl:
            raise ConfigurationError(
                f"tick {self.tick:g}s must be shorter than the lock TTL {self.ttl:g}s: a leader "
                "whose loop sleeps a whole TTL loses the lock between two passes"
            )
        renew = self.ttl / 3 if self.renew is None else self.renew
        if isinstance(renew, bool) or not (math.isfinite(renew) and renew > 0):
            raise ConfigurationError(f"renew must be a number of seconds > 0, got {renew!r}")
        if renew >= self.ttl / 2:
            raise ConfigurationError(
                f"renew interval {renew:g}s must be shorter than half the lock TTL "
                f"({self.ttl:g}s / 2): one late renewal would lose the lock; use ttl / 3 or less"
            )

    @property
    def renew_every(self) -> float:
        return self.ttl / 3 if self.renew is None else float(self.renew)


@dataclass
class _Pending:
    periodic: Periodic
    fire: dt.datetime
    headers: dict[str, Any]
    attempts: int = 0


@dataclass
class _Unsure:
    """A claim whose answer was lost (the store failed transiently): it may be recorded."""

    periodic: Periodic
    fire: dt.datetime
    token: str
    fence: int | None


def utcnow() -> dt.datetime:
    """Now, aware UTC: the wall clock a beat reads its fire times from by default."""
    return dt.datetime.now(UTC)


class Beat:
    """The scheduler loop of one ``ackwise beat`` process.

    :param lock: a lock backend to use instead of opening ``config.lock``.
    :param clock: the monotonic clock leadership is judged by.
    :param wall: the wall clock fire times are read from (aware UTC).
    """

    def __init__(
        self,
        app: App,
        config: BeatConfig | None = None,
        *,
        lock: LeaderLock | None = None,
        clock: Callable[[], float] = time.monotonic,
        wall: Callable[[], dt.datetime] = utcnow,
    ) -> None:
        self.app = app
        self.config = config or BeatConfig()
        self.schedules: list[Periodic] = list(app.schedules.values())
        if not self.schedules:
            raise ConfigurationError(
                f"app {app.name!r} declares no periodic schedules (app.periodic(...) or "
                "@app.periodic_task(...)): nothing to run"
            )
        self.lock_url = self.config.lock or app.broker_url
        self.lock = lock if lock is not None else self._lock_backend()
        self.lock.timeout = self.config.ttl / 3
        self.lock_name = self.config.lock_name or f"ackwise.beat.{app.name}"
        self.clock = clock
        self.wall = wall
        self.leadership = Leadership(
            self.lock,
            self.lock_name,
            ttl=self.config.ttl,
            renew=self.config.renew_every,
            clock=clock,
        )
        self._stop = threading.Event()
        self._last: dict[str, dt.datetime] = {}
        self._pending: list[_Pending] = []
        self._unsure: _Unsure | None = None
        self._next_acquire = 0.0
        self._store_failing = False

    def _lock_backend(self) -> LeaderLock:
        """The lock store of ``lock_url`` (built, not opened); refused in one line where no
        plugin provides one for its scheme.  The app does not refuse this: its beats may take
        their lock elsewhere (``--lock``)."""
        try:
            return open_lock(self.lock_url, self.app.plugins)
        except UnknownBrokerScheme as exc:
            where = "--lock" if self.config.lock else "the app's broker; no --lock given"
            install = self.app.plugins.adapters.install_hint(exc.scheme)
            raise ConfigurationError(
                f"ackwise beat: app {self.app.name!r} has periodic schedules, and its lock URL "
                f"{redact_url(self.lock_url)} ({where}) has no leader lock: no installed plugin "
                f"provides one for {exc.scheme}:// URLs; "
                + (f"{install}, or " if install else "")
                + f"pass --lock with a URL of one of: {', '.join(exc.installed)}"
            ) from None

    # -- control ---------------------------------------------------------------------------
    def request_stop(self) -> None:
        """Ask the loop to stop (safe from a signal handler)."""
        self._stop.set()

    def install_signal_handlers(self) -> None:
        """SIGTERM / SIGINT: stop, releasing the lock."""

        def handler(signum: int, frame: object) -> None:
            log.warning("%s received: stopping", signal.Signals(signum).name)
            self.request_stop()

        signal.signal(signal.SIGTERM, handler)
        signal.signal(signal.SIGINT, handler)

    @property
    def is_leader(self) -> bool:
        return self.leadership.is_leader

    # -- the loop --------------------------------------------------------------------------
    def run(self) -> int:
        """Run until :meth:`request_stop`; release the lock on the way out.  Returns 0."""
        cfg = self.config
        log.info(
            "beat ready: app %s, %d schedule(s), lock %s (name %s), ttl %.3gs, renew %.3gs, "
            "tick %.3gs",
            self.app.name,
            len(self.schedules),
            redact_url(self.lock_url),
            self.lock_name,
            cfg.ttl,
            cfg.renew_every,
            cfg.tick,
        )
        try:
            while not self._stop.is_set():
                try:
                    delay = self.run_once()
                except Exception:  # a bug must not turn into a crash loop of the scheduler
                    log.exception("beat: unexpected error in the loop; continuing as follower")
                    self.leadership.step_down("unexpected error in the loop")
                    delay = cfg.tick
                self._stop.wait(delay)
        finally:
            self.shutdown()
        return 0

    def shutdown(self) -> None:
        """Publish what this process claimed and has not published yet (one more try), release
        the lock (compare-and-delete) and close connections."""
        try:
            self._resolve_unsure()
            self._retry_pending()
        except AdapterError as exc:  # pragma: no cover - both log and keep what they cannot do
            log.warning("beat: finishing its claimed fires failed: %s", exc)
        u, self._unsure = self._unsure, None
        if u is not None:  # the store did not answer this last time either
            log.warning(
                "schedule %s: the fire for %s may be lost: the answer to its claim was lost "
                "and the lock store did not answer again before the beat stopped",
                u.periodic.name,
                u.fire.isoformat(),
            )
        try:
            self.leadership.release()
        except AdapterError as exc:
            log.warning("lock %s: release failed (%s); it expires by its TTL", self.lock_name, exc)
        finally:
            try:
                self.lock.close()
            finally:
                self.app.close()

    def run_once(self) -> float:
        """One pass: keep or seek the lock, fire what is due; return seconds to sleep."""
        lead = self.leadership
        if self._unsure is not None:
            # Before any new election: asked with the token it was made with, which may still
            # hold the lock in the store though this process stepped down.
            self._resolve_unsure()
        if lead.token is not None:
            lead.maintain()
        # Not when told to stop (it would release the lock at once, after an election), nor
        # while a claim whose answer was lost is unsettled (the store failed again just now):
        # leading again could lose the next claim's answer too, and that one's record would
        # take the first's place.
        if (
            lead.token is None
            and not self._stop.is_set()
            and self._unsure is None
            and self.clock() >= self._next_acquire
        ):
            self._next_acquire = self.clock() + self.config.tick
            try:
                if lead.try_acquire():
                    self._elected()
                self._store_ok()
            except AdapterError as exc:
                lead.step_down(f"the lock store failed: {exc}")
                self._store_error(exc)
        if self._pending:
            self._retry_pending()
        if lead.is_leader:
            try:
                self._fire_due()
            except AdapterError as exc:
                lead.step_down(f"a claim failed: {exc}")
                self._store_error(exc)
        return self._sleep_time()

    def _store_error(self, exc: AdapterError) -> None:
        if not self._store_failing:
            log.warning(
                "lock %s: store unavailable: %s (retrying as follower)", self.lock_name, exc
            )
        self._store_failing = True

    def _store_ok(self) -> None:
        if self._store_failing:
            log.info("lock %s: store reachable again", self.lock_name)
        self._store_failing = False

    def _elected(self) -> None:
        """Learn, from the store, the newest fire of each schedule (by any leader)."""
        stored = self.lock.last_fires(self.lock_name)
        now = self.wall()
        self._last = {}
        for p in self.schedules:
            us = stored.get(p.name)
            # A schedule never fired before starts from now: its first fire is its next tick.
            self._last[p.name] = from_us(us) if us is not None else now

    def _fire_due(self) -> None:
        lead = self.leadership
        now = self.wall()
        budget = CLAIMS_PER_PASS
        for p in self.schedules:
            due, cut = p.due(self._last[p.name], now)
            if cut and due:
                if p.missed == "coalesce":
                    log.info(
                        "schedule %s: missed ticks coalesced into one fire for %s",
                        p.name,
                        due[-1].isoformat(),
                    )
                else:
                    log.warning(
                        "schedule %s: more missed ticks than catch_up_limit=%d; the older "
                        "ones are skipped",
                        p.name,
                        p.catch_up_limit,
                    )
            for fire in due[:budget]:
                # Renew when due between claims: a catch-up on a slow store can take longer
                # than the TTL, and a lock lost halfway is a handover that starts behind again.
                if not lead.maintain():
                    return
                token, fence = lead.token, lead.fence
                try:
                    result = lead.claim(p.name, to_us(fire))
                except AdapterError as exc:
                    if exc.transient and token is not None:
                        self._unsure = _Unsure(p, fire, token, fence)
                    raise
                if result is Claim.NOT_HOLDER:
                    return
                self._last[p.name] = fire
                budget -= 1
                if result is Claim.TAKEN:
                    log.info("schedule %s: %s was fired already", p.name, fire.isoformat())
                    continue
                self._publish(self._fire(p, fire, fence))
            if budget <= 0:
                return

    def _resolve_unsure(self) -> None:
        """Ask the store again, with the same token, for a claim whose answer was lost.

        The claim is atomic with the token check.  While the token still holds the lock, only
        it can claim fires newer than those the store held when it was elected: ``CLAIMED``
        (the lost attempt recorded nothing) and ``TAKEN`` (it did) both make the fire this
        process's, and it is published now.  ``NOT_HOLDER`` means the lock moved on: the store
        is then asked who claimed the fire (:meth:`LeaderLock.claimed_by`).  This process's
        fencing number means the lost attempt was recorded, under its lock, so the next
        leader started after it: the fire is this process's, published late.  Another
        number means the next leader claimed (and fired) it.  ``None`` (not claimed, or a
        store that cannot tell) gives the fire up, with a warning.  A store still failing is
        asked again on the next pass (and once more when the beat stops).
        """
        u = self._unsure
        if u is None:
            return
        fire_us = to_us(u.fire)
        claimed_by: int | None = None
        try:
            result = self.lock.claim(self.lock_name, u.token, u.periodic.name, fire_us)
            if result is Claim.NOT_HOLDER:
                claimed_by = self.lock.claimed_by(self.lock_name, u.periodic.name, fire_us)
        except AdapterError as exc:
            if exc.transient:
                return
            log.warning(
                "schedule %s: the fire for %s is given up: the answer to its claim was lost and "
                "asking the store again failed: %s",
                u.periodic.name,
                u.fire.isoformat(),
                exc,
            )
            self._unsure = None
            return
        self._unsure = None
        if result is not Claim.NOT_HOLDER:
            log.info(
                "schedule %s: the claim of %s, whose answer was lost, is this process's (%s)",
                u.periodic.name,
                u.fire.isoformat(),
                "recorded then" if result is Claim.TAKEN else "recorded now",
            )
        elif claimed_by is not None and claimed_by == u.fence:
            log.warning(
                "schedule %s: the claim of %s, whose answer was lost, was recorded under this "
                "process's fence %d before its lock expired or moved: firing it late",
                u.periodic.name,
                u.fire.isoformat(),
                claimed_by,
            )
        elif claimed_by is not None:
            log.info(
                "schedule %s: the claim of %s, whose answer was lost, was not recorded: the "
                "leader with fence %d claimed that fire",
                u.periodic.name,
                u.fire.isoformat(),
                claimed_by,
            )
            return
        else:
            log.warning(
                "schedule %s: the fire for %s is given up: the answer to its claim was lost, "
                "its lock expired or moved before it could be asked again, and the store keeps "
                "no record of who claimed it (if nobody did, the next leader fires it)",
                u.periodic.name,
                u.fire.isoformat(),
            )
            return
        self._publish(self._fire(u.periodic, u.fire, u.fence))

    def _fire(self, p: Periodic, fire: dt.datetime, fence: int | None) -> _Pending:
        """The message of ``p``'s fire for ``fire``, claimed under ``fence``."""
        return _Pending(
            p,
            fire,
            {
                "idempotency_key": p.key(fire),
                "beat": {"schedule": p.name, "fire_time": fire.isoformat(), "fence": fence},
            },
        )

    def _publish(self, item: _Pending) -> None:
        p = item.periodic
        item.attempts += 1
        try:
            self.app.tasks[p.task].apply_async(
                p.args, p.kwargs, headers=item.headers, queue=p.queue
            )
        except AdapterError as exc:
            if exc.transient and item.attempts < PUBLISH_ATTEMPTS:
                log.warning(
                    "schedule %s: publishing the fire for %s failed (%s); retrying",
                    p.name,
                    item.fire.isoformat(),
                    exc,
                )
                self._pending.append(item)
                return
            log.error(
                "schedule %s: the fire for %s is lost: publishing failed %d time(s): %s",
                p.name,
                item.fire.isoformat(),
                item.attempts,
                exc,
            )
        except AckwiseError as exc:
            log.error("schedule %s: the fire for %s is refused: %s", p.name, item.fire, exc)
        else:
            log.info(
                "schedule %s: fired %s for %s (fence %s)",
                p.name,
                p.task,
                item.fire.isoformat(),
                item.headers["beat"]["fence"],
            )

    def _retry_pending(self) -> None:
        # A claimed fire is this process's alone, leader or not: retrying it is safe.
        pending, self._pending = self._pending, []
        for item in pending:
            self._publish(item)

    def _sleep_time(self) -> float:
        lead = self.leadership
        now = self.clock()
        wake = [now + self.config.tick]
        if lead.token is not None:
            wake += [lead.next_renew, lead.deadline]
        else:
            wake.append(self._next_acquire)
        if lead.is_leader:
            wall = self.wall()
            for p in self.schedules:
                nxt = p.schedule.next_after(self._last[p.name])
                if nxt is not None:
                    wake.append(now + (nxt - wall).total_seconds())
        return max(0.0, min(wake) - now)
