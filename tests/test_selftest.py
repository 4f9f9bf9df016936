"""The conformance suite tests itself: every deliberately broken adapter must be caught.

``tests/selftest/broken_adapters.py`` holds six copies of the sqlite adapter, each with one bug
(drops on nack, acks a stale receipt, ignores delay, pops before recording in flight, never
redelivers after lease expiry, loses prefetched messages on shutdown).  For each one, a small
test module that subclasses :class:`CrashConformance` and :class:`AdapterConformance` runs in a
pytest subprocess on a ``broken-…:///`` URL -- a subprocess so that
``ACKWISE_PLUGINS`` and ``PYTHONPATH`` reach the ``ackwise worker`` processes the crash
scenarios start -- and the test asserts exactly which named scenarios fail and which pass.
The same selection against the real ``sqlite:///`` adapter passes (the control).

``tests/selftest/lock_holding_adapters.py`` adds one on PostgreSQL (a schema of its own on the
shared server): the real adapter whose receive keeps its transaction open until the next
settlement; both levels must name the held lock in words.

Only a few cases per adapter run, under a time scale of 0.5 (leases of 0.5 s, a patience of
15 s), and the runs go three at a time (:func:`runs`), so that the whole module takes under
a minute.  Most failures show as a timeout of that patience: the scenario waits for an event
the broken adapter never lets happen.
"""

from __future__ import annotations

import fnmatch
import glob
import os
import re
import subprocess
import sys
from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from ackwise import Plugins, open_adapter

SELFTEST_DIR = Path(__file__).parent / "selftest"
PLUGIN = "broken_adapters"
TIME_SCALE = 0.5

CRASH = "TestCrash::test_scenario"
SPI = "TestSPI"

# The test module written into each run's directory; {scheme} and {scale} are filled in.
CONFORMANCE_MODULE = """
import pytest

from ackwise import open_adapter
from ackwise_conformance import AdapterConformance
from ackwise_conformance.crash import CrashConformance
from ackwise_conformance.harness import SimpleBroker

SCHEME = {scheme!r}


class TestCrash(CrashConformance):
    @pytest.fixture
    def time_scale(self):
        return {scale!r}

    @pytest.fixture
    def broker(self, tmp_path):
        return SimpleBroker(f"{{SCHEME}}:///{{tmp_path / 'broker.db'}}", name=SCHEME, store_per_case=True)


class TestSPI(AdapterConformance):
    @pytest.fixture
    def time_scale(self):
        return {scale!r}

    @pytest.fixture
    def adapter_factory(self, tmp_path):
        url = f"{{SCHEME}}:///{{tmp_path / 'broker.db'}}"
        return lambda: open_adapter(url)
"""


@dataclass(frozen=True)
class Expectation:
    """What the suite must say about one broken adapter."""

    scheme: str
    #: test id -> a phrase of the failure it must report
    caught_by: dict[str, str]
    #: test ids in the same selection that pass: what this bug is *not*
    passes: tuple[str, ...] = field(default=())

    @property
    def selection(self) -> list[str]:
        return [*self.caught_by, *self.passes]


