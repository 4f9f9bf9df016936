"""Scenarios B01-B04: the leader lock of ``ackwise beat`` (start together, pause, cut off,
stale release)."""

from __future__ import annotations

import dataclasses
import itertools
import signal
import time
from dataclasses import dataclass
from typing import Any

from ackwise import LeaderLock
from ackwise_conformance._case_helpers import pause_outside_writes
from ackwise_conformance._registry import scenario
from ackwise_conformance.harness import (
    Harness,
    NotApplicable,
    expect,
)
from ackwise_conformance.helpers import eventually

# -- beat --------------------------------------------------------------------------------------
#: Ticks every beat scenario observes at least (docs/periodic.md: at least 60 scheduled ticks).
BEAT_TICKS = 60


@dataclass(frozen=True)
class _BeatTiming:
    every: float
    ttl: float
    tick: float

    @property
    def gap_bound(self) -> float:
        """The longest a leader change may leave the schedule without a fire: TTL + one tick."""
        return self.ttl + self.tick


def _beat_timing(h: Harness) -> _BeatTiming:
    return _BeatTiming(every=h.t(0.1), ttl=h.t(1.0), tick=h.t(0.1))


def _slack(h: Harness) -> float:
    # Publishing, process scheduling and store round trips on a loaded machine.
    return h.t(0.5)


def _wait_fires(h: Harness, count: int, queue: str | None = None, *, what: str = "") -> None:
    timing = _beat_timing(h)
    eventually(
        lambda: h.fire_count(queue) >= count,
        h.patience + count * timing.every * 2,
        description=f"{count} fires{what} (have {h.fire_count(queue)})",
    )


def _wait_leader(h: Harness, beat: Any, group: str = "") -> None:
    eventually(
        lambda: h.leader_pid(group) == beat.pid,
        h.patience,
        description=f"beat {beat.index} (pid {beat.pid}) to lead; leader is {h.leader(group)}",
    )


def _pause_the_leader(h: Harness, timing: _BeatTiming) -> tuple[Any, Any]:
    """Beat A leads, beat B follows, 15 ticks fire; then A is paused.  Returns (A, B)."""
    a = h.beat(every=timing.every, ttl=timing.ttl, tick=timing.tick)
    _wait_leader(h, a)
    b = h.beat(every=timing.every, ttl=timing.ttl, tick=timing.tick)
    _wait_fires(h, 15)
    _pause(h, a)
    return a, b


def _pause(h: Harness, beat: Any) -> None:
    """SIGSTOP ``beat`` at a moment it holds no write transaction of the lock store.

    The probe waits a tenth of a second, not a store timeout: while it waits, nothing can
    write, so every second it waits is a second the schedule goes without a fire, charged to
    the gap bound the scenario checks (a 2 s probe made B02 fail so on a loaded machine).
    """
    pause_outside_writes(h, beat, h.t(0.1), f"beat {beat.index}")


def _check_fires(
    h: Harness,
    fires: list[Any],
    *,
    ticks: int = BEAT_TICKS,
    gap: float | None = None,
    may_lose: int = 0,
) -> None:
    """Every tick from the first fire to the last fired once; at least ``ticks`` of them.

    :param may_lose: ticks that may be missing (fires are at most once: a claim whose answer a
        fault swallowed is published only when the store can say it was the beat's own; the
        catalogue bounds the gap, not the count).
    """
    timing = _beat_timing(h)
    keys = [f.key for f in fires]
    doubles = sorted({k for k in keys if keys.count(k) > 1})
    expect(not doubles, f"double fires ({len(doubles)} ticks): {doubles[:5]}")
    expect(len(fires) >= ticks, f"only {len(fires)} ticks fired, the scenario needs {ticks}")
    step = round(timing.every * 1_000_000)
    times = [f.fire_us for f in fires]
    expected = list(range(times[0], times[-1] + 1, step))
    missing = sorted(set(expected) - set(times))
    expect(
        set(times) <= set(expected) and len(missing) <= may_lose,
        f"ticks missing between the first and the last fire: {len(missing)} "
        f"(e.g. {missing[:3]} us; at most {may_lose} may be), or off the schedule",
    )
    expect(
        all(f.key == f"{f.schedule}:{f.fire_time}" for f in fires),
        f"a fire does not carry the idempotency key schedule:fire_time: {fires[0]}",
    )
    if gap is not None:
        published = sorted(f.published_at for f in fires)
        worst = max(b - a for a, b in itertools.pairwise(published))
        expect(
            worst <= gap,
            f"the schedule went {worst:.3f}s without a fire; allowed: TTL + one tick "
            f"({timing.gap_bound:.3f}s) + {_slack(h):.3f}s of slack",
        )


