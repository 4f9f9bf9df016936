"""Schedules of periodic tasks: fixed intervals and crontab expressions (docs/periodic.md).

A schedule is a pure function of time: every ``ackwise beat`` process computes the same fire
times, which is what lets the leader claim each (schedule, fire time) once in the lock store.

* :class:`Interval` fires at every multiple of ``every`` seconds since the Unix epoch (UTC),
  so ``every=300`` fires at :00, :05, :10 … whichever process computes it.
* :class:`Cron` fires at the times a standard five-field crontab expression names, read in
  its time zone (``zoneinfo``).  Daylight-saving transitions follow Debian cron, as cronsim
  implements it: a fixed-time job (minute and hour fields not starting with ``*``) whose time
  is skipped when clocks spring forward runs once at the first valid minute after the gap
  (``30 2 * * *`` in Europe/Paris runs at 03:00 CEST on the last Sunday of March), and runs
  once, at the first occurrence, when clocks fall back; a job with a ``*`` minute or hour
  field follows real time (the skipped hour has no ticks, the repeated hour ticks twice).

Fire times are aware UTC datetimes; their ISO form is part of each fire's idempotency key.
"""

from __future__ import annotations

import abc
import datetime as dt
import math
import zoneinfo
from collections.abc import Container, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

from cronsim import CronSim, CronSimError

from ackwise.contract._envelope import check_json, check_queue_name
from ackwise.errors import ConfigurationError, PublishError

__all__ = ["MISSED_POLICIES", "Cron", "Interval", "Periodic", "Schedule", "from_us", "to_us"]

UTC = dt.UTC
EPOCH = dt.datetime(1970, 1, 1, tzinfo=UTC)
_US = dt.timedelta(microseconds=1)

#: What a leader does with ticks that passed while no leader fired them.
MISSED_POLICIES = ("coalesce", "catch_up")

#: The shortest interval accepted (seconds).
MIN_INTERVAL = 0.001

_ALIASES = {
    "@yearly": "0 0 1 1 *",
    "@annually": "0 0 1 1 *",
    "@monthly": "0 0 1 * *",
    "@weekly": "0 0 * * 0",
    "@daily": "0 0 * * *",
    "@midnight": "0 0 * * *",
    "@hourly": "0 * * * *",
}

# A crontab expression that names no real time (30 February) makes cronsim search for years;
# it stops at this many candidates.
_MAX_STEPS = 100_000


def to_us(t: dt.datetime) -> int:
    """Microseconds since the Unix epoch of an aware datetime (exact, no float rounding)."""
    return (t - EPOCH) // _US


def from_us(us: int) -> dt.datetime:
    """The aware UTC datetime ``us`` microseconds after the Unix epoch."""
    return EPOCH + dt.timedelta(microseconds=us)


def _aware(t: dt.datetime, what: str) -> dt.datetime:
    if t.tzinfo is None or t.utcoffset() is None:
        raise ValueError(f"{what} must be an aware datetime, got naive {t.isoformat()}")
    return t.astimezone(UTC)


class Schedule(abc.ABC):
    """When a periodic task fires.  Implementations are immutable and deterministic."""

    @abc.abstractmethod
    def next_after(self, after: dt.datetime) -> dt.datetime | None:
        """Return the first fire time strictly after ``after`` (aware UTC), or ``None``."""

    @abc.abstractmethod
    def due(
        self, after: dt.datetime, until: dt.datetime, limit: int
    ) -> tuple[list[dt.datetime], bool]:
        """Return the fire times in ``(after, until]``, oldest first, and whether some were cut.

        At most the newest ``limit`` fire times are returned; the flag says older ones were
        left out.
        """

    @abc.abstractmethod
    def describe(self) -> str:
        """A short human description (``every 60s``, ``cron 30 2 * * * Europe/Paris``)."""

    @property
    def tz(self) -> dt.tzinfo:
        """The zone fire times are shown in."""
        return UTC

    def upcoming(self, after: dt.datetime, count: int) -> list[dt.datetime]:
        """The next ``count`` fire times after ``after``."""
        out: list[dt.datetime] = []
        t: dt.datetime | None = after
        while t is not None and len(out) < count:
            t = self.next_after(t)
            if t is not None:
                out.append(t)
        return out


