"""A service told to stop while it starts exits cleanly (docs/deployment.md).

A process manager may send SIGTERM at any moment, also while ``ackwise worker`` (``beat``,
``relay``, ``dashboard``) still imports ackwise or the app: the command must end at once with
the status of a stop (0), not die of the signal (-15) nor finish a slow start first.  Each
process is a real ``python -m ackwise`` (or ``ackwise``) process; the moment of the signal is
made certain with a slow app import (``startup_support/slow_app.py``) or a pause inside the
import of ackwise itself (``startup_support/sitecustomize.py``).
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from ackwise_conformance.helpers import eventually

SUPPORT = Path(__file__).parent / "startup_support"
#: The ``ackwise`` script installed beside this interpreter.
SCRIPT = Path(sys.executable).with_name("ackwise")

#: Longer than any test waits: a process that finishes its start-up first is seen failing.
SLOW_IMPORT = 30.0


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _service_args(command: str, tmp_path: Path) -> list[str]:
    """Arguments of ``ackwise COMMAND`` with the slow app; nothing is reached past its import."""
    extra = {
        "worker": ["--pool", "threads", "-c", "1"],
        "beat": [],
        "relay": ["--database", "postgresql://127.0.0.1:1/never-reached"],
        "dashboard": ["--port", str(_free_port())],
    }[command]
    return [command, "slow_app:app", *extra]


def _spawn(
    argv: list[str], tmp_path: Path, *, script: bool = False, **env: str
) -> subprocess.Popen[bytes]:
    program = [str(SCRIPT)] if script else [sys.executable, "-m", "ackwise"]
    return subprocess.Popen(
        [*program, *argv],
        cwd=tmp_path,
        env={
            **os.environ,
            "PYTHONPATH": str(SUPPORT) + os.pathsep + os.environ.get("PYTHONPATH", ""),
            "STARTUP_TEST_BROKER": f"sqlite:///{tmp_path / 'broker.db'}",
            "STARTUP_TEST_MARKER": str(tmp_path / "importing-the-app"),
            "STARTUP_TEST_IMPORT_SECONDS": str(SLOW_IMPORT),
            **env,
        },
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        start_new_session=True,  # a process group of its own, as under a process manager
        preexec_fn=_sigint_as_in_a_terminal,
    )


def _sigint_as_in_a_terminal() -> None:
    """SIGINT's default action in the child, whatever this test process inherited: a test run
    started in the background by a shell without job control ignores SIGINT, its children
    inherit that, and a service rightly keeps ignoring it while it starts (docs/deployment.md)."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def _stop_and_wait(proc: subprocess.Popen[bytes], sig: signal.Signals) -> tuple[int, float, str]:
    """Send ``sig``; the exit status, the seconds it took to come, and what it wrote."""
    sent = time.monotonic()
    proc.send_signal(sig)
    try:
        _, err = proc.communicate(timeout=SLOW_IMPORT - 10)
    except subprocess.TimeoutExpired:
        proc.kill()
        _, err = proc.communicate()
        pytest.fail(f"still running {SLOW_IMPORT - 10:.0f}s after {sig.name}: {err.decode()}")
    return proc.returncode, time.monotonic() - sent, err.decode()


SERVICES = ["worker", "beat", "relay", "dashboard"]


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "SIGINT"])
@pytest.mark.parametrize("command", SERVICES)
def test_a_service_stopped_while_its_app_imports_exits_0_without_finishing_its_start(
    tmp_path: Path, command: str, sig: signal.Signals
) -> None:
    if command == "dashboard":
        pytest.importorskip("uvicorn")
    proc = _spawn(_service_args(command, tmp_path), tmp_path)
    marker = tmp_path / "importing-the-app"
    eventually(marker.exists, 30.0, description=f"ackwise {command} to import its app")
    status, took, err = _stop_and_wait(proc, sig)
    assert status == 0, f"ackwise {command}: exit status {status} after {sig.name}: {err}"
    assert took < SLOW_IMPORT / 3, f"the stop waited {took:.1f}s for the app's import"
    assert f"{sig.name} received while starting: stopped" in err
    assert "Traceback" not in err