EXPECTATIONS = [
    Expectation(
        "broken-nack-drop",
        {
            # the requeue after an executor crash is deleted: no re-run ever comes
            f"{CRASH}[C02-REJECT_ON_LOST]": "journal record(s) start {'key': 'victim', "
            "'attempt': 2}: still false",
            # the return of prefetched messages at SIGTERM is deleted as well
            f"{CRASH}[C05-LATE]": "the 9 prefetched messages to be returned at once",
            f"{SPI}::test_nack_without_delay_makes_the_message_receivable_at_once_with_attempt"
            "_plus_one": "expected 1 deliveries",
        },
    ),
    Expectation(
        "broken-shutdown-loss",
        {f"{CRASH}[C05-LATE]": "the 9 prefetched messages to be returned at once"},
        passes=(
            # unlike broken-nack-drop, a nack while the worker keeps polling still arrives
            f"{CRASH}[C02-REJECT_ON_LOST]",
            # level 1 has no test that closes the adapter right after a nack (see the report)
            f"{SPI}::test_nack_without_delay_makes_the_message_receivable_at_once_with_attempt"
            "_plus_one",
        ),
    ),
    Expectation(
        "broken-ignore-delay",
        {
            f"{CRASH}[C10-LATE]": "before its countdown",
            f"{CRASH}[C11-LATE]": "ran before its countdown",
            f"{SPI}::test_delayed_publish_is_invisible_until_due_and_counted_as_delayed": (
                "a delayed message"
            ),
        },
    ),
    Expectation(
        "broken-stale-ack",
        {
            f"{CRASH}[C08-LATE]": "late ack removed the newer delivery",
            f"{SPI}::test_stale_receipt_is_refused_and_the_new_delivery_is_untouched[ack]": (
                "a stale receipt was accepted: ack with the receipt of an expired, redelivered lease"
            ),
        },
    ),
    Expectation(
        # The same bug on a broker that counts only its own connection's deliveries in
        # flight (RabbitMQ without its management API): the journal still catches it.
        "broken-stale-ack-own-in-flight",
        {
            f"{CRASH}[C07-LATE]": "the resumed worker to settle its execution (stale receipt)",
            f"{CRASH}[C08-LATE]": "the resumed worker to settle its execution (stale receipt)",
        },
    ),
    Expectation(
        "broken-no-extend",
        {
            f"{SPI}::test_extend_keeps_a_delivery_invisible_past_its_original_lease": (
                "broken: extend keeps the delivery from other consumers past its original lease"
            ),
        },
    ),
    Expectation(
        "broken-no-redelivery",
        {
            f"{CRASH}[C03-LATE]": "journal record(s) end {'key': 'victim', 'attempt': 2}: "
            "still false",
        },
    ),
    Expectation(
        "broken-pop-first",
        {
            f"{CRASH}[C03-LATE]": "journal record(s) end {'key': 'victim', 'attempt': 2}: "
            "still false",
        },
    ),
]

_VERDICT = re.compile(r"^test_conformance\.py::(\S+) (PASSED|FAILED|ERROR|SKIPPED)\b")
_COUNT = re.compile(r"(\d+) (passed|failed|error|errors|skipped)\b")

#: Conformance runs at once: they mostly wait on leases and gates, so the module takes about
#: as long as its longest runs, not their sum (they ran one after another for two minutes).
PARALLEL_RUNS = 3


@dataclass(frozen=True)
class Plan:
    """One pytest subprocess of a conformance module: ``tests`` of it on ``scheme``
    (``module``: another module's text, its broker fixed; ``plugin``: the selftest module that
    registers the scheme)."""

    scheme: str
    tests: tuple[str, ...]
    module: str | None = None
    plugin: str = PLUGIN


@dataclass(frozen=True)
class Run:
    """What one run printed, each test's verdict, and the summary's counts."""

    out: str
    verdicts: dict[str, str]
    counts: dict[str, int]

    def assert_outcomes(self, **expected: int) -> None:
        got = {k: self.counts.get(k, 0) for k in expected}
        assert got == expected, self.out[-6000:]

    def assert_lines(self, patterns: list[str]) -> None:
        lines = self.out.splitlines()
        for pattern in patterns:
            assert any(fnmatch.fnmatch(line, pattern) for line in lines), (
                f"no line matches {pattern!r}:\n{self.out[-6000:]}"
            )


def run_conformance(plan: Plan, workdir: Path) -> Run:
    """Run ``plan`` in a pytest subprocess in ``workdir`` -- a subprocess, so that
    ``ACKWISE_PLUGINS`` and ``PYTHONPATH`` reach the worker processes it starts."""
    workdir.mkdir(parents=True, exist_ok=True)
    text = plan.module or CONFORMANCE_MODULE.format(scheme=plan.scheme, scale=TIME_SCALE)
    (workdir / "test_conformance.py").write_text(text)
    env = {
        **os.environ,
        "ACKWISE_PLUGINS": plan.plugin,
        "PYTHONPATH": os.pathsep.join(
            filter(None, [str(SELFTEST_DIR), os.environ.get("PYTHONPATH")])
        ),
    }
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            "-v",
            "-rfE",
            "-p",
            "no:cacheprovider",
            "--rootdir",
            str(workdir),
            *[f"test_conformance.py::{t}" for t in plan.tests],
        ],
        cwd=workdir,
        env=env,
        capture_output=True,
        text=True,
        timeout=240,
    )
    out = done.stdout + done.stderr
    verdicts = {}
    for line in out.splitlines():
        m = _VERDICT.match(line)
        if m:
            verdicts[m.group(1)] = m.group(2)
    last = out.strip().splitlines()[-1] if out.strip() else ""
    counts = {
        name.rstrip("s") if name == "errors" else name: int(n) for n, name in _COUNT.findall(last)
    }
    return Run(out, verdicts, counts)


