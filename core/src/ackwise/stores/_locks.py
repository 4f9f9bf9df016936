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
follower.  Backends are plugins (hook ``ackwise_register_lock_backends``); core's are
``memory://`` (one process, :mod:`ackwise.backends.memory._lock`) and ``sqlite:///`` (the
broker's file, :mod:`ackwise.backends.sqlite._lock`); the adapter distributions bring theirs
(``ackwise-redis``, ``ackwise-postgresql``).
"""

from __future__ import annotations

import abc
import enum
import logging
import math
import os
import secrets
import socket
import time
from collections.abc import Callable
from dataclasses import dataclass

from ackwise.contract._spi import BrokerURL
from ackwise.errors import AdapterError, ConfigurationError

__all__ = ["KEEP_FIRES", "Claim", "LeaderLock", "Leadership", "LockInfo", "default_owner"]

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
