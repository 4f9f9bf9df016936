"""The ackwise command line: stats (and the figures a broker cannot know), worker start-up
errors, every option's help and default, the logging options before and after the command,
--version, exit statuses."""

from __future__ import annotations

import argparse
import json
import os
import platform
import pty
import re
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from importlib import metadata
from pathlib import Path

import pytest

import ackwise
from ackwise import App, QueueStats, get_plugins
from ackwise.cli import main as cli_main
from ackwise.cli._common import shows_default
from ackwise.cli._main import build_parser
from ackwise.cli._watch import render
from ackwise.spi import Outgoing, QueueSpec
from ackwise_conformance.brokers import provide_or_skip

HERE = Path(__file__).parent


def _run(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "ackwise", *args],
        capture_output=True,
        text=True,
        cwd=HERE,
        env={**os.environ, **(env or {})},
        timeout=60,
    )


def test_stats_prints_a_table_and_json(tmp_path):
    url = f"sqlite:///{tmp_path / 'b.db'}"
    app = App("s", broker=url)

    @app.task(name="t")
    def t():
        pass

    for _ in range(3):
        t.delay()
    t.apply_async(countdown=600)
    adapter = app.adapter()
    adapter.open()
    adapter.declare(QueueSpec("other"))
    [d] = adapter.receive("default", max_messages=1, wait=0, lease=60)
    adapter.dead_letter(d, reason="failed")
    out = _run("stats", "--broker", url, "--json")
    assert out.returncode == 0, out.stderr
    rows = {r["queue"]: r for r in json.loads(out.stdout)["queues"]}
    assert (rows["default"]["ready"], rows["default"]["delayed"], rows["default"]["dead"]) == (
        2,
        1,
        1,
    )
    assert rows["other"]["ready"] == 0
    table = _run("stats", "--broker", url, "-Q", "default")
    assert table.returncode == 0
    assert "default" in table.stdout and "oldest age" in table.stdout


@pytest.mark.parametrize(
    ("args", "fragment"),
    [
        (["worker", "no_such_module_xyz:app"], "cannot import 'no_such_module_xyz'"),
        (["worker", "ackwise_conformance.workload:nope"], "has no attribute 'nope'"),
        (["stats", "--broker", "kafka://x"], "no adapter is installed for broker scheme 'kafka'"),
    ],
)
def test_cli_errors_are_clear_and_exit_2(args, fragment):
    out = _run(*args, env={"ACKWISE_BROKER_URL": "memory://"})
    assert out.returncode == 2
    assert fragment in out.stderr
    assert "Traceback" not in out.stderr


# -- help: every option has help and shows its default ---------------------------------------

_ENV = (
    "ACKWISE_LOGLEVEL",
    "ACKWISE_LOG_FORMAT",
    "ACKWISE_TASK_LOGLEVEL",
    "ACKWISE_DRIVER_LOGLEVEL",
    "ACKWISE_METRICS_PORT",
    "ACKWISE_METRICS_HOST",
    "ACKWISE_DASHBOARD_TOKEN",
)


def _parsers(
    parser: argparse.ArgumentParser, path: tuple[str, ...] = ("ackwise",)
) -> Iterator[tuple[str, argparse.ArgumentParser]]:
    """Every parser of the command line (plugins' commands included), with its command."""
    yield " ".join(path), parser
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            helps = {a.dest: a.help for a in action._choices_actions}
            for name, sub in action.choices.items():
                assert helps.get(name), f"{' '.join(path)} {name}: the command has no help"
                yield from _parsers(sub, (*path, name))


def _squeezed(text: str) -> str:
    return "".join(text.split())  # help is wrapped, at spaces and after hyphens


