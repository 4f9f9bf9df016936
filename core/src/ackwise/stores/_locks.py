"""Leader locks for ``ackwise beat``: one leader among N processes, fenced fires (docs/periodic.md).

A backend (:class:`LeaderLock`) keeps, per lock name, the holder's random token, a fencing
number that rises with every acquisition (and never goes back, not even after a release),
and the store's own expiry; and, per (lock, schedule, fire time), the record that the fire was
claimed.  Each operation is one atomic step in the store:

``acquire``  if nobody holds the lock (or the holder's expiry passed): take it with a new
             token, fence + 1, expiry = now + ttl
``renew``    compare-and-replace: push the expiry only if the token still holds the lock
``release``  compare-and-delete: free the lock only if the token still holds it
``claim``    only if the token holds the lock: record (schedule, fire time) unless recorded,
             with the fencing number of the token that claimed it

The client side (:class:`Leadership`) never trusts the store's clock for its own validity: it
judges it by ``time.monotonic()``, deadline = the monotonic time when the acquire (or renew)
*started* + ttl, so it always believes it is leader for less time than the store does.  It
steps down the moment a renewal fails or the deadline passes, and keeps running as a
follower.  Backends are plugins (hook ``ackwise_register_lock_backends``); the built-in ones
are ``memory://`` (one process) and ``sqlite:///`` (the broker's file), here, and
``postgresql://`` (:mod:`ackwise.backends.postgresql._lock`).
"""

from __future__ import annotations

import abc
import enum
import logging
import math
import os
import secrets
import socket
import sqlite3
import threading
import time
from collections.abc import Callable
from contextlib import AbstractContextManager
from dataclasses import dataclass

from ackwise.backends.sqlite._file import SQLiteFile, run_schema
from ackwise.contract._spi import BrokerURL
from ackwise.errors import AdapterError, ConfigurationError, InvalidBrokerURL

__all__ = [
    "Claim",
    "LeaderLock",
    "Leadership",
    "LockInfo",
    "MemoryLeaderLock",
    "SQLiteLeaderLock",
    "default_owner",
]

log = logging.getLogger(__name__)

#: How many claimed fires per schedule a store keeps (the newest; older ones are pruned).
KEEP_FIRES = 64


class Claim(enum.Enum):
    """The answer of :meth:`LeaderLock.claim`."""

    #: The fire is recorded as this holder's: enqueue it.
    CLAIMED = "claimed"
    #: The fire was claimed before (by this or an earlier leader): do not enqueue it.
    TAKEN = "taken"
    #: The token does not hold the lock (any more): nothing was recorded.
    NOT_HOLDER = "not_holder"


@dataclass(frozen=True)
class LockInfo:
    """Who holds a lock, as the store sees it (for ``--list``, logs and tests)."""

    name: str
    owner: str
    fence: int
    #: Seconds until the store lets someone else take the lock.
    expires_in: float


class LeaderLock(abc.ABC):
    """The contract of a lock backend.  Every method is one atomic step in the store.

    Fire times are integers: microseconds since the Unix epoch.  Implementations map their
    driver's errors into :mod:`ackwise.errors` (transient ones as
    :class:`~ackwise.errors.TransientAdapterError`); the beat treats any
    :class:`~ackwise.errors.AdapterError` as "leadership unknown" and steps down.
    """

    def __init__(self, url: BrokerURL) -> None:
        self.url = url
        #: The longest one operation may block (seconds), or ``None`` for the backend's
        #: default.  The beat sets it to a third of the TTL before :meth:`open`, so a store
        #: that hangs cannot keep a leader past its deadline for long.
        self.timeout: float | None = None

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self.url}>"

    def open(self) -> None:  # noqa: B027  # optional hook: most backends connect lazily
        """Connect (idempotent)."""

    def close(self) -> None:  # noqa: B027
        """Disconnect (idempotent)."""

    @abc.abstractmethod
    def acquire(self, name: str, token: str, ttl: float, owner: str) -> int | None:
        """Take ``name`` with ``token`` for ``ttl`` seconds if nobody holds it.

        :returns: the new fencing number (greater than every earlier one of ``name``), or
            ``None`` when another token holds the lock.
        """

    @abc.abstractmethod
    def renew(self, name: str, token: str, ttl: float) -> bool:
        """Push the expiry to now + ``ttl`` if ``token`` still holds ``name``; else change nothing."""

    @abc.abstractmethod
    def release(self, name: str, token: str) -> bool:
        """Free ``name`` if ``token`` still holds it; else change nothing (a stale release)."""

    @abc.abstractmethod
    def claim(self, name: str, token: str, schedule: str, fire_time: int) -> Claim:
        """Record the fire (``schedule``, ``fire_time``) if ``token`` holds ``name``."""

    @abc.abstractmethod
    def last_fires(self, name: str) -> dict[str, int]:
        """The newest claimed fire time of each schedule of ``name``."""

    @abc.abstractmethod
    def info(self, name: str) -> LockInfo | None:
        """The current holder of ``name``, or ``None`` when it is free."""

    def claimed_by(self, name: str, schedule: str, fire_time: int) -> int | None:
        """Return the fencing number of the holder that claimed (``schedule``, ``fire_time``).

        That is the number of the token whose :meth:`claim` recorded the fire of ``name``,
        kept with the claim in the same atomic step.  ``None`` when the fire is not claimed
        (or its claim was pruned, or deleted with the lock) or the store does not know who
        claimed it (a claim recorded before the store kept that).  The beat asks it about a
        claim whose answer was lost, once the lock has moved on: its own fencing number means
        the claim was recorded under its lock, and the fire is its to publish.

        Optional: the default knows nothing and returns ``None``; the beat then gives such a
        fire up, with a warning, as it did before this method existed.
        """
        return None

    def delete(self, name: str) -> None:  # noqa: B027  # optional: the default keeps all
        """Forget everything kept for ``name``: its holder, its fencing number, its claims.

        Only for a lock no process will use again (a test's or a conformance run's cleanup):
        a later acquire starts the fencing numbers again from 1.  Optional: the default
        keeps everything (a backend without it leaves its lock records behind).
        """


