"""How ``scripts/test`` shares the suite between its pytest processes (pytest-xdist), and the
check of what a run left in the shared services (``tests/shared_services.py``).

Every file goes to one process as a whole (``--dist loadfile``), and the crash suites go to
one process together, one after another.  Each crash class runs its cases as one batch, eight
at once, with two or more worker processes each: a batch uses both CPUs by itself.  Two
batches at once (SQS beside RabbitMQ) took 2.5 times as long as each alone, and their
workers, blocked longer than a lease of two seconds, lost leases in scenarios that count
duplicates (SQS C01 and C26 failed on CI).  One after another, beside the other processes'
unit tests, they keep their timing and the run is shorter.

``scripts/test`` runs three processes: the crash suites take one of them for about 11 minutes,
the other files go to the other two (and to the first once it is done).  Most of those files wait (on leases, sleeps, brokers
starting) more than they compute: with two processes the CPUs were idle 43 % of the run and it
took 14:27 of pytest; with three, 23 % and 11:19, the crash batches passing as before
(2026-12-07, a quiet 2-core machine).
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path, PurePosixPath
from typing import Any

#: Files that run crash batches (real worker processes, signals, leases of seconds).
CRASH_SCOPE = "crash suites"


def is_crash_suite(path: str) -> bool:
    name = PurePosixPath(path).name
    return "crash" in name or name == "test_selftest.py"


def pytest_xdist_make_scheduler(config: Any, log: Any) -> Any:
    from xdist.scheduler import LoadFileScheduling

    class CrashSuitesTogether(LoadFileScheduling):
        """``--dist loadfile``, but the crash suites are one unit of work.  Units are handed
        out largest first, so that one starts first and the other process takes the rest."""

        def _split_scope(self, nodeid: str) -> str:
            path = nodeid.split("::", 1)[0]
            return CRASH_SCOPE if is_crash_suite(path) else path

    if config.getvalue("dist") != "loadfile":
        return None  # another --dist asked for: xdist's own scheduler
    return CrashSuitesTogether(config, log)


def pytest_configure(config: Any) -> None:
    """Load ``tests/shared_services.py`` (as module ``shared_services``, the name its own tests
    import it by) and register its check in this process unless it is an xdist worker."""
    module = sys.modules.get("shared_services")
    if module is None:
        path = Path(__file__).parent / "tests" / "shared_services.py"
        spec = importlib.util.spec_from_file_location("shared_services", path)
        assert spec is not None and spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        sys.modules["shared_services"] = module
        spec.loader.exec_module(module)
    module.register(config)