@pytest.mark.parametrize("env", [{}, {"ACKWISE_METRICS_PORT": "9100", "ACKWISE_LOGLEVEL": "DEBUG"}])
def test_every_option_of_every_command_has_help_and_shows_its_default(monkeypatch, env):
    for name in _ENV:
        monkeypatch.delenv(name, raising=False)
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    parsers = dict(_parsers(build_parser()))
    assert {"ackwise worker", "ackwise stats", "ackwise dlq purge", "ackwise conformance"} <= set(
        parsers
    )
    checked = 0
    for command, parser in parsers.items():
        shown = _squeezed(parser.format_help())
        for action in parser._actions:
            if isinstance(action, (argparse._HelpAction, argparse._SubParsersAction)):
                continue
            what = f"{command} {'/'.join(action.option_strings) or action.metavar or action.dest}"
            assert action.help and action.help != argparse.SUPPRESS, f"{what}: no help text"
            text = parser._get_formatter()._expand_help(action)
            assert _squeezed(text) in shown, f"{what}: its help is not in --help"
            says = re.findall(r"\bdefault\b", text, re.IGNORECASE)
            assert len(says) <= 1, f"{what}: the default is told twice: {text!r}"
            assert "default: None" not in text, f"{what}: {text!r}"
            if shows_default(action):
                assert says, f"{what}: its default {action.default!r} is not shown: {text!r}"
            checked += 1
    assert checked > 60


def test_worker_help_shows_the_defaults_the_issue_named():
    out = _run("worker", "--help")
    assert out.returncode == 0, out.stderr
    text = " ".join(out.stdout.split())
    for option, default in [
        ("--lease SECONDS", "30.0"),
        ("--grace SECONDS", "30.0"),
        ("--unknown-task-delay SECONDS", "5.0"),
        ("--unknown-task-deliveries N", "3"),
        ("--broker-timeout SECONDS", "60.0"),
        ("--pool {prefork,threads,solo}", "prefork"),
    ]:
        after = text.split(f" {option} ", 1)[1]
        assert f"(default: {default})" in after.split(" --", 1)[0], (option, after[:200])
    top = " ".join(_run("--help", env={"ACKWISE_LOGLEVEL": ""}).stdout.split())
    assert "--loglevel LEVEL DEBUG, INFO, WARNING or ERROR (default: INFO;" in top


def test_the_dashboard_token_from_the_environment_is_never_shown():
    out = _run("dashboard", "--help", env={"ACKWISE_DASHBOARD_TOKEN": "s3cret-token"})
    assert out.returncode == 0, out.stderr
    assert "s3cret-token" not in out.stdout
    assert "$ACKWISE_DASHBOARD_TOKEN" in out.stdout


# -- --version --------------------------------------------------------------------------------


def test_version_names_ackwise_and_each_installed_plugin_distribution():
    out = _run("--version")
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    # ackwise's own line reads the one version file (ackwise.__version__), like every build
    assert lines[0] == f"ackwise {ackwise.__version__} (memory://, sqlite://)"
    assert lines[-1].startswith(f"Python {platform.python_version()}")
    by_dist = {line.split()[0]: line for line in lines[1:-1]}
    schemes: dict[str, list[str]] = {}
    for entry in get_plugins().adapters.entries():
        schemes.setdefault(entry.plugin, []).append(entry.scheme)
    for ep in metadata.entry_points(group="ackwise"):
        if ep.dist is None or ep.dist.name == "ackwise":
            continue
        line = by_dist[ep.dist.name]
        assert line.startswith(f"{ep.dist.name} {ep.dist.version} ("), line
        for scheme in schemes.get(ep.name, []):
            assert f"{scheme}://" in line, (scheme, line)
        if ep.name not in schemes:
            assert f"plugin {ep.name}, no broker scheme" in line
    assert "ackwise-conformance" in by_dist  # installed in the test environment


def test_version_says_which_plugins_are_blocked_or_named_in_the_environment(tmp_path):
    (tmp_path / "extra_cli_plugin_xyz.py").write_text(
        "from ackwise import hookimpl\n"
        "@hookimpl\n"
        "def ackwise_register_adapters(registry):\n"
        "    registry.add('extra', 'ackwise.backends.memory._adapter:MemoryAdapter', distribution='extra')\n"
    )
    out = _run(
        "--version",
        env={
            "ACKWISE_PLUGINS_BLOCK": "sqs",
            "ACKWISE_PLUGINS": "extra_cli_plugin_xyz",
            "PYTHONPATH": str(tmp_path),
        },
    )
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    [sqs] = [line for line in lines if line.startswith("ackwise-sqs ")]
    assert sqs.endswith("(plugin sqs blocked by $ACKWISE_PLUGINS_BLOCK)")
    assert "extra_cli_plugin_xyz (from $ACKWISE_PLUGINS) (extra://)" in lines