@pytest.mark.parametrize("entry", ["python -m ackwise", "ackwise"])
def test_a_service_stopped_while_ackwise_itself_imports_exits_0(tmp_path: Path, entry: str) -> None:
    """The signal comes during the first import of one of ackwise's modules: the command has
    taken the signals before (only its interpreter's own start is earlier)."""
    script = entry == "ackwise"
    if script and not SCRIPT.exists():
        pytest.skip(f"no {SCRIPT}")
    marker = tmp_path / "importing-ackwise"
    proc = _spawn(
        _service_args("relay", tmp_path),
        tmp_path,
        script=script,
        STARTUP_TEST_PAUSE_MARKER=str(marker),
    )
    eventually(marker.exists, 30.0, description="the command to import ackwise")
    status, _, err = _stop_and_wait(proc, signal.SIGTERM)
    assert status == 0, (
        f"exit status {status} after SIGTERM during the import of {marker.read_text()}: {err}"
    )
    assert not (tmp_path / "importing-the-app").exists()  # the app's import was never begun


def test_a_one_shot_command_interrupted_while_starting_says_so_and_exits_130(
    tmp_path: Path,
) -> None:
    """``ackwise stats`` is no service: Ctrl-C during its start is an interruption (130, one
    line), as it is later."""
    marker = tmp_path / "importing-ackwise"
    proc = _spawn(
        ["stats", "--broker", f"sqlite:///{tmp_path / 'broker.db'}"],
        tmp_path,
        STARTUP_TEST_PAUSE_MARKER=str(marker),
    )
    eventually(marker.exists, 30.0, description="the command to import ackwise")
    status, _, err = _stop_and_wait(proc, signal.SIGINT)
    assert (status, err.strip()) == (130, "ackwise: interrupted")


def _catches(pid: int, sig: signal.Signals) -> bool:
    """Whether process ``pid`` has a handler of its own for ``sig`` (``SigCgt`` in /proc)."""
    try:
        status = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return False
    caught = next(line for line in status.splitlines() if line.startswith("SigCgt:"))
    return bool(int(caught.split()[1], 16) >> (sig - 1) & 1)


@pytest.mark.skipif(not Path("/proc/self/status").exists(), reason="needs /proc")
@pytest.mark.parametrize("command", ["worker", "relay"])
def test_a_sigterm_as_soon_as_a_service_catches_it_ends_it_with_status_0(
    tmp_path: Path, command: str
) -> None:
    """Five starts, each sent SIGTERM the moment its process first catches the signal: each
    exits 0 (the signal comes between taking the signals and reading the arguments, or while
    the app imports)."""
    for n in range(5):
        proc = _spawn(
            _service_args(command, tmp_path),
            tmp_path,
            STARTUP_TEST_MARKER=str(tmp_path / f"importing-the-app-{n}"),
            STARTUP_TEST_IMPORT_SECONDS="0",
        )
        pid = proc.pid
        eventually(lambda: _catches(pid, signal.SIGTERM), 30.0, description="the handler")  # noqa: B023
        status, _, err = _stop_and_wait(proc, signal.SIGTERM)
        assert status == 0, f"start {n}: exit status {status}: {err}"


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "SIGINT"])
def test_a_running_dashboard_stopped_by_a_signal_exits_0(
    tmp_path: Path, sig: signal.Signals
) -> None:
    pytest.importorskip("uvicorn")
    port = _free_port()
    (tmp_path / "dash_app.py").write_text(
        f"from ackwise import App\napp = App('dash', broker='sqlite:///{tmp_path / 'q.db'}')\n"
    )
    proc = subprocess.Popen(
        [sys.executable, "-m", "ackwise", "dashboard", "dash_app:app", "--port", str(port)],
        cwd=tmp_path,
        env={**os.environ, "PYTHONPATH": str(tmp_path)},
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )

    def listening() -> bool:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            return True
        except OSError:
            return False

    try:
        eventually(listening, 30.0, description="the dashboard to listen")
    except BaseException:
        proc.kill()
        raise
    status, _, err = _stop_and_wait(proc, sig)
    assert status == 0, f"exit status {status} after {sig.name}: {err}"
    assert "Traceback" not in err