@dataclass(frozen=True)
class Interval(Schedule):
    """Fire every ``every`` seconds, at multiples of ``every`` since the Unix epoch (UTC)."""

    every: float
    _every_us: int = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        every = self.every
        if (
            isinstance(every, bool)
            or not isinstance(every, int | float)
            or not math.isfinite(every)
            or every < MIN_INTERVAL
        ):
            raise ConfigurationError(
                f"every must be a number of seconds >= {MIN_INTERVAL}, got {every!r}"
            )
        object.__setattr__(self, "_every_us", round(every * 1_000_000))

    def next_after(self, after: dt.datetime) -> dt.datetime:
        """The first multiple of ``every`` seconds since the epoch strictly after ``after``."""
        step = self._every_us
        return from_us((to_us(_aware(after, "after")) // step + 1) * step)

    def due(
        self, after: dt.datetime, until: dt.datetime, limit: int
    ) -> tuple[list[dt.datetime], bool]:
        """The fire times in ``(after, until]`` (the newest ``limit``) and whether some were cut."""
        step = self._every_us
        first = to_us(_aware(after, "after")) // step + 1
        last = to_us(_aware(until, "until")) // step
        count = last - first + 1
        if count <= 0:
            return [], False
        take = min(count, max(limit, 0))
        return [from_us(k * step) for k in range(last - take + 1, last + 1)], take < count

    def describe(self) -> str:
        """``every 60s``."""
        return f"every {self.every:g}s"


class Cron(Schedule):
    """Fire at the times a five-field crontab expression names, in time zone ``tz``.

    Aliases ``@hourly``, ``@daily`` (``@midnight``), ``@weekly``, ``@monthly`` and
    ``@yearly`` (``@annually``) are accepted.  Parsing and DST rules are cronsim's.

    :raises ConfigurationError: the expression or the zone is not valid.
    """

    def __init__(self, expr: str, tz: str | dt.tzinfo | None = None) -> None:
        if not isinstance(expr, str) or not expr.strip():
            raise ConfigurationError(f"cron must be a crontab expression, got {expr!r}")
        self.expr = " ".join(expr.split())
        spec = _ALIASES.get(self.expr.lower(), self.expr)
        if len(spec.split()) != 5:
            raise ConfigurationError(
                f"cron {expr!r}: expected five fields (minute hour day-of-month month "
                "day-of-week), e.g. '*/5 * * * *', or an alias such as '@daily'"
            )
        self._spec = spec
        self._tz = _zone(tz)
        try:
            CronSim(spec, dt.datetime.now(self._tz))
        except CronSimError as exc:
            raise ConfigurationError(f"cron {expr!r} is not a valid expression: {exc}") from exc

    def __repr__(self) -> str:
        return f"Cron({self.expr!r}, tz={self.tz_name!r})"

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Cron) and (self._spec, self.tz_name) == (
            other._spec,
            other.tz_name,
        )

    def __hash__(self) -> int:
        return hash((self._spec, self.tz_name))

    @property
    def tz(self) -> dt.tzinfo:
        return self._tz

    @property
    def tz_name(self) -> str:
        return str(getattr(self._tz, "key", None) or self._tz)

    def _forward(self, after: dt.datetime) -> Iterator[dt.datetime]:
        it = CronSim(self._spec, after.astimezone(self._tz))
        for _ in range(_MAX_STEPS):
            try:
                t = next(it)
            except (StopIteration, CronSimError):
                return
            yield t.astimezone(UTC)

    def next_after(self, after: dt.datetime) -> dt.datetime | None:
        """The first fire time strictly after ``after``, or ``None`` if the expression never
        fires again."""
        after = _aware(after, "after")
        # cronsim works on local wall time; around a fall-back transition it can hand back a
        # wall time that is earlier in real time: skip those.
        for t in self._forward(after):
            if t > after:
                return t
        return None

    def due(
        self, after: dt.datetime, until: dt.datetime, limit: int
    ) -> tuple[list[dt.datetime], bool]:
        """The fire times in ``(after, until]`` (the newest ``limit``) and whether some were cut."""
        after, until = _aware(after, "after"), _aware(until, "until")
        if until <= after or limit <= 0:
            return [], until > after and self.next_after(after) is not None
        # Walk back from ``until`` (inclusive: cronsim's reverse walk starts one second
        # before a whole-second time, so start a microsecond later).
        it = CronSim(self._spec, (until + _US).astimezone(self._tz), reverse=True)
        newest: list[dt.datetime] = []
        cut = False
        for _ in range(_MAX_STEPS):
            try:
                t = next(it).astimezone(UTC)
            except (StopIteration, CronSimError):
                break
            if t <= after:
                break
            if t > until or (newest and t >= newest[-1]):
                continue
            if len(newest) == limit:
                cut = True
                break
            newest.append(t)
        newest.reverse()
        return newest, cut

    def describe(self) -> str:
        """``cron 30 2 * * * Europe/Paris``."""
        return f"cron {self.expr} {self.tz_name}"


def _zone(tz: str | dt.tzinfo | None) -> dt.tzinfo:
    if tz is None:
        return UTC
    if isinstance(tz, dt.tzinfo):
        return tz
    if not isinstance(tz, str) or not tz:
        raise ConfigurationError(f"tz must be an IANA zone name such as 'Europe/Paris', got {tz!r}")
    if tz.upper() == "UTC":
        return UTC
    try:
        return zoneinfo.ZoneInfo(tz)
    except (zoneinfo.ZoneInfoNotFoundError, ValueError) as exc:
        raise ConfigurationError(
            f"tz {tz!r} is not a known time zone (expected an IANA name such as "
            "'Europe/Paris'; on systems without a zone database install the 'tzdata' package)"
        ) from exc


@dataclass(frozen=True)
class Periodic:
    """A schedule declared with :meth:`ackwise.App.periodic`: which task, when, with what."""

    name: str
    task: str
    schedule: Schedule
    args: tuple[Any, ...] = ()
    kwargs: dict[str, Any] = field(default_factory=dict)
    queue: str | None = None
    missed: str = "coalesce"
    catch_up_limit: int = 100

    def key(self, fire_time: dt.datetime) -> str:
        """The idempotency key of the fire at ``fire_time``: ``name:fire_time_iso`` (UTC)."""
        return f"{self.name}:{fire_time.astimezone(UTC).isoformat()}"

    def due(self, after: dt.datetime, until: dt.datetime) -> tuple[list[dt.datetime], bool]:
        """The fire times to fire now under the missed-fire policy, and whether some were cut.

        ``coalesce``: the newest tick in ``(after, until]`` stands for all of them.
        ``catch_up``: every tick, at most the newest ``catch_up_limit``.
        """
        limit = 1 if self.missed == "coalesce" else self.catch_up_limit
        return self.schedule.due(after, until, limit)


def make_schedule(every: float | None, cron: str | None, tz: str | dt.tzinfo | None) -> Schedule:
    """Build the schedule of ``every=`` or ``cron=`` (exactly one), refusing what is unclear."""
    if (every is None) == (cron is None):
        raise ConfigurationError("give exactly one of every=SECONDS or cron='EXPRESSION'")
    if every is not None:
        if tz is not None:
            raise ConfigurationError(
                "tz applies to cron schedules only: an interval counts real seconds"
            )
        return Interval(every)
    assert cron is not None
    return Cron(cron, tz)


def declare(
    task: str,
    schedule: Schedule,
    *,
    app: str,
    declared: Container[str],
    name: str | None,
    args: Sequence[Any],
    kwargs: dict[str, Any] | None,
    queue: str | None,
    missed: str,
    catch_up_limit: int | None,
) -> Periodic:
    """Validate one schedule of the task named ``task`` on the app named ``app``, whose
    schedules so far are named ``declared`` (the body of :meth:`App.periodic`); the app keeps
    what it returns."""
    sname = task if name is None else name
    if not isinstance(sname, str) or not sname.strip() or len(sname) > 200 or "\n" in sname:
        raise ConfigurationError(
            f"schedule name must be a non-empty single-line string of at most 200 characters, "
            f"got {sname!r}"
        )
    if sname in declared:
        raise ConfigurationError(
            f"schedule name {sname!r} is declared twice on app {app!r}; give each "
            "schedule of the same task its own name=..."
        )
    if missed not in MISSED_POLICIES:
        raise ConfigurationError(
            f"missed must be one of {', '.join(map(repr, MISSED_POLICIES))}, got {missed!r}"
        )
    if catch_up_limit is not None and missed != "catch_up":
        raise ConfigurationError("catch_up_limit applies to missed='catch_up' only")
    limit = 100 if catch_up_limit is None else catch_up_limit
    if isinstance(limit, bool) or not isinstance(limit, int) or limit < 1:
        raise ConfigurationError(f"catch_up_limit must be an int >= 1, got {catch_up_limit!r}")
    if not isinstance(args, Sequence) or isinstance(args, str | bytes):
        raise ConfigurationError(f"args must be a list or tuple, got {type(args).__name__}")
    kwargs = dict(kwargs or {})
    # Refused now, not at 3 a.m. when the schedule first fires.
    if args:
        check_json(task, "args", list(args))
    if kwargs:
        check_json(task, "kwargs", kwargs)
    if queue is not None:
        try:
            queue = check_queue_name(queue)
        except PublishError as exc:
            raise ConfigurationError(f"schedule {sname!r}: {exc}") from exc
    return Periodic(
        name=sname,
        task=task,
        schedule=schedule,
        args=tuple(args),
        kwargs=kwargs,
        queue=queue,
        missed=missed,
        catch_up_limit=limit,
    )