# -- exit status (docs/configuration.md#exit-status) -------------------------------------------


@pytest.mark.parametrize(
    ("args", "env", "fragment"),
    [
        ([], {}, "the following arguments are required: COMMAND"),
        (["worker", "x:app", "--lease", "-1"], {}, "expected seconds >= 0"),
        (["stats", "--no-such-option"], {}, "unrecognized arguments"),
        (["worker", "x:app"], {"ACKWISE_METRICS_PORT": "abc"}, "must be a port number"),
        (["conformance", "memory://x", "--jobs", "0"], {}, "--jobs 0: expected 1 or more"),
    ],
)
def test_usage_errors_exit_2_with_one_line(args, env, fragment):
    out = _run(*args, env=env)
    assert out.returncode == 2, (out.returncode, out.stderr)
    assert fragment in out.stderr.strip().splitlines()[-1]
    assert "Traceback" not in out.stderr


def test_a_declined_purge_exits_1(tmp_path):
    url = f"sqlite:///{tmp_path / 'b.db'}"
    adapter = App("p", broker=url).adapter()
    adapter.open()
    adapter.declare(QueueSpec("default"))
    adapter.publish_dead("default", [Outgoing("m1", b"{}")], reason="failed")
    adapter.close()
    main_fd, tty_fd = pty.openpty()  # the prompt wants a terminal
    try:
        os.write(main_fd, b"n\n")
        out = subprocess.run(
            [sys.executable, "-m", "ackwise", "dlq", "purge", "--broker", url, "--all"],
            stdin=tty_fd,
            capture_output=True,
            text=True,
            timeout=60,
        )
    finally:
        os.close(main_fd)
        os.close(tty_fd)
    assert out.returncode == 1, out.stderr
    assert "nothing deleted" in out.stdout


def test_ctrl_c_exits_130_without_a_traceback(tmp_path):
    marker = tmp_path / "importing"
    (tmp_path / "slow_app_xyz.py").write_text(
        f"import pathlib, time\npathlib.Path({str(marker)!r}).touch()\ntime.sleep(60)\n"
    )
    # A test run started in the background of a non-interactive shell ignores SIGINT, and an
    # ignored signal stays ignored across exec: the child would sleep through it.  A handler
    # (not an ignore) here makes the child start with SIGINT's default, as from a terminal.
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        proc = subprocess.Popen(
            [sys.executable, "-m", "ackwise", "workers", "slow_app_xyz:app"],
            cwd=tmp_path,
            env={**os.environ, "PYTHONPATH": str(tmp_path)},
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
    finally:
        signal.signal(signal.SIGINT, previous)
    try:
        deadline = time.monotonic() + 30
        while not marker.exists():
            assert proc.poll() is None and time.monotonic() < deadline, proc.communicate()
            time.sleep(0.02)
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=30)
    finally:
        proc.kill()
    assert proc.returncode == 130, err
    assert err.strip() == "ackwise: interrupted"


# -- stats: figures the broker cannot know ----------------------------------------------------

_BLIND = '''
import dataclasses
from ackwise import hookimpl
from ackwise.backends.sqlite._adapter import SQLiteAdapter


class BlindSQLite(SQLiteAdapter):
    """SQLite, declaring what RabbitMQ without its management API declares: no oldest age,
    and an in-flight count of its own connection's deliveries only."""

    capabilities = dataclasses.replace(
        SQLiteAdapter.capabilities, oldest_age=False, global_in_flight=False
    )


@hookimpl
def ackwise_register_adapters(registry):
    registry.add("blindsqlite", "blind_adapter_xyz:BlindSQLite", distribution="tests")
'''


def _fill(url: str) -> None:
    """default: 2 ready, 1 delayed, 1 in flight (leased for a minute), 1 dead."""
    app = App("s", broker=url)

    @app.task(name="t")
    def t() -> None:
        pass

    for _ in range(4):
        t.delay()
    t.apply_async(countdown=600)
    adapter = app.adapter()
    adapter.open()
    first, second = adapter.receive("default", max_messages=2, wait=0, lease=60)
    adapter.dead_letter(first, reason="failed")
    del second  # held: in flight until its lease ends


