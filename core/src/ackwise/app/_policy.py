"""Broker limits applied before anything runs: what a publish may carry, how a worker may be
configured, how long its tasks may hold a delivery.  Read from the broker's
:class:`~ackwise.Capabilities` only.  (What a call's own options may say, countdown and eta
included, is :class:`ackwise.app._task.SendOptions`'s to check.)"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from ackwise.contract._spi import MAX_PRIORITY, Adapter, BrokerURL, Capabilities, LeaseExtension
from ackwise.errors import (
    AckwiseError,
    ConfigurationError,
    InvalidPriority,
    InvalidSchedule,
    MessageTooLarge,
)

if TYPE_CHECKING:
    from ackwise.app._ports import AppPort
    from ackwise.app._task import Task

__all__ = [
    "POOLS",
    "WorkerConfig",
    "check_hold_limit",
    "check_priority",
    "check_publish",
    "max_auto_prefetch",
]


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


def check_priority(
    what: str,
    priority: object,
    caps: Callable[[], Capabilities],
    scheme: str,
    error: type[AckwiseError] = InvalidPriority,
) -> int:
    """``priority`` as an int from 0 to MAX_PRIORITY that the broker can order by, or raise
    ``error`` (:class:`InvalidPriority` for a call, ConfigurationError for a declaration).
    ``caps`` is called only for a priority above 0."""
    if isinstance(priority, bool) or not isinstance(priority, int):
        raise error(f"{what}: priority must be an int from 0 to {MAX_PRIORITY}, got {priority!r}")
    if not 0 <= priority <= MAX_PRIORITY:
        raise error(
            f"{what}: priority must be from 0 (lowest, the default) to {MAX_PRIORITY}, "
            f"got {priority}"
        )
    if priority and not caps().priorities:
        raise error(
            f"{what}: priority {priority} on a broker ({scheme}) that has no message "
            "priorities; see docs/priorities.md for the brokers that do"
        )
    return priority


# -- worker configuration ------------------------------------------------------------------
POOLS = ("prefork", "threads", "solo")


def max_auto_prefetch(concurrency: int) -> int:
    """The most messages an automatic prefetch holds: 64, or 4 x concurrency if more."""
    return max(4 * concurrency, 64)


@dataclass
class WorkerConfig:
    """Settings of one worker process; checked by :meth:`validate`."""

    queues: Sequence[str] = ()
    concurrency: int = 0  # 0: number of CPUs (prefork / threads), 1 for solo
    pool: str = "prefork"
    #: Messages held at once, running included.  0: 4 x concurrency; on an adapter with
    #: ``deep_prefetch`` (RabbitMQ) raised while tasks are short (see ``ackwise.worker._prefetch.PREFETCH_HOLD``),
    #: up to :func:`max_auto_prefetch`.
    prefetch: int = 0
    prefetch_auto: bool = False  # set by validate() when prefetch was 0
    lease: float = 30.0
    grace: float = 30.0
    #: How long one idle receive may block (also bounds the reaction to a stop request).
    poll: float = 1.0
    app_path: str | None = None
    #: A message naming an unknown task is offered again after this delay (a rolling deploy
    #: may bring the task), up to ``unknown_task_deliveries`` deliveries, then dead-lettered.
    unknown_task_delay: float = 5.0
    unknown_task_deliveries: int = 3
    #: Give up (exit with an error) when the broker stays unreachable this long.
    broker_timeout: float = 60.0

    def validate(self, app: AppPort, adapter_cls: type[Adapter]) -> None:
        """Refuse settings that cannot hold together, or that ``adapter_cls``'s broker
        cannot serve (:class:`ackwise.errors.ConfigurationError`, one line naming the option).

        What the app's and its tasks' own options need is not checked here but by
        :func:`ackwise.app._requirements.check_app`, which producers call too."""
        if self.pool not in POOLS:
            raise ConfigurationError(f"--pool must be one of {', '.join(POOLS)}, got {self.pool!r}")
        if self.pool == "solo":
            if self.concurrency not in (0, 1):
                raise ConfigurationError("--pool solo runs one task at a time; drop -c")
            self.concurrency = 1
        if self.concurrency == 0:
            self.concurrency = os.cpu_count() or 1
        if self.concurrency < 1:
            raise ConfigurationError(f"concurrency must be >= 1, got {self.concurrency}")
        if self.prefetch == 0:
            self.prefetch = 4 * self.concurrency
            self.prefetch_auto = adapter_cls.capabilities.deep_prefetch
        if self.prefetch < 1:
            raise ConfigurationError(f"--prefetch must be >= 1, got {self.prefetch}")
        if not self.lease > 0:
            raise ConfigurationError(f"--lease must be > 0 seconds, got {self.lease}")
        if self.grace < 0:
            raise ConfigurationError(f"--grace must be >= 0 seconds, got {self.grace}")
        caps = adapter_cls.capabilities
        if caps.max_lease is not None and self.lease > caps.max_lease:
            raise ConfigurationError(
                f"--lease {self.lease}s is longer than the broker allows ({caps.max_lease}s)"
            )
        if self.unknown_task_delay < 0 or self.unknown_task_deliveries < 1:
            raise ConfigurationError(
                "unknown_task_delay must be >= 0 and unknown_task_deliveries >= 1"
            )
        if not self.broker_timeout > 0:
            raise ConfigurationError(f"--broker-timeout must be > 0, got {self.broker_timeout}")
        hard = sorted(t.name for t in app.tasks.values() if t.time_limit is not None)
        if hard and self.pool != "prefork":
            raise ConfigurationError(
                f"tasks {hard} have a hard time_limit, which only the prefork pool can enforce "
                f"(a thread cannot be killed); use --pool prefork, or give them only a "
                "soft_time_limit"
            )
        if caps.lease_extension is LeaseExtension.NONE:
            # A task without a time_limit is the app's to refuse (check_app); this one's
            # time_limit is checked against this worker's lease.
            long = [
                t.name
                for t in app.tasks.values()
                if t.time_limit is not None and t.time_limit > self.lease
            ]
            if long:
                raise ConfigurationError(
                    f"the broker cannot extend leases and tasks {long} may run longer than "
                    f"--lease {self.lease}s: give them a time_limit within the lease"
                )
        if self.pool == "prefork" and not self.app_path:
            raise ConfigurationError(
                "--pool prefork needs the app's import path ('module:app') to start children; "
                "use the threads pool for an App object without one"
            )
        paced = sorted(t.name for t in app.tasks.values() if t.rate_interval is not None)
        store = app.rate_limit_store_url
        if (
            self.pool == "prefork"
            and paced
            and store is not None
            and BrokerURL.parse(store).scheme.lower() == "memory"
        ):
            # Each child records the starts it makes in the store (docs/rate-limits.md).
            raise ConfigurationError(
                f"tasks {paced} have a rate_limit kept in {store}, this process's memory, "
                "which the prefork pool's children cannot reach; use --pool threads, or "
                "App(rate_limit_store=URL) with a store they share (sqlite, redis)"
            )
        self.queues = list(self.queues) or app.queues()


def check_hold_limit(tasks: Sequence[Task[..., Any]], limit: float) -> list[str]:
    """Refuse tasks that may run longer than the broker lets a delivery stay unsettled
    (``limit`` seconds); return the names of those without a time limit (to log)."""
    long = sorted(t.name for t in tasks if t.time_limit is not None and t.time_limit > limit)
    if long:
        raise ConfigurationError(
            f"tasks {long} have a time_limit longer than the broker lets a delivery stay "
            f"unacknowledged ({limit:.0f}s, RabbitMQ's consumer_timeout): the broker would "
            "take the message back mid-run; lower the time_limit or raise the broker's "
            "consumer_timeout (and say it in the URL)"
        )
    return sorted(t.name for t in tasks if t.time_limit is None)