#: The selection of the control runs: every case some broken adapter is named by.
CONTROL = tuple(sorted({t for e in EXPECTATIONS for t in e.selection}))


def _plans(request: pytest.FixtureRequest) -> dict[str, Plan]:
    """The runs the selected tests of this module need, by key."""
    names = {item.name for item in request.session.items if item.path == request.path}
    plans: dict[str, Plan] = {}
    for e in EXPECTATIONS:
        if f"test_broken_adapter_is_caught_by_named_scenarios[{e.scheme}]" in names:
            plans[e.scheme] = Plan(e.scheme, tuple(e.selection))
    if "test_control_the_same_selection_passes_on_the_real_sqlite_adapter" in names:
        plans["sqlite"] = Plan("sqlite", CONTROL)
    if "test_a_broker_counting_only_its_own_deliveries_gets_no_false_failure" in names:
        plans["own-in-flight"] = Plan("own-in-flight", tuple(IN_FLIGHT_CASES))
    held = {
        "lock-holding": "test_a_lock_held_across_round_trips_is_named_by_both_levels",
        "postgresql": "test_control_the_held_lock_selection_passes_on_the_real_postgresql_adapter",
    }
    if names & set(held.values()):
        url, _ = request.getfixturevalue("pg_module_schema")
        if held["lock-holding"] in names:
            held_url = f"lock-holding-{url}"
            module = URL_MODULE.format(url=held_url, scale=TIME_SCALE)
            plans["lock-holding"] = Plan(
                held_url, tuple(HELD_LOCK), module, plugin="lock_holding_adapters"
            )
        if held["postgresql"] in names:
            module = URL_MODULE.format(url=url, scale=TIME_SCALE)
            plans["postgresql"] = Plan(url, tuple(HELD_LOCK), module)
    return plans


