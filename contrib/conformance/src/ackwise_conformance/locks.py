"""The leader-lock contract as a pytest base class (docs/periodic.md), for every lock backend.

A lock backend author subclasses :class:`LeaderLockConformance` and overrides ``lock_url``::

    class TestRedisLock(LeaderLockConformance):
        @pytest.fixture
        def lock_url(self, redis_url):
            return redis_url

Two lock objects on the same URL stand for two beat processes.  The tests include the known
failure modes of other schedulers' locks: a renewal without an owner check (a stale holder
extends the new holder's lock), a release without one (a stale holder frees it), a fencing
number that goes back after a release or an expiry, and fires claimed by a non-holder.  The
optional methods (``delete``, ``claimed_by``) are tested where the backend implements them.
"""

from __future__ import annotations

import threading
import uuid
from collections.abc import Iterator

import pytest

from ackwise import Claim, LeaderLock, open_lock
from ackwise_conformance.helpers import eventually

__all__ = ["LeaderLockConformance"]

#: A TTL short enough to wait out in a test, long enough for a loaded machine's round trips.
SHORT_TTL = 0.3
LONG_TTL = 30.0
#: Claimed fires a store keeps per schedule at least (docs/periodic.md: the newest 64).
KEEP_FIRES = 64


class LeaderLockConformance:
    """Base class: the :class:`ackwise.LeaderLock` contract for the backend of ``lock_url``."""

    @pytest.fixture
    def lock_url(self) -> str:
        """The URL of the lock backend under test: every subclass overrides this fixture."""
        pytest.fail(f"{type(self).__name__} must override the 'lock_url' fixture")

    @pytest.fixture
    def lock(self, lock_url: str) -> Iterator[LeaderLock]:
        """An open lock object on ``lock_url``: one beat process."""
        lock = open_lock(lock_url)
        lock.timeout = 5.0
        lock.open()
        yield lock
        lock.close()

    @pytest.fixture
    def other(self, lock_url: str) -> Iterator[LeaderLock]:
        """A second lock object on the same store: another beat process."""
        lock = open_lock(lock_url)
        lock.timeout = 5.0
        lock.open()
        yield lock
        lock.close()

    @pytest.fixture
    def name(self) -> str:
        """A lock name of this test's own."""
        return f"conformance.lock.{uuid.uuid4().hex[:12]}"

    def _expire(self, lock: LeaderLock, name: str) -> None:
        eventually(lambda: lock.info(name) is None, 10.0, description=f"lock {name} to expire")

    # -- delete ------------------------------------------------------------------------------
    def test_delete_forgets_the_holder_and_the_claims(
        self, lock: LeaderLock, other: LeaderLock, name: str
    ) -> None:
        if type(lock).delete is LeaderLock.delete:
            pytest.skip("n/a: the backend does not implement LeaderLock.delete (optional)")
        assert lock.acquire(name, "t1", LONG_TTL, "a") is not None
        assert lock.claim(name, "t1", "s", 1_000_000) is Claim.CLAIMED
        kept = f"{name}.kept"
        assert lock.acquire(kept, "k1", LONG_TTL, "a") is not None
        lock.delete(name)
        assert other.info(name) is None and other.last_fires(name) == {}
        assert other.acquire(name, "t2", LONG_TTL, "b") == 1  # nothing remembered
        assert other.info(kept) is not None  # another lock is untouched
        other.delete(name)
        lock.delete(kept)
        lock.delete(kept)  # deleting what is gone is not an error

    # -- acquire -----------------------------------------------------------------------------
    def test_only_one_holder_at_a_time(
        self, lock: LeaderLock, other: LeaderLock, name: str
    ) -> None:
        fence = lock.acquire(name, "t1", LONG_TTL, "host:1")
        assert fence is not None and fence >= 1
        assert other.acquire(name, "t2", LONG_TTL, "host:2") is None
        info = other.info(name)
        assert info is not None
        assert (info.owner, info.fence) == ("host:1", fence)
        assert 0 < info.expires_in <= LONG_TTL

    def test_fencing_number_rises_with_every_acquisition(
        self, lock: LeaderLock, other: LeaderLock, name: str
    ) -> None:
        first = lock.acquire(name, "t1", LONG_TTL, "a")
        assert first is not None
        assert lock.release(name, "t1") is True
        second = other.acquire(name, "t2", SHORT_TTL, "b")
        assert second is not None and second > first
        self._expire(lock, name)
        third = lock.acquire(name, "t3", LONG_TTL, "a")
        assert third is not None and third > second

    def test_acquirers_racing_on_their_own_connections_elect_one_holder(
        self, lock_url: str, name: str
    ) -> None:
        # Eight beat processes starting together, each with its own connection to the store:
        # one gets the lock, the others are told it is held; nobody gets an error.
        locks = [open_lock(lock_url) for _ in range(8)]
        answers: dict[int, int | BaseException | None] = {}
        start = threading.Barrier(len(locks))

        def race(i: int) -> None:
            try:
                locks[i].timeout = 5.0
                locks[i].open()
                start.wait(10)
                answers[i] = locks[i].acquire(name, f"t{i}", LONG_TTL, f"host:{i}")
            except BaseException as exc:  # reported below, with the others' answers
                answers[i] = exc

        threads = [threading.Thread(target=race, args=(i,)) for i in range(len(locks))]
        for t in threads:
            t.start()
        for t in threads:
            t.join(30)
        try:
            fences = [a for a in answers.values() if a is not None]
            assert len(answers) == len(locks) and len(fences) == 1, f"answers: {answers}"
            (winner,) = (i for i, a in answers.items() if a is not None)
            info = locks[0].info(name)
            assert info is not None and (info.owner, info.fence) == (f"host:{winner}", fences[0])
        finally:
            for each in locks:
                each.close()

    def test_a_free_lock_has_no_holder(self, lock: LeaderLock, name: str) -> None:
        assert lock.info(name) is None
        assert lock.acquire(name, "t1", LONG_TTL, "a") is not None
        assert lock.release(name, "t1") is True
        assert lock.info(name) is None

    # -- renew -------------------------------------------------------------------------------
    def test_renew_by_the_holder_pushes_the_expiry(self, lock: LeaderLock, name: str) -> None:
        assert lock.acquire(name, "t1", SHORT_TTL * 2, "a") is not None
        assert lock.renew(name, "t1", LONG_TTL) is True
        info = lock.info(name)
        assert info is not None and info.expires_in > LONG_TTL / 2

    def test_stale_holder_renew_fails_and_does_not_extend_the_new_owners_lock(
        self, lock: LeaderLock, other: LeaderLock, name: str
    ) -> None:
        # The "extend without an owner check" bug: the old holder's renewal must not touch
        # the lock another process took after its expiry.
        assert lock.acquire(name, "old", SHORT_TTL, "old") is not None
        new_ttl = 2.0
        fence = eventually(
            lambda: other.acquire(name, "new", new_ttl, "new"), 10.0, description="the takeover"
        )
        assert lock.renew(name, "old", LONG_TTL) is False
        info = other.info(name)
        assert info is not None
        assert (info.owner, info.fence) == ("new", fence)
        assert info.expires_in <= new_ttl

    def test_renew_after_expiry_fails(self, lock: LeaderLock, name: str) -> None:
        assert lock.acquire(name, "t1", SHORT_TTL, "a") is not None
        self._expire(lock, name)
        assert lock.renew(name, "t1", LONG_TTL) is False
        assert lock.info(name) is None

    # -- release -----------------------------------------------------------------------------
    def test_stale_release_leaves_the_new_owner_holding_the_lock(
        self, lock: LeaderLock, other: LeaderLock, name: str
    ) -> None:
        assert lock.acquire(name, "old", SHORT_TTL, "old") is not None
        eventually(
            lambda: other.acquire(name, "new", LONG_TTL, "new"), 10.0, description="takeover"
        )
        assert lock.release(name, "old") is False
        info = other.info(name)
        assert info is not None and info.owner == "new"
        assert lock.acquire(name, "third", LONG_TTL, "third") is None
        assert other.renew(name, "new", LONG_TTL) is True

    def test_release_frees_the_lock_for_another_process(
        self, lock: LeaderLock, other: LeaderLock, name: str
    ) -> None:
        assert lock.acquire(name, "t1", LONG_TTL, "a") is not None
        assert lock.release(name, "t1") is True
        assert lock.release(name, "t1") is False  # twice: nothing more to free
        assert other.acquire(name, "t2", LONG_TTL, "b") is not None

    # -- fenced fires ------------------------------------------------------------------------
    def test_each_fire_is_claimed_once(self, lock: LeaderLock, name: str) -> None:
        assert lock.acquire(name, "t1", LONG_TTL, "a") is not None
        assert lock.claim(name, "t1", "report", 1_000_000) is Claim.CLAIMED
        assert lock.claim(name, "t1", "report", 1_000_000) is Claim.TAKEN
        assert lock.claim(name, "t1", "report", 2_000_000) is Claim.CLAIMED
        assert lock.claim(name, "t1", "other", 1_000_000) is Claim.CLAIMED

    def test_claim_is_refused_for_a_non_holder(
        self, lock: LeaderLock, other: LeaderLock, name: str
    ) -> None:
        assert lock.acquire(name, "t1", LONG_TTL, "a") is not None
        assert other.claim(name, "t2", "report", 1_000_000) is Claim.NOT_HOLDER
        assert other.last_fires(name) == {}
        # A fire the holder claims later is still free: the refused claim recorded nothing.
        assert lock.claim(name, "t1", "report", 1_000_000) is Claim.CLAIMED

    def test_claim_after_the_lock_expired_is_refused(
        self, lock: LeaderLock, other: LeaderLock, name: str
    ) -> None:
        assert lock.acquire(name, "old", SHORT_TTL, "old") is not None
        assert lock.claim(name, "old", "report", 1_000_000) is Claim.CLAIMED
        self._expire(lock, name)
        assert lock.claim(name, "old", "report", 2_000_000) is Claim.NOT_HOLDER
        assert other.acquire(name, "new", LONG_TTL, "new") is not None
        # The paused leader wakes: its claim of the next tick is refused, the new one's is not.
        assert lock.claim(name, "old", "report", 2_000_000) is Claim.NOT_HOLDER
        assert other.claim(name, "new", "report", 2_000_000) is Claim.CLAIMED
        # A tick the old leader fired stays fired for the new one.
        assert other.claim(name, "new", "report", 1_000_000) is Claim.TAKEN

    def test_last_fires_gives_the_newest_claim_per_schedule(
        self, lock: LeaderLock, name: str
    ) -> None:
        assert lock.acquire(name, "t1", LONG_TTL, "a") is not None
        for t in range(1, 201):  # more than a store keeps: the newest must survive pruning
            assert lock.claim(name, "t1", "every", t * 1_000_000) is Claim.CLAIMED
        assert lock.claim(name, "t1", "nightly", 7) is Claim.CLAIMED
        assert lock.last_fires(name) == {"every": 200_000_000, "nightly": 7}
        assert lock.last_fires(f"{name}.other") == {}

    def test_the_newest_fires_stay_claimed_when_older_ones_are_pruned(
        self, lock: LeaderLock, name: str
    ) -> None:
        # A store prunes old claims, but never one of the newest KEEP_FIRES of a schedule: a
        # leader catching up on up to that many ticks must find each of them claimed once.
        assert lock.acquire(name, "t1", LONG_TTL, "a") is not None
        for t in range(1, 201):
            assert lock.claim(name, "t1", "every", t) is Claim.CLAIMED
        kept = range(200 - KEEP_FIRES + 1, 201)
        again = {t: lock.claim(name, "t1", "every", t) for t in kept}
        assert {t: c for t, c in again.items() if c is not Claim.TAKEN} == {}

    # -- who claimed a fire ------------------------------------------------------------------
    @staticmethod
    def _needs_claimed_by(lock: LeaderLock) -> None:
        if type(lock).claimed_by is LeaderLock.claimed_by:
            pytest.skip("n/a: the backend does not implement LeaderLock.claimed_by (optional)")

    def test_claimed_by_gives_the_fence_of_the_holder_that_claimed_the_fire(
        self, lock: LeaderLock, other: LeaderLock, name: str
    ) -> None:
        # A leader whose claim's answer was lost asks this once the lock moved on: its own
        # fence means the fire is its own to publish, another's that the next leader has it.
        self._needs_claimed_by(lock)
        old = lock.acquire(name, "old", SHORT_TTL, "old")
        assert old is not None
        assert lock.claim(name, "old", "report", 1_000_000) is Claim.CLAIMED
        assert lock.claimed_by(name, "report", 1_000_000) == old
        self._expire(lock, name)
        new = other.acquire(name, "new", LONG_TTL, "new")
        assert new is not None and new != old
        assert other.claim(name, "new", "report", 2_000_000) is Claim.CLAIMED
        # Claimed again: the record, and who made it, stay the first claimer's.
        assert other.claim(name, "new", "report", 1_000_000) is Claim.TAKEN
        assert lock.claimed_by(name, "report", 1_000_000) == old
        assert lock.claimed_by(name, "report", 2_000_000) == new
        assert other.claimed_by(name, "report", 1_000_000) == old

    def test_claimed_by_is_none_for_a_fire_nobody_claimed(
        self, lock: LeaderLock, other: LeaderLock, name: str
    ) -> None:
        self._needs_claimed_by(lock)
        assert lock.acquire(name, "t1", LONG_TTL, "a") is not None
        assert lock.claim(name, "t1", "report", 1_000_000) is Claim.CLAIMED
        assert lock.claimed_by(name, "report", 2_000_000) is None
        assert lock.claimed_by(name, "other", 1_000_000) is None
        assert lock.claimed_by(f"{name}.other", "report", 1_000_000) is None
        # A refused claim records nobody.
        assert other.claim(name, "t2", "report", 3_000_000) is Claim.NOT_HOLDER
        assert other.claimed_by(name, "report", 3_000_000) is None

    def test_claimed_by_is_none_once_the_claim_was_pruned(
        self, lock: LeaderLock, name: str
    ) -> None:
        self._needs_claimed_by(lock)
        fence = lock.acquire(name, "t1", LONG_TTL, "a")
        assert fence is not None
        for t in range(1, 201):
            assert lock.claim(name, "t1", "every", t) is Claim.CLAIMED
        assert lock.claimed_by(name, "every", 1) is None
        assert lock.claimed_by(name, "every", 200 - KEEP_FIRES + 1) == fence
        assert lock.claimed_by(name, "every", 200) == fence

    def test_claimed_by_is_none_after_the_lock_was_deleted(
        self, lock: LeaderLock, other: LeaderLock, name: str
    ) -> None:
        self._needs_claimed_by(lock)
        if type(lock).delete is LeaderLock.delete:
            pytest.skip("n/a: the backend does not implement LeaderLock.delete (optional)")
        assert lock.acquire(name, "t1", LONG_TTL, "a") == 1
        assert lock.claim(name, "t1", "report", 1_000_000) is Claim.CLAIMED
        lock.delete(name)
        assert other.claimed_by(name, "report", 1_000_000) is None
        # A fire claimed again after the delete is the new holder's, whose fence starts at 1.
        assert other.acquire(name, "t2", LONG_TTL, "b") == 1
        assert other.claim(name, "t2", "report", 1_000_000) is Claim.CLAIMED
        assert other.claimed_by(name, "report", 1_000_000) == 1
        other.delete(name)