# -- import ackwise is cheap: its names are imported when first used -----------------------
def test_import_ackwise_imports_none_of_its_modules_until_a_name_is_used() -> None:
    code = (
        "import sys, ackwise\n"
        "before = sorted(m for m in sys.modules if m.startswith('ackwise.'))\n"
        "ackwise.App\n"
        "print(before, 'ackwise.app._app' in sys.modules)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.split() == ["[]", "True"]


def test_the_packages_of_the_entry_points_import_nothing_of_ackwise() -> None:
    """``ackwise.cli`` and ``ackwise.worker`` are imported before their entry modules take the
    signals (``cli._startup``, ``worker._child``): they must import nothing heavy."""
    code = (
        "import sys, ackwise.cli, ackwise.worker\n"
        "print(sorted(m for m in sys.modules if m.startswith('ackwise.')))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "['ackwise.cli', 'ackwise.worker']"


def test_each_lazy_name_of_ackwise_is_the_one_its_type_checking_imports_name() -> None:
    """``ackwise.__init__`` lists each public name twice, for the type checker and for
    ``__getattr__``: the two lists agree, and ``__all__`` is exactly them but the names
    deprecated in ``ackwise`` (imported ``as`` themselves: ``ackwise.spi`` has them)."""
    import ast

    import ackwise

    tree = ast.parse(Path(ackwise.__file__).read_text())
    [guard] = [n for n in tree.body if isinstance(n, ast.If)]
    imported = {
        alias.asname or alias.name: (node.module, alias.name)
        for node in guard.body
        if isinstance(node, ast.ImportFrom) and node.module != "typing"
        for alias in node.names
    }
    assert imported == ackwise._LAZY
    deprecated = {
        alias.name
        for node in guard.body
        if isinstance(node, ast.ImportFrom)
        for alias in node.names
        if alias.asname == alias.name
    }
    assert deprecated == ackwise._MOVED_TO_SPI
    assert set(ackwise.__all__) == {*imported, "__version__"} - deprecated
    for name in set(imported) - deprecated:
        assert getattr(ackwise, name) is not None


def test_a_prefork_child_starting_when_the_process_group_gets_sigterm_survives_it(
    tmp_path: Path,
) -> None:
    """A process manager that signals the whole group (systemd's default) stops a worker
    while its prefork child still imports ackwise: the child ignores the signal from its
    first line (the supervisor decides), as it does once started; it does not die of it
    (and is not replaced by a new child, of a worker that is stopping)."""
    (tmp_path / "fast_app.py").write_text(
        "import os\nfrom ackwise import App\n"
        "app = App('startup', broker=os.environ['STARTUP_TEST_BROKER'])\n"
    )
    proc = _spawn(
        ["worker", "fast_app:app", "--pool", "prefork", "-c", "1"],
        tmp_path,
        PYTHONPATH=os.pathsep.join([str(SUPPORT), str(tmp_path), os.environ.get("PYTHONPATH", "")]),
        STARTUP_TEST_PAUSE_MARKER=str(tmp_path / "importing-{pid}"),
    )
    child = tmp_path / "importing-child"

    def child_paused() -> bool:
        others = [p for p in tmp_path.glob("importing-*") if p.name != f"importing-{proc.pid}"]
        if others:
            others[0].rename(child)
        return child.exists()

    eventually(child_paused, 30.0, description="the prefork child to import ackwise")
    os.killpg(proc.pid, signal.SIGTERM)  # the worker and its child, as systemd does
    status, _, err = _stop_and_wait(proc, signal.SIGCONT)  # (the signal is sent already)
    assert status == 0, f"exit status {status}: {err}"
    assert "died" not in err, err
