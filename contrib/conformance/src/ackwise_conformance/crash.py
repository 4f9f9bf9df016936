"""Level 2 of the conformance suite as a pytest base class.

An adapter author subclasses :class:`CrashConformance` and overrides the ``broker`` fixture::

    class TestRedisCrash(CrashConformance):
        @pytest.fixture
        def broker(self, redis_broker):       # e.g. a session-scoped fixture of yours
            return redis_broker

Every (scenario, mode) of the catalogue becomes one test, named like
``test_scenario[C02-LATE]``.  ``n/a`` cases are skipped with the missing capability, pending
cases (parts of ackwise not built yet) are skipped as ``pending: …`` — neither counts as a pass.

The class's selected cases run as one concurrent batch, as ``ackwise conformance`` runs them
(:func:`~ackwise_conformance.runner.run_cases`): the first of them to run starts the batch on its
``broker`` and takes as long as the whole batch; each test then reports its own case's verdict.
Each case is bounded by the runner's case timeout, so the batch is too.
"""

from __future__ import annotations

import secrets
from typing import Any

import pytest

from ackwise import Ack
from ackwise_conformance.runner import Case, case_label, run_cases
from ackwise_conformance.scenarios import SCENARIOS, CaseResult, cases

__all__ = ["CrashConformance"]

#: The verdicts of a class's batch, kept on its pytest node.
_BATCH = pytest.StashKey[dict[Case, CaseResult]]()

#: pytest-timeout's bound for the test that runs the batch: the runner fails and closes any case
#: past its own timeout, so this only catches a runner that hangs outside every case.
BATCH_TIMEOUT = 4 * 3600


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

    @pytest.mark.timeout(BATCH_TIMEOUT)
    @pytest.mark.parametrize("case", cases(), ids=case_label)
    def test_scenario(
        self,
        case: tuple[str, Ack | None],
        broker: Any,
        time_scale: float,
        request: pytest.FixtureRequest,
        tmp_path_factory: pytest.TempPathFactory,
    ) -> None:
        verdicts = _batch_verdicts(request, broker, time_scale, tmp_path_factory)
        if case not in verdicts:  # not in the session's selection (run directly): run it alone
            verdicts.update(_run(broker, [case], time_scale, tmp_path_factory))
        result = verdicts[case]
        sid, mode = case
        if result.status == "n/a":
            pytest.skip(f"n/a: {result.reason}")
        if result.status == "pending":
            pytest.skip(f"pending: {result.reason}")
        if result.status == "fail":
            pytest.fail(
                f"{sid} ({SCENARIOS[sid].title}) in mode {mode.name if mode else '-'}:\n"
                f"{result.reason}",
                pytrace=False,
            )


def _batch_verdicts(
    request: pytest.FixtureRequest,
    broker: Any,
    time_scale: float,
    tmp_path_factory: pytest.TempPathFactory,
) -> dict[Case, CaseResult]:
    """The verdicts of every selected case of this test's class, the batch run on first use."""
    node = request.node.parent
    if node is None:
        return {}
    verdicts: dict[Case, CaseResult] | None = node.stash.get(_BATCH, None)
    if verdicts is None:
        name = request.node.originalname
        selected: list[Case] = [
            item.callspec.params["case"]
            for item in request.session.items
            if item.parent is node
            and getattr(item, "originalname", None) == name
            and hasattr(item, "callspec")
        ]
        verdicts = _run(broker, selected, time_scale, tmp_path_factory)
        node.stash[_BATCH] = verdicts
    return verdicts


def _run(
    broker: Any,
    selected: list[Case],
    time_scale: float,
    tmp_path_factory: pytest.TempPathFactory,
) -> dict[Case, CaseResult]:
    workdir = tmp_path_factory.mktemp("conformance")
    prefix = f"conformance-{secrets.token_hex(3)}-"
    results = run_cases(broker, selected, workdir, time_scale=time_scale, prefix=prefix)
    return dict(zip(selected, results, strict=True))
