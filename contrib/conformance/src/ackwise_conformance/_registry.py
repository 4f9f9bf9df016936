"""The crash-scenario registry: the :func:`scenario` decorator the case modules register with,
the :data:`SCENARIOS` it fills, and the delivery modes a scenario runs in.

The bottom of the catalogue: the case modules (``_cases_*``) import it, and
:mod:`~ackwise_conformance.scenarios` imports them (and re-exports what is here).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from ackwise import Ack

if TYPE_CHECKING:
    from ackwise_conformance.harness import Harness

__all__ = ["ALL", "EARLY", "LATE", "ROL", "SCENARIOS", "Scenario", "scenario"]

EARLY, LATE, ROL = Ack.EARLY, Ack.LATE, Ack.REJECT_ON_LOST
ALL = (EARLY, LATE, ROL)


@dataclass(frozen=True)
class Scenario:
    id: str
    title: str
    fn: Callable[[Harness], None]
    #: Modes the scenario runs in; ``(None,)`` for mode-independent scenarios (beat).
    modes: tuple[Ack | None, ...] = ALL
    #: Modes whose cell of the catalogue is "—", with the reason shown as n/a.
    na_modes: dict[Ack, str] = field(default_factory=dict)
    #: Runs alone: it restarts the broker every other case shares.
    exclusive: bool = False
    #: About how long one case takes (seconds, idle machine): a runner starts long ones first.
    cost: float = 5.0


SCENARIOS: dict[str, Scenario] = {}


def scenario(
    sid: str,
    title: str,
    *,
    modes: tuple[Ack | None, ...] = ALL,
    na_modes: dict[Ack, str] | None = None,
    exclusive: bool = False,
    cost: float = 5.0,
) -> Callable[[Callable[[Harness], None]], Callable[[Harness], None]]:
    def register(fn: Callable[[Harness], None]) -> Callable[[Harness], None]:
        SCENARIOS[sid] = Scenario(sid, title, fn, modes, na_modes or {}, exclusive, cost)
        return fn

    return register