def _stop_beats(h: Harness, beats: list[Any], group: str = "") -> None:
    """SIGTERM every beat, the leader last: a follower still running when the leader releases
    the lock would take it (an election the scenario did not make); a beat told to stop takes
    no lock any more."""
    leader = h.leader_pid(group)
    for b in sorted(beats, key=lambda b: b.pid == leader):
        b.signal(signal.SIGCONT)
        expect(b.alive(), f"beat {b.index} died:\n{b.output()[-2000:]}")
        b.terminate()
    for b in beats:
        status = b.wait(h.patience)
        expect(status == 0, f"beat {b.index} exited {status} on SIGTERM:\n{b.output()[-2000:]}")


@scenario("B01", "two (and three) beat instances start together", modes=(None,), cost=17)
def b01(h: Harness) -> None:
    h.require_processes("beat processes")
    # No fault here: a longer TTL keeps a busy machine's scheduling hiccup from electing a
    # second leader, which is what this scenario counts.
    timing = dataclasses.replace(_beat_timing(h), ttl=h.t(2.0))
    for n in (2, 3):
        group, queue = f"-{n}", f"{h.queue}-b{n}"
        beats = [
            h.beat(
                every=timing.every,
                ttl=timing.ttl,
                tick=timing.tick,
                group=group,
                queue=queue,
                wait_ready=False,
            )
            for _ in range(n)
        ]
        for b in beats:
            b.wait_ready(h.patience * 2)
        _wait_fires(h, BEAT_TICKS + 2, queue, what=f" from {n} beats")
        leader = h.leader_pid(group)
        expect(leader in {b.pid for b in beats}, f"no beat of the {n} leads: {h.leader(group)}")
        _stop_beats(h, beats, group)
        fires = h.fires(queue)
        _check_fires(h, fires, gap=timing.gap_bound + _slack(h))
        fences = sorted({f.fence for f in fires})
        expect(len(fences) == 1, f"{n} beats: more than one leader over the run (fences {fences})")
        elected = [b for b in beats if "leader now" in b.output()]
        expect(len(elected) == 1, f"{n} beats: {len(elected)} of them were elected")


@scenario(
    "B02", "leader paused longer than the lock TTL (SIGSTOP, then SIGCONT)", modes=(None,), cost=9
)
def b02(h: Harness) -> None:
    h.require_processes("beat processes")
    timing = _beat_timing(h)
    a, b = _pause_the_leader(h, timing)
    paused = time.monotonic()
    try:
        _wait_leader(h, b)
        taken_over = h.fire_count()
        # Keep A frozen well past its TTL while B fires.
        _wait_fires(h, taken_over + 15, what=" from the new leader")
        h.quiet(max(0.0, paused + timing.ttl * 2 - time.monotonic()))
    finally:
        a.signal(signal.SIGCONT)
    eventually(
        lambda: "stepping down" in a.output(),
        h.patience,
        description="the old leader to report that it stepped down",
    )
    resumed = h.fire_count()
    _wait_fires(h, max(resumed + 15, BEAT_TICKS + 2), what=" after the old leader woke up")
    expect(a.alive(), f"the old leader crashed after stepping down:\n{a.output()[-2000:]}")
    expect(h.leader_pid() == b.pid, f"the lock left the new leader: {h.leader()}")
    _stop_beats(h, [a, b])
    fires = h.fires()
    _check_fires(h, fires, gap=timing.gap_bound + _slack(h))
    fences = [f.fence for f in fires]
    expect(fences == sorted(fences), f"a fire of an older leader came after the new one: {fences}")
    expect(len(set(fences)) >= 2, f"no leader change observed (fences {sorted(set(fences))})")