def test_stats_prints_every_figure_on_brokers_that_know_them(tmp_path):
    url = f"sqlite:///{tmp_path / 'b.db'}"
    _fill(url)
    out = _run("stats", "--broker", url, "-Q", "default", "--json")
    assert out.returncode == 0, out.stderr
    [row] = json.loads(out.stdout)["queues"]
    assert (row["ready"], row["delayed"], row["in_flight"], row["dead"]) == (2, 1, 1, 1)
    assert isinstance(row["oldest_age"], float) and row["oldest_age"] >= 0.0
    table = _run("stats", "--broker", url, "-Q", "default").stdout
    assert "n/a" not in table


def test_stats_on_the_memory_broker_in_process(capsys):
    url = f"memory://{uuid.uuid4().hex}"
    _fill(url)
    assert cli_main(["stats", "--broker", url, "-Q", "default", "--json"]) == 0
    [row] = json.loads(capsys.readouterr().out)["queues"]
    assert (row["ready"], row["delayed"], row["in_flight"], row["dead"]) == (2, 1, 1, 1)
    assert row["oldest_age"] is not None


def test_stats_says_n_a_for_what_the_adapter_declares_it_cannot_know(tmp_path):
    (tmp_path / "blind_adapter_xyz.py").write_text(_BLIND)
    _fill(f"sqlite:///{tmp_path / 'b.db'}")
    url = f"blindsqlite:///{tmp_path / 'b.db'}"
    env = {"ACKWISE_PLUGINS": "blind_adapter_xyz", "PYTHONPATH": str(tmp_path)}
    out = _run("stats", "--broker", url, "-Q", "default", "--json", env=env)
    assert out.returncode == 0, out.stderr
    [row] = json.loads(out.stdout)["queues"]
    assert row == {
        "queue": "default",
        "ready": 2,
        "delayed": 1,
        "in_flight": None,
        "dead": 1,
        "oldest_age": None,
    }
    table = _run("stats", "--broker", url, "-Q", "default", env=env).stdout.splitlines()
    assert table[1].split() == [
        "queue",
        "ready",
        "delayed",
        "in",
        "flight",
        "dead",
        "oldest",
        "age",
    ]
    assert table[3].split() == ["default", "2", "1", "n/a", "1", "n/a"]


def test_stats_watch_says_n_a_for_unknown_figures():
    before = {"q": QueueStats("q", 100, 0, 0, 1, 3.0)}
    row = QueueStats("q", 80, 0, 0, 3, 0.0)
    text = render("sqs://", [row], before, 2.0, frozenset({"oldest_age", "in_flight"}))
    assert text.splitlines()[3].split() == ["q", "80", "-10.0", "0", "n/a", "3", "+1.0", "n/a"]