def default_owner() -> str:
    """``host:pid``: how a holder is shown."""
    return f"{socket.gethostname()}:{os.getpid()}"


# -- the client side -----------------------------------------------------------------------
class Leadership:
    """Hold, or try to take, one leader lock; judge validity by a monotonic clock.

    :param renew: seconds between renewals (default ``ttl / 3``); refused when ``>= ttl / 2``,
        which would leave a single slow renewal no room before the lock expires.
    :raises ConfigurationError: a TTL or renewal interval that cannot work.
    """

    def __init__(
        self,
        lock: LeaderLock,
        name: str,
        *,
        ttl: float,
        renew: float | None = None,
        owner: str | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if isinstance(ttl, bool) or not isinstance(ttl, int | float) or not math.isfinite(ttl):
            raise ConfigurationError(f"ttl must be a number of seconds, got {ttl!r}")
        if ttl <= 0:
            raise ConfigurationError(f"ttl must be > 0 seconds, got {ttl!r}")
        renew = ttl / 3 if renew is None else renew
        if not (math.isfinite(renew) and renew > 0):
            raise ConfigurationError(f"renew must be a number of seconds > 0, got {renew!r}")
        if renew >= ttl / 2:
            raise ConfigurationError(
                f"renew interval {renew:g}s must be shorter than half the lock TTL "
                f"({ttl:g}s / 2): one late renewal would lose the lock; use ttl / 3 or less"
            )
        self.lock = lock
        self.name = name
        self.ttl = float(ttl)
        self.renew_every = float(renew)
        self.owner = owner or default_owner()
        self.clock = clock
        self.token: str | None = None
        self._last_token: str | None = None
        self.fence: int | None = None
        self.deadline = 0.0
        self.next_renew = 0.0
        self._failed_renewals = 0  # in a row, this episode: only the first one warns

    def __repr__(self) -> str:
        state = f"leader fence={self.fence}" if self.token else "follower"
        return f"<Leadership {self.name} {state}>"

    @property
    def is_leader(self) -> bool:
        """Holding a token whose deadline (monotonic) has not passed."""
        return self.token is not None and self.clock() < self.deadline

    def remaining(self) -> float:
        """Seconds of validity left (0 for a follower)."""
        return max(0.0, self.deadline - self.clock()) if self.token is not None else 0.0

    def try_acquire(self) -> bool:
        """Try to take the lock once; return whether this process now leads.

        :raises AdapterError: the store cannot be reached (the caller stays a follower).
        """
        if self.is_leader:
            return True
        self.token = None
        token = secrets.token_hex(16)
        start = self.clock()
        fence = self.lock.acquire(self.name, token, self.ttl, self.owner)
        if fence is None:
            return False
        if self.clock() >= start + self.ttl:
            log.warning(
                "lock %s: acquired too late to use (the call took the whole TTL)", self.name
            )
            return False
        self.token, self._last_token, self.fence = token, token, fence
        self.deadline = start + self.ttl
        self.next_renew = start + self.renew_every
        log.info("lock %s: leader now (fence %d, ttl %.1fs)", self.name, fence, self.ttl)
        return True

    def maintain(self) -> bool:
        """Renew when due; step down when the deadline passed or a renewal is refused.

        A renewal that fails transiently is retried on the next call until the deadline.

        Never raises for a store failure: that is a step-down.  Returns :attr:`is_leader`.
        """
        if self.token is None:
            return False
        now = self.clock()
        if now >= self.deadline:
            self.step_down("the lease deadline passed before it could be renewed")
            return False
        if now < self.next_renew:
            return True
        start = now
        try:
            renewed = self.lock.renew(self.name, self.token, self.ttl)
        except AdapterError as exc:
            if not exc.transient:
                self.step_down(f"renewal failed: {exc}")
                return False
            # The lock stays ours until the deadline of the last renewal that came in (judged
            # from when it started): a store busy or unreachable for a moment is retried on the
            # next pass, and only the deadline passing makes this process step down.
            self._failed_renewals += 1
            level = logging.WARNING if self._failed_renewals == 1 else logging.DEBUG
            log.log(
                level, "lock %s: renewal failed (%s); retrying until the deadline", self.name, exc
            )
            self.next_renew = now + self.renew_every / 4
            return self.is_leader
        if not renewed:
            self.step_down("renewal refused: the lock expired or moved to another holder")
            return False
        if self.clock() >= start + self.ttl:
            self.step_down("renewal answered after the whole TTL")
            return False
        self.deadline = start + self.ttl
        self.next_renew = start + self.renew_every
        if self._failed_renewals:
            log.info(
                "lock %s: renewed again after %d failed attempt(s)",
                self.name,
                self._failed_renewals,
            )
            self._failed_renewals = 0
        return True

    def claim(self, schedule: str, fire_time: int) -> Claim:
        """Claim a fire in the store, as leader; ``NOT_HOLDER`` (and a step-down) otherwise.

        :raises AdapterError: the store failed; the claim may or may not be recorded (the
            caller steps down and does not enqueue).
        """
        if not self.is_leader:
            if self.token is not None:
                self.step_down("the lease deadline passed")
            return Claim.NOT_HOLDER
        assert self.token is not None
        result = self.lock.claim(self.name, self.token, schedule, fire_time)
        if result is Claim.NOT_HOLDER:
            self.step_down("the store refused a claim: the lock moved to another holder")
        return result

    def step_down(self, reason: str) -> None:
        """Stop leading at once (no call to the store: it may be the thing that failed)."""
        if self.token is not None:
            log.warning("lock %s: stepping down (fence %s): %s", self.name, self.fence, reason)
        self.token = None
        self._failed_renewals = 0
        self.deadline = 0.0

    def release(self) -> bool | None:
        """Compare-and-delete the lock with the last token this process acquired.

        Also after a step-down: the store decides.  If nobody took the lock meanwhile it is
        freed early; if another process holds it now, the release is refused (a stale
        release) and nothing changes.

        :returns: whether the store freed it; ``None`` when this process never held it.
        :raises AdapterError: the store failed (the lock then expires by its TTL).
        """
        token, self._last_token = self._last_token, None
        self.token = None
        self.deadline = 0.0
        if token is None:
            return None
        freed = self.lock.release(self.name, token)
        if freed:
            log.info("lock %s: released", self.name)
        else:
            log.warning(
                "lock %s: release refused: the lock had moved to another holder (stale "
                "token, fence %s); nothing was changed",
                self.name,
                self.fence,
            )
        return freed


# -- memory ----------------------------------------------------------------------------------
@dataclass
class _MemoryState:
    token: str | None = None
    fence: int = 0
    expires_at: float = 0.0
    owner: str = ""


class _MemoryStore:
    def __init__(self) -> None:
        self.mutex = threading.Lock()
        self.locks: dict[str, _MemoryState] = {}
        #: (lock, schedule) -> {fire time: fencing number of the holder that claimed it}
        self.fires: dict[tuple[str, str], dict[int, int]] = {}


_memory_stores: dict[str, _MemoryStore] = {}
_memory_lock = threading.Lock()


class MemoryLeaderLock(LeaderLock):
    """An in-process lock store per ``memory://name`` (tests and single-process apps)."""

    def __init__(self, url: BrokerURL, *, clock: Callable[[], float] = time.monotonic) -> None:
        super().__init__(url)
        if url.query:
            raise InvalidBrokerURL(f"memory:// takes no options, got {sorted(url.query)} in {url}")
        key = url.in_process_name
        with _memory_lock:
            self._store = _memory_stores.setdefault(key, _MemoryStore())
        self.clock = clock

    def _held(self, name: str, token: str, now: float) -> _MemoryState | None:
        state = self._store.locks.get(name)
        if state is None or state.token != token or state.expires_at <= now:
            return None
        return state

    def acquire(self, name: str, token: str, ttl: float, owner: str) -> int | None:
        with self._store.mutex:
            now = self.clock()
            state = self._store.locks.setdefault(name, _MemoryState())
            if state.token is not None and state.expires_at > now:
                return None
            state.token, state.fence = token, state.fence + 1
            state.expires_at, state.owner = now + ttl, owner
            return state.fence

    def renew(self, name: str, token: str, ttl: float) -> bool:
        with self._store.mutex:
            now = self.clock()
            state = self._held(name, token, now)
            if state is None:
                return False
            state.expires_at = now + ttl
            return True

    def release(self, name: str, token: str) -> bool:
        with self._store.mutex:
            state = self._store.locks.get(name)
            if state is None or state.token != token:
                return False
            state.token, state.expires_at, state.owner = None, 0.0, ""
            return True

    def claim(self, name: str, token: str, schedule: str, fire_time: int) -> Claim:
        with self._store.mutex:
            state = self._held(name, token, self.clock())
            if state is None:
                return Claim.NOT_HOLDER
            fires = self._store.fires.setdefault((name, schedule), {})
            if fire_time in fires:
                return Claim.TAKEN
            fires[fire_time] = state.fence
            if len(fires) > KEEP_FIRES:
                for old in sorted(fires)[:-KEEP_FIRES]:
                    del fires[old]
            return Claim.CLAIMED

    def claimed_by(self, name: str, schedule: str, fire_time: int) -> int | None:
        with self._store.mutex:
            return self._store.fires.get((name, schedule), {}).get(fire_time)

    def last_fires(self, name: str) -> dict[str, int]:
        with self._store.mutex:
            return {s: max(f) for (n, s), f in self._store.fires.items() if n == name and f}

    def delete(self, name: str) -> None:
        with self._store.mutex:
            self._store.locks.pop(name, None)
            for key in [k for k in self._store.fires if k[0] == name]:
                del self._store.fires[key]

    def info(self, name: str) -> LockInfo | None:
        with self._store.mutex:
            state = self._store.locks.get(name)
            now = self.clock()
            if state is None or state.token is None or state.expires_at <= now:
                return None
            return LockInfo(name, state.owner, state.fence, state.expires_at - now)


# -- sqlite ----------------------------------------------------------------------------------
_SQLITE_SCHEMA = (
    """CREATE TABLE IF NOT EXISTS ackwise_locks (
        name       TEXT PRIMARY KEY,
        token      TEXT,
        fence      INTEGER NOT NULL,
        expires_at REAL    NOT NULL,
        owner      TEXT
    ) WITHOUT ROWID""",
    """CREATE TABLE IF NOT EXISTS ackwise_fires (
        lock       TEXT    NOT NULL,
        schedule   TEXT    NOT NULL,
        fire_time  INTEGER NOT NULL,
        fence      INTEGER NOT NULL,
        claimed_at REAL    NOT NULL,
        PRIMARY KEY (lock, schedule, fire_time)
    ) WITHOUT ROWID""",
)
_SQL_HOLDS = "SELECT fence FROM ackwise_locks WHERE name = ? AND token = ? AND expires_at > ?"
_SQL_PRUNE = """
DELETE FROM ackwise_fires
 WHERE lock = :lock AND schedule = :schedule
   AND fire_time <= (SELECT fire_time FROM ackwise_fires
                      WHERE lock = :lock AND schedule = :schedule
                      ORDER BY fire_time DESC LIMIT 1 OFFSET :keep)
"""


class SQLiteLeaderLock(LeaderLock):
    """The lock in a SQLite file (``sqlite:///path.db``, by default the broker's own file).

    Tables ``ackwise_locks`` (name, token, fence, expires_at, owner) and ``ackwise_fires``
    (lock, schedule, fire_time, fence: the claiming holder's, claimed_at; the fence has been
    recorded since the table's first version, so every file's claims say who made them).  Every operation is one ``BEGIN
    IMMEDIATE`` transaction, so it is atomic against every other process on the host; the
    store's expiry uses the host's wall clock, shared by all of them.  The fencing number
    lives in the lock's row, which a release empties but never deletes.
    """

    def __init__(self, url: BrokerURL) -> None:
        super().__init__(url)
        self._file = SQLiteFile(
            url,
            what="SQLite lock store",
            setup=lambda db: run_schema(db, _SQLITE_SCHEMA),
        )
        self.path = self._file.path

    def open(self) -> None:
        self._file.timeout = self.timeout  # set between creation and open
        self._file.open()

    def close(self) -> None:
        self._file.close()

    def _write(self) -> AbstractContextManager[sqlite3.Connection]:
        self._file.timeout = self.timeout
        return self._file.write()

    def _read(self) -> AbstractContextManager[sqlite3.Connection]:
        """A plain read: in WAL mode a consistent snapshot that takes no write lock."""
        self._file.timeout = self.timeout
        return self._file.read()

    def acquire(self, name: str, token: str, ttl: float, owner: str) -> int | None:
        with self._read() as db:  # a follower's usual answer, without the write lock
            row = db.execute(
                "SELECT expires_at FROM ackwise_locks WHERE name = ? AND token IS NOT NULL",
                (name,),
            ).fetchone()
        if row is not None and row[0] > time.time():
            return None
        with self._write() as db:
            now = time.time()  # read after the write lock is ours
            row = db.execute(
                "SELECT token, fence, expires_at FROM ackwise_locks WHERE name = ?", (name,)
            ).fetchone()
            if row is not None and row[0] is not None and row[2] > now:
                return None
            fence = (row[1] if row is not None else 0) + 1
            db.execute(
                "INSERT INTO ackwise_locks (name, token, fence, expires_at, owner) "
                "VALUES (?, ?, ?, ?, ?) ON CONFLICT (name) DO UPDATE SET token = excluded.token, "
                "fence = excluded.fence, expires_at = excluded.expires_at, owner = excluded.owner",
                (name, token, fence, now + ttl, owner),
            )
            return int(fence)

    def renew(self, name: str, token: str, ttl: float) -> bool:
        with self._write() as db:
            now = time.time()
            cur = db.execute(
                "UPDATE ackwise_locks SET expires_at = ? "
                "WHERE name = ? AND token = ? AND expires_at > ?",
                (now + ttl, name, token, now),
            )
            return cur.rowcount == 1

    def release(self, name: str, token: str) -> bool:
        with self._write() as db:
            cur = db.execute(
                "UPDATE ackwise_locks SET token = NULL, expires_at = 0, owner = NULL "
                "WHERE name = ? AND token = ?",
                (name, token),
            )
            return cur.rowcount == 1

    def claim(self, name: str, token: str, schedule: str, fire_time: int) -> Claim:
        with self._write() as db:
            now = time.time()
            row = db.execute(_SQL_HOLDS, (name, token, now)).fetchone()
            if row is None:
                return Claim.NOT_HOLDER
            cur = db.execute(
                "INSERT OR IGNORE INTO ackwise_fires (lock, schedule, fire_time, fence, claimed_at) "
                "VALUES (?, ?, ?, ?, ?)",
                (name, schedule, fire_time, row[0], now),
            )
            if cur.rowcount != 1:
                return Claim.TAKEN
            db.execute(_SQL_PRUNE, {"lock": name, "schedule": schedule, "keep": KEEP_FIRES})
            return Claim.CLAIMED

    def last_fires(self, name: str) -> dict[str, int]:
        with self._read() as db:
            rows = db.execute(
                "SELECT schedule, max(fire_time) FROM ackwise_fires WHERE lock = ? "
                "GROUP BY schedule",
                (name,),
            ).fetchall()
        return {schedule: int(t) for schedule, t in rows}

    def claimed_by(self, name: str, schedule: str, fire_time: int) -> int | None:
        with self._read() as db:
            row = db.execute(
                "SELECT fence FROM ackwise_fires WHERE lock = ? AND schedule = ? AND fire_time = ?",
                (name, schedule, fire_time),
            ).fetchone()
        return None if row is None or row[0] is None else int(row[0])

    def delete(self, name: str) -> None:
        with self._write() as db:
            db.execute("DELETE FROM ackwise_fires WHERE lock = ?", (name,))
            db.execute("DELETE FROM ackwise_locks WHERE name = ?", (name,))

    def info(self, name: str) -> LockInfo | None:
        with self._read() as db:
            now = time.time()
            row = db.execute(
                "SELECT owner, fence, expires_at FROM ackwise_locks "
                "WHERE name = ? AND token IS NOT NULL AND expires_at > ?",
                (name, now),
            ).fetchone()
        if row is None:
            return None
        return LockInfo(name, row[0] or "?", int(row[1]), row[2] - now)