@scenario(
    "B03", "leader cut off from the lock store (fault proxy, longer than the TTL)", modes=(None,)
)
def b03(h: Harness) -> None:
    from ackwise_conformance.proxy import FaultProxy

    h.require_processes("beat processes")
    if h.broker.host is None or h.broker.port is None:
        raise NotApplicable(
            f"broker {h.broker.name}: an embedded lock store has no connection to cut"
        )
    timing = _beat_timing(h)
    with FaultProxy(h.broker.host, h.broker.port).start() as proxy:
        via = h.broker.url_via("127.0.0.1", proxy.port)
        a = h.beat(every=timing.every, ttl=timing.ttl, tick=timing.tick, lock_url=via)
        _wait_leader(h, a)
        b = h.beat(every=timing.every, ttl=timing.ttl, tick=timing.tick)
        _wait_fires(h, 15)
        cut = timing.ttl * 3
        proxy.blackhole(cut)
        _wait_leader(h, b)
        eventually(
            lambda: "stepping down" in a.output(),
            h.patience,
            description="the cut-off leader to step down",
        )
        _wait_fires(h, h.fire_count() + 15, what=" from the new leader")
        h.quiet(cut)  # the black hole ends; A reconnects as a follower
        _wait_fires(h, max(h.fire_count() + 15, BEAT_TICKS + 2), what=" after the cut healed")
    expect(a.alive(), f"the cut-off leader crashed:\n{a.output()[-2000:]}")
    expect(h.leader_pid() == b.pid, f"the lock left the new leader: {h.leader()}")
    _stop_beats(h, [a, b])
    fires = h.fires()
    # The claim in flight when the cut began may have been recorded with its answer lost.  Once
    # the cut heals, the old leader asks who claimed it and publishes it if it was its own; a
    # lock store that cannot tell (no LeaderLock.claimed_by: optional) leaves the leader
    # unable to vouch for it, so there that one tick may be missing.
    knows_claimers = type(h.beat_lock).claimed_by is not LeaderLock.claimed_by
    _check_fires(h, fires, gap=timing.gap_bound + _slack(h), may_lose=0 if knows_claimers else 1)
    fences = [f.fence for f in fires]
    expect(fences == sorted(fences), f"a fire of an older leader came after the new one: {fences}")


@scenario("B04", "stale lock release (after the lock moved to a new owner)", modes=(None,), cost=9)
def b04(h: Harness) -> None:
    h.require_processes("beat processes")
    timing = _beat_timing(h)
    a, b = _pause_the_leader(h, timing)
    try:
        _wait_leader(h, b)
        new_owner = h.leader()
        # A wakes with a SIGTERM pending: its last act is a release with its stale token.
        a.signal(signal.SIGTERM)
    finally:
        a.signal(signal.SIGCONT)
    status = a.wait(h.patience)
    expect(status == 0, f"the old leader exited {status}:\n{a.output()[-2000:]}")
    expect(
        "release refused" in a.output(),
        f"the old leader's release was not refused as stale:\n{a.output()[-2000:]}",
    )
    after = h.leader()
    expect(
        after is not None and new_owner is not None and after.fence == new_owner.fence,
        f"the stale release took the lock from its new owner: before {new_owner}, after {after}",
    )
    _wait_fires(h, max(h.fire_count() + 15, BEAT_TICKS + 2), what=" after the stale release")
    expect(h.leader_pid() == b.pid, f"the new owner lost the lock: {h.leader()}")
    _stop_beats(h, [b])
    _check_fires(h, h.fires(), gap=timing.gap_bound + _slack(h))
