"""Level 2 of the conformance suite as a pytest base class.

An adapter author subclasses :class:`CrashConformance` and overrides the ``broker`` fixture::

    class TestRedisCrash(CrashConformance):
        @pytest.fixture
        def broker(self, redis_broker):       # e.g. a session-scoped fixture of yours
            return redis_broker

Every (scenario, mode) of the catalogue becomes one test, named like
``test_scenario[C02-LATE]``.  ``n/a`` cases are skipped with the missing capability, pending
cases (parts of ackwise not built yet) are skipped as ``pending: …`` — neither counts as a pass.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from ackwise import Ack
from ackwise_conformance.runner import case_label
from ackwise_conformance.scenarios import SCENARIOS, cases, run_case

__all__ = ["CrashConformance"]


class CrashConformance:
    """Base class: the crash-scenario catalogue against the broker of :meth:`broker`."""

    @pytest.fixture
    def broker(self) -> Any:
        """The broker under test: a BrokerHandle (or anything with ``name`` and ``url``)."""
        pytest.fail(f"{type(self).__name__} must override the 'broker' fixture")

    @pytest.fixture
    def time_scale(self) -> float:
        """Multiplier for every lease, delay and timeout of the scenarios."""
        return 1.0

    @pytest.mark.parametrize("case", cases(), ids=case_label)
    def test_scenario(
        self, case: tuple[str, Ack | None], broker: Any, time_scale: float, tmp_path: Path
    ) -> None:
        sid, mode = case
        result = run_case(broker, sid, mode, tmp_path, time_scale=time_scale)
        title = SCENARIOS[sid].title
        if result.status == "n/a":
            pytest.skip(f"n/a: {result.reason}")
        if result.status == "pending":
            pytest.skip(f"pending: {result.reason}")
        if result.status == "fail":
            pytest.fail(
                f"{sid} ({title}) in mode {mode.name if mode else '-'}:\n{result.reason}",
                pytrace=False,
            )
