"""What a publish may carry, read from the broker's :class:`~ackwise.Capabilities` only."""

from __future__ import annotations

import datetime as dt
import math

from ackwise._spi import Capabilities
from ackwise.errors import InvalidSchedule, MessageTooLarge

__all__ = ["check_publish", "schedule_delay"]


def schedule_delay(
    what: str, countdown: float | None, eta: dt.datetime | None, now: float
) -> float:
    """Turn ``countdown`` / ``eta`` into a delay in seconds, refusing what cannot be meant."""
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


def check_publish(what: str, caps: Capabilities, scheme: str, body: bytes, delay: float) -> None:
    """Refuse, before anything is sent, a message the broker cannot take or hold that long."""
    limit = caps.max_message_size
    if limit is not None and len(body) > limit:
        raise MessageTooLarge(
            f"{what}: the encoded message is {len(body)} bytes; the broker "
            f"({scheme}) accepts at most {limit}; nothing was published"
        )
    if delay and (not caps.native_delay or (caps.max_delay is not None and delay > caps.max_delay)):
        raise InvalidSchedule(
            f"{what}: a delay of {delay:.3f}s is more than the broker "
            f"({scheme}) can hold (max_delay={caps.max_delay}); nothing was published"
        )