@pytest.fixture
def sqs_url(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    for name, value in (
        ("AWS_ACCESS_KEY_ID", "testing"),
        ("AWS_SECRET_ACCESS_KEY", "testing"),
        ("AWS_DEFAULT_REGION", "us-east-1"),
    ):
        if name not in os.environ:
            monkeypatch.setenv(name, value)
    handle = provide_or_skip("sqs", tmp_dir=tmp_path / "sqs")
    sep = "&" if "?" in handle.url else "?"
    yield f"{handle.url}{sep}prefix=t{uuid.uuid4().hex[:10]}-"
    handle.stop()


def test_stats_on_sqs_says_n_a_for_the_oldest_age(sqs_url):
    _fill(sqs_url)
    out = _run("stats", "--broker", sqs_url, "-Q", "default", "--json")
    assert out.returncode == 0, out.stderr
    [row] = json.loads(out.stdout)["queues"]
    assert row["oldest_age"] is None  # SQS has it only in CloudWatch
    assert (row["ready"], row["delayed"], row["in_flight"], row["dead"]) == (2, 1, 1, 1)
    table = _run("stats", "--broker", sqs_url, "-Q", "default").stdout.splitlines()
    assert table[3].split() == ["default", "2", "1", "1", "1", "n/a"]


# -- the logging options, before and after the command ---------------------------------------

_LOGGING = {  # option: (dest, a value other than its default, another one)
    "--loglevel": ("loglevel", "DEBUG", "ERROR"),
    "--log-format": ("log_format", "json", "text"),
    "--task-loglevel": ("task_loglevel", "WARNING", "DEBUG"),
    "--driver-loglevel": ("driver_loglevel", "INFO", "ERROR"),
}


def _commands() -> dict[str, list[str]]:
    """Every command of the command line (plugins' included), with a value for each of its
    required positional arguments."""
    out = {}
    for command, parser in _parsers(build_parser()):
        words = command.split()[1:]
        if words and not any(isinstance(a, argparse._SubParsersAction) for a in parser._actions):
            required = [a for a in parser._actions if not a.option_strings and a.nargs is None]
            out[command] = [*words, *("m:app" for _ in required)]
    return out


@pytest.mark.parametrize("option", sorted(_LOGGING))
def test_every_logging_option_works_before_and_after_every_command(monkeypatch, option):
    for name in _ENV:
        monkeypatch.delenv(name, raising=False)
    dest, value, other = _LOGGING[option]
    commands = _commands()
    assert {"ackwise worker", "ackwise stats", "ackwise dlq list", "ackwise conformance"} <= set(
        commands
    )
    for command, words in commands.items():
        parser = build_parser()
        default = getattr(parser.parse_args(words), dest)
        assert default != value, command
        before = parser.parse_args([option, value, *words])
        after = parser.parse_args([*words, option, value])
        both = parser.parse_args([option, other, *words, option, value])
        assert getattr(before, dest) == value, f"{command}: {option} before the command"
        assert getattr(after, dest) == value, f"{command}: {option} after the command"
        assert getattr(both, dest) == value, f"{command}: the one after the command wins"


def test_dlq_takes_the_logging_options_between_its_words_too():
    args = build_parser().parse_args(["dlq", "--log-format", "json", "list", "--loglevel", "DEBUG"])
    assert (args.log_format, args.loglevel) == ("json", "DEBUG")


def test_the_environment_still_sets_the_default_when_no_option_is_given(monkeypatch):
    monkeypatch.setenv("ACKWISE_LOG_FORMAT", "json")
    monkeypatch.setenv("ACKWISE_LOGLEVEL", "WARNING")
    args = build_parser().parse_args(["stats", "--broker", "memory://"])
    assert (args.log_format, args.loglevel) == ("json", "WARNING")
    args = build_parser().parse_args(["stats", "--broker", "memory://", "--log-format", "text"])
    assert (args.log_format, args.loglevel) == ("text", "WARNING")


def test_a_subcommands_help_shows_the_logging_options():
    out = _run("worker", "--help", env={"ACKWISE_LOGLEVEL": ""})
    assert out.returncode == 0, out.stderr
    text = " ".join(out.stdout.split())
    assert "logging options (also before the command):" in text
    for option in _LOGGING:
        assert f" {option} " in text, option
    assert "--loglevel LEVEL DEBUG, INFO, WARNING or ERROR (default: INFO;" in text


def test_a_worker_given_log_format_json_after_the_command_writes_json_lines(tmp_path):
    (tmp_path / "json_after_app.py").write_text(
        f"from ackwise import App\napp = App('j', broker='sqlite:///{tmp_path / 'b.db'}')\n"
        "@app.task(name='j.t')\ndef t():\n    pass\n"
    )
    log = tmp_path / "worker.log"
    with open(log, "wb") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", "ackwise", "--log-format", "text", "worker",
             "json_after_app:app", "--pool", "threads", "-c", "1", "--log-format", "json"],
            cwd=tmp_path, env={**os.environ, "PYTHONPATH": str(tmp_path)},
            stdout=out, stderr=subprocess.STDOUT,
        )  # fmt: skip
    try:
        deadline = time.monotonic() + 60
        while " ready: broker " not in log.read_text():
            assert proc.poll() is None, log.read_text()
            assert time.monotonic() < deadline, log.read_text()
            time.sleep(0.05)
    finally:
        proc.send_signal(signal.SIGTERM)
        status = proc.wait(timeout=60)
    assert status == 0, log.read_text()
    lines = [json.loads(line) for line in log.read_text().splitlines() if line.strip()]
    assert any(" ready: broker " in x["message"] for x in lines), lines