@pytest.fixture(scope="module")
def runs(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[dict[str, Future[Run]]]:
    """Every run the module's selected tests need, started at its first test,
    :data:`PARALLEL_RUNS` at a time; each test waits for its own."""
    with ThreadPoolExecutor(PARALLEL_RUNS, thread_name_prefix="selftest") as pool:
        yield {
            key: pool.submit(run_conformance, plan, tmp_path_factory.mktemp(f"run-{key}"))
            for key, plan in _plans(request).items()
        }


@pytest.mark.slow
@pytest.mark.parametrize("expected", EXPECTATIONS, ids=lambda e: e.scheme)
def test_broken_adapter_is_caught_by_named_scenarios(
    runs: dict[str, Future[Run]], expected: Expectation
) -> None:
    result = runs[expected.scheme].result()
    wanted = {t: "FAILED" for t in expected.caught_by} | {t: "PASSED" for t in expected.passes}
    assert result.verdicts == wanted, result.out[-6000:]
    result.assert_outcomes(failed=len(expected.caught_by), passed=len(expected.passes))
    # The short summary names each failing scenario, and each failure says what went wrong.
    result.assert_lines(
        [f"FAILED test_conformance.py::{glob.escape(t)}*" for t in expected.caught_by]
    )
    for test_id, phrase in expected.caught_by.items():
        assert phrase in result.out, f"{test_id}: {phrase!r} not reported"


@pytest.mark.slow
def test_control_the_same_selection_passes_on_the_real_sqlite_adapter(
    runs: dict[str, Future[Run]],
) -> None:
    result = runs["sqlite"].result()
    assert result.verdicts == dict.fromkeys(CONTROL, "PASSED"), result.out[-6000:]
    result.assert_outcomes(passed=len(CONTROL))


def test_broken_adapters_are_registered_under_their_own_schemes(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.syspath_prepend(str(SELFTEST_DIR))
    monkeypatch.setenv("ACKWISE_PLUGINS", PLUGIN)
    plugins = Plugins(autoload=False)
    sqlite = plugins.adapters.get("sqlite").load()
    for e in EXPECTATIONS:
        cls = plugins.adapters.get(e.scheme).load()
        assert issubclass(cls, sqlite) and cls is not sqlite
        adapter = open_adapter(f"{e.scheme}:///{tmp_path / 'broker.db'}", plugins)
        assert adapter.path == str(tmp_path / "broker.db")
        assert str(adapter.url).startswith(f"{e.scheme}:")
    assert {e.scheme for e in EXPECTATIONS} == {
        s for s in plugins.adapters.schemes() if s.startswith("broken-")
    }


#: The cases that compare an in-flight count, and the level-1 stale-receipt check.
IN_FLIGHT_CASES = [
    f"{CRASH}[C04-LATE]",
    f"{CRASH}[C05-LATE]",
    f"{CRASH}[C07-LATE]",
    f"{CRASH}[C08-LATE]",
    f"{SPI}::test_stale_receipt_is_refused_and_the_new_delivery_is_untouched[ack]",
    f"{SPI}::test_batch_ack_with_one_stale_receipt_settles_the_valid_ones",
]


@pytest.mark.slow
def test_a_broker_counting_only_its_own_deliveries_gets_no_false_failure(
    runs: dict[str, Future[Run]],
) -> None:
    """``global_in_flight=False`` (RabbitMQ without its management API: the suite's stats see
    none of the workers' deliveries): a correct adapter passes every case that compares an
    in-flight count (they failed with "removed the newer delivery" claims it never saw)."""
    result = runs["own-in-flight"].result()
    assert result.verdicts == dict.fromkeys(IN_FLIGHT_CASES, "PASSED"), result.out[-6000:]


# -- a broker-side lock held across round trips --------------------------------------------------

#: The conformance module on one PostgreSQL URL ({url}; {scale} the time scale).
URL_MODULE = """
import pytest

from ackwise import open_adapter
from ackwise_conformance import AdapterConformance
from ackwise_conformance.crash import CrashConformance
from ackwise_conformance.harness import SimpleBroker

URL = {url!r}


class TestCrash(CrashConformance):
    @pytest.fixture
    def time_scale(self):
        return {scale!r}

    @pytest.fixture
    def broker(self):
        return SimpleBroker(URL)


class TestSPI(AdapterConformance):
    @pytest.fixture
    def time_scale(self):
        return {scale!r}

    @pytest.fixture
    def adapter_factory(self):
        return lambda: open_adapter(URL)
"""

#: The lease-expiry check of level 1 (an idle consumer) and the pause past the lease of level 2
#: (a SIGSTOPped worker) -> the words each must report about the held lock.
HELD_LOCK = {
    f"{SPI}::test_unsettled_delivery_is_redelivered_after_lease_with_attempt_plus_one": (
        "became receivable only after the idle consumer's connection closed: the adapter holds "
        "a broker-side lock (an open transaction or a row lock) across round trips"
    ),
    f"{CRASH}[C07-LATE]": (
        "became receivable only after frozen worker 0's connection closed: the adapter holds "
        "a broker-side lock (an open transaction or a row lock) across round trips"
    ),
}


@pytest.mark.slow
def test_a_lock_held_across_round_trips_is_named_by_both_levels(
    runs: dict[str, Future[Run]],
) -> None:
    """``lock-holding-postgresql`` (tests/selftest/lock_holding_adapters.py) keeps its receive's
    transaction open until the next settlement: a consumer frozen (or idle) while it holds a
    delivery keeps its row locked, and ``SKIP LOCKED`` passes it by for ever.  Both levels
    fail it, and say it is a lock held across round trips, not a lost message."""
    result = runs["lock-holding"].result()
    assert result.verdicts == dict.fromkeys(HELD_LOCK, "FAILED"), result.out[-6000:]
    out = result.out
    for test_id, words in HELD_LOCK.items():
        assert words in out, f"{test_id}: {words!r} not reported:\n{out[-6000:]}"
    assert out.count("docs/conformance.md#a-frozen-client-holds-no-lock") >= len(HELD_LOCK)


@pytest.mark.slow
def test_control_the_held_lock_selection_passes_on_the_real_postgresql_adapter(
    runs: dict[str, Future[Run]],
) -> None:
    result = runs["postgresql"].result()
    assert result.verdicts == dict.fromkeys(HELD_LOCK, "PASSED"), result.out[-6000:]
