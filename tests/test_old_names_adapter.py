"""An adapter written against the names ``ackwise`` and ``ackwise.errors`` exported before
``ackwise.spi`` still works: it registers, passes level 1 of the conformance suite and a
selection of level 2 (real worker processes), and every SPI name it imports the old way warns,
naming ``ackwise.spi``.

The adapter is ``tests/old_names_adapter/ackwise_dirq_old``: the example adapter
(``examples/adapter``) as it was, under the scheme ``dirq-old://``, registered as
``ACKWISE_PLUGINS`` names it (a distribution's entry point does the same).  The suite runs in a
pytest subprocess, so that ``ACKWISE_PLUGINS`` and ``PYTHONPATH`` reach the workers it starts.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

ADAPTER_DIR = Path(__file__).parent / "old_names_adapter"
PLUGIN = "ackwise_dirq_old.plugin"

#: What the old adapter imports that moved: (the old import, its line's module).
MOVED = {
    "ackwise.AdapterRegistry": "plugin.py",
    "ackwise.Delivery": "adapter.py",
    "ackwise.Outgoing": "adapter.py",
    "ackwise.QueueSpec": "adapter.py",
    "ackwise.errors.ErrorTable": "adapter.py",
    "ackwise.errors.from_table": "adapter.py",
    "ackwise.errors.mapping_errors": "adapter.py",
    "ackwise.errors.redact": "adapter.py",
}

#: Level 2, a selection (the whole of it takes about five minutes on this adapter): a killed
#: executor child's and a killed worker's deliveries come back, a graceful stop returns what
#: was prefetched, a paused worker's stale ack changes nothing, a delay longer than the lease
#: holds, retries back off, a failed task is dead-lettered.
CRASH_CASES = [
    "C02-REJECT_ON_LOST",
    "C03-LATE",
    "C05-LATE",
    "C07-LATE",
    "C10-LATE",
    "C12-LATE",
    "C13-LATE",
]

CONFORMANCE_MODULE = """
import pytest

from ackwise import open_adapter
from ackwise_conformance import AdapterConformance
from ackwise_conformance.crash import CrashConformance
from ackwise_conformance.harness import SimpleBroker


class TestSPI(AdapterConformance):
    @pytest.fixture
    def adapter_factory(self, tmp_path):
        url = f"dirq-old://{tmp_path / 'queues'}"
        return lambda: open_adapter(url)


class TestCrash(CrashConformance):
    @pytest.fixture
    def broker(self, tmp_path):
        return SimpleBroker(f"dirq-old://{tmp_path / 'queues'}", name="dirq-old")
"""


def _env() -> dict[str, str]:
    path = os.pathsep.join(filter(None, [str(ADAPTER_DIR), os.environ.get("PYTHONPATH")]))
    return {**os.environ, "ACKWISE_PLUGINS": PLUGIN, "PYTHONPATH": path}


def _pytest(workdir: Path, *selection: str) -> subprocess.CompletedProcess[str]:
    options = ["-q", "-p", "no:cacheprovider", "-rfEs", "-W", "always::DeprecationWarning"]
    return subprocess.run(
        [sys.executable, "-m", "pytest", *options, "--rootdir", str(workdir), *selection],
        cwd=workdir,
        env=_env(),
        capture_output=True,
        text=True,
        timeout=400,
    )


def test_each_moved_name_warns_at_the_adapters_import_naming_ackwise_spi() -> None:
    code = (
        "import json, warnings\n"
        "with warnings.catch_warnings(record=True) as caught:\n"
        "    warnings.simplefilter('always')\n"
        "    import ackwise_dirq_old.plugin, ackwise_dirq_old.adapter\n"
        "print(json.dumps([[w.category.__name__, w.filename, str(w.message)] for w in caught]))\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], env=_env(), capture_output=True, text=True, check=True
    )
    warned = {}
    for category, filename, message in json.loads(done.stdout):
        assert category == "DeprecationWarning", message
        m = re.fullmatch(
            r"(ackwise\.[\w.]+) is deprecated: import it from ackwise\.spi \(.*\)", message
        )
        assert m, f"a warning that does not name ackwise.spi: {message}"
        warned[m.group(1)] = Path(filename).name  # the line that imports it, not ackwise's
    assert warned == MOVED


def test_the_old_adapter_is_registered_and_is_the_example_as_it_was() -> None:
    code = (
        "import ackwise\n"
        "cls = ackwise.get_plugins().adapters.get('dirq-old').load()\n"
        "print(cls.__module__, cls.__name__)\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], env=_env(), capture_output=True, text=True, check=True
    )
    assert done.stdout.split() == ["ackwise_dirq_old.adapter", "DirQueueAdapter"]
    # its imports are the ones adapters wrote before ackwise.spi: none from it
    source = (ADAPTER_DIR / "ackwise_dirq_old" / "adapter.py").read_text()
    assert "ackwise.spi" not in source and "from ackwise import (" in source


@pytest.mark.slow
def test_the_old_adapter_passes_level_1_and_a_selection_of_level_2(tmp_path: Path) -> None:
    runs = {"level 1": ["test_conformance.py::TestSPI"]}
    runs["level 2"] = [f"test_conformance.py::TestCrash::test_scenario[{c}]" for c in CRASH_CASES]
    for name in runs:
        workdir = tmp_path / name.replace(" ", "")
        workdir.mkdir()
        (workdir / "test_conformance.py").write_text(CONFORMANCE_MODULE)
    with ThreadPoolExecutor(len(runs)) as pool:
        done = {
            name: pool.submit(_pytest, tmp_path / name.replace(" ", ""), *selection)
            for name, selection in runs.items()
        }
        results = {name: future.result() for name, future in done.items()}
    for name, result in results.items():
        out = result.stdout + result.stderr
        summary = out.strip().splitlines()[-1] if out.strip() else ""
        assert result.returncode == 0, f"{name}:\n{out[-6000:]}"
        assert " passed" in summary and "failed" not in summary, f"{name}: {summary}"
    level1 = results["level 1"].stdout
    # the adapter's old imports warned inside the run as well, naming the new module
    assert "ackwise.AdapterRegistry is deprecated: import it from ackwise.spi" in level1, level1[
        -6000:
    ]
    assert "ackwise.errors.from_table is deprecated: import it from ackwise.spi" in level1
    level2 = results["level 2"].stdout.strip().splitlines()[-1]
    assert f"{len(CRASH_CASES)} passed" in level2, level2
