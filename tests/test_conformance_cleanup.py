"""After a run of ``ackwise conformance`` -- green, failing, or interrupted with Ctrl-C or
SIGTERM -- the broker holds nothing named with the run's prefix: no queue, exchange or key.

Each broker is a private one the suite starts (Redis, a RabbitMQ node with its management API,
a moto server), looked at directly: Redis ``SCAN``, the management API's queue and exchange
lists, SQS ``ListQueues``; on Redis every key the run made counts, named with the prefix or
not.  The failing run uses ``forgetful-<scheme>://``, the real adapter
whose ``ack`` removes nothing (``tests/selftest/forgetful_adapters.py``).
"""

from __future__ import annotations

import base64
import json
import os
import signal
import subprocess
import sys
import time
import urllib.request
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import parse_qs, urlsplit

import pytest

from ackwise_conformance.brokers import (
    BrokerHandle,
    provide_or_skip,
)
from ackwise_conformance.helpers import eventually

pytestmark = pytest.mark.slow

SELFTEST_DIR = Path(__file__).parent / "selftest"


@dataclass
class Target:
    handle: BrokerHandle
    leftovers: Callable[[str], list[str]]
    #: Level and scenarios of the green run (a beat scenario where the broker has a lock
    #: store).
    green: tuple[str, str]
    #: The signal that interrupts this broker's run, and the command's exit status for it.
    stop: tuple[int, int]


def _redis_leftovers(handle: BrokerHandle) -> Callable[[str], list[str]]:
    import redis

    client = redis.Redis.from_url(handle.url.split("?")[0])
    before = set(client.scan_iter(count=1000))

    def leftovers(prefix: str) -> list[str]:
        # Every key the run made, with its prefix or not (the worker registry's hash and the
        # result records were once outside it): the server is the test's own.
        return sorted(k.decode() for k in set(client.scan_iter(count=1000)) - before)

    return leftovers


def _rabbitmq_leftovers(handle: BrokerHandle) -> Callable[[str], list[str]]:
    api = parse_qs(urlsplit(handle.url).query)["management"][0]
    auth = base64.b64encode(b"guest:guest").decode()

    def names(what: str) -> list[str]:
        request = urllib.request.Request(
            f"{api}/api/{what}?columns=name", headers={"Authorization": f"Basic {auth}"}
        )
        with urllib.request.urlopen(request, timeout=10) as reply:
            return [row["name"] for row in json.load(reply)]

    def leftovers(prefix: str) -> list[str]:
        return sorted(
            f"{what[:-1]} {n}"
            for what in ("queues", "exchanges")
            for n in names(what)
            if prefix in n
        )

    return leftovers


def _sqs_leftovers(handle: BrokerHandle) -> Callable[[str], list[str]]:
    import boto3

    endpoint = parse_qs(urlsplit(handle.url).query)["endpoint_url"][0]
    client = boto3.client(
        "sqs",
        endpoint_url=endpoint,
        region_name="us-east-1",
        aws_access_key_id="testing",
        aws_secret_access_key="testing",
    )

    def leftovers(prefix: str) -> list[str]:
        urls = client.list_queues(MaxResults=1000).get("QueueUrls", [])
        return sorted(u.rsplit("/", 1)[1] for u in urls if prefix in u.rsplit("/", 1)[1])

    return leftovers


LEFTOVERS = {"redis": _redis_leftovers, "rabbitmq": _rabbitmq_leftovers, "sqs": _sqs_leftovers}
#: The green run's levels and scenarios (LATE only).  Level 1 runs where it is fastest: its
#: cleanup is the suite's own, and each adapter's delete_queue is checked by level 1 itself.
GREEN = {"redis": ("all", "C02,B04"), "rabbitmq": ("2", "C02"), "sqs": ("2", "C02")}
#: The interrupted run's signal.  The command turns SIGTERM into the interrupt Ctrl-C is
#: (``ackwise_conformance.cli``), so each signal is checked on some broker, not every pair.
STOP = {
    "redis": (signal.SIGTERM, 143),
    "rabbitmq": (signal.SIGINT, 130),
    "sqs": (signal.SIGINT, 130),
}


@pytest.fixture(scope="module", params=sorted(LEFTOVERS))
def target(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Target]:
    name = request.param
    for var, value in (
        ("AWS_ACCESS_KEY_ID", "testing"),
        ("AWS_SECRET_ACCESS_KEY", "testing"),
        ("AWS_DEFAULT_REGION", "us-east-1"),
    ):
        os.environ.setdefault(var, value)
    handle = provide_or_skip(name, tmp_dir=tmp_path_factory.mktemp(name), durable=False)
    yield Target(handle, LEFTOVERS[name](handle), GREEN[name], STOP[name])
    handle.stop()


def _cli(url: str, prefix: str, *args: str, plugin: str | None = None) -> subprocess.Popen[str]:
    env = dict(os.environ)
    if plugin is not None:
        env["ACKWISE_PLUGINS"] = plugin
        env["PYTHONPATH"] = os.pathsep.join(
            filter(None, [str(SELFTEST_DIR), env.get("PYTHONPATH")])
        )
    return subprocess.Popen(
        [sys.executable, "-m", "ackwise", "conformance", url, "--prefix", prefix, *args],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        # A shell running this in the background ignores SIGINT, and a child inherits that:
        # give the command the default a terminal user's Ctrl-C meets.
        preexec_fn=_default_sigint,
    )


def _default_sigint() -> None:
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def _finish(process: subprocess.Popen[str], timeout: float) -> tuple[int, str]:
    out, _ = process.communicate(timeout=timeout)
    return process.returncode, out


def _prefix() -> str:
    return f"cleanup-{uuid.uuid4().hex[:6]}-"


def test_a_green_run_leaves_nothing(target: Target) -> None:
    prefix = _prefix()
    status, out = _finish(
        _cli(
            target.handle.url,
            prefix,
            *("--level", target.green[0], "--scenario", target.green[1], "--mode", "late"),
        ),
        600,
    )
    assert status == 0, out[-4000:]
    assert target.leftovers(prefix) == []


def test_a_failing_run_leaves_nothing(target: Target) -> None:
    prefix = _prefix()
    url = f"forgetful-{target.handle.url}"
    status, out = _finish(
        _cli(
            url,
            prefix,
            *("--level", "2", "--scenario", "C02", "--mode", "late"),
            # RabbitMQ has no leases: the forgotten acks stay on the open channel and the
            # case would fail only when its drain gives up (60 s); closed at 10 s instead
            # (a green C02 takes about 2 s), it fails as overdue, which this run's cleanup
            # must survive too.
            *("--case-timeout", "10"),
            plugin="forgetful_adapters",
        ),
        600,
    )
    assert status == 1, out[-4000:]
    assert "fail" in out
    assert target.leftovers(prefix) == []


def test_an_interrupted_run_leaves_nothing(target: Target) -> None:
    stop, status = target.stop
    prefix = _prefix()
    process = _cli(target.handle.url, prefix, "--level", "2")
    try:
        eventually(
            lambda: len(target.leftovers(prefix)) >= 3 or process.poll() is not None,
            120,
            description="the run to create its first queues",
        )
        assert process.poll() is None, process.communicate()[0][-4000:]
        time.sleep(2.0)  # cases running: workers consuming, messages in flight
        process.send_signal(stop)
        code, out = _finish(process, 180)
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
    assert code == status, out[-4000:]
    assert "interrupted" in out
    assert target.leftovers(prefix) == []


def test_a_read_racing_the_close_makes_nothing_again(target: Target, tmp_path: Path) -> None:
    """An overdue case is closed from the runner's thread while its scenario still reads the
    broker (a drain's ``stats()``): on SQS a read of a queue that is gone declares it again.
    Once closed, no read of the case reaches the broker, so nothing is made behind the
    close (a failing run on SQS once left its queue so)."""
    import threading

    from ackwise import Ack
    from ackwise_conformance.harness import Harness, ScenarioFailed

    prefix = _prefix()
    h = Harness(target.handle, Ack.LATE, tmp_path / "case", prefix=prefix)
    stop = threading.Event()
    reads = {"after": 0}

    def read() -> None:
        while not stop.is_set():
            try:
                h.stats()
                h.dead_letters()
            except ScenarioFailed:
                reads["after"] += 1  # closed: the read was refused, nothing was asked
            except Exception:
                pass

    readers = [threading.Thread(target=read) for _ in range(2)]
    for t in readers:
        t.start()
    time.sleep(0.5)
    h.close()
    time.sleep(1.0)  # reads go on after the close, as a scenario's thread does
    stop.set()
    for t in readers:
        t.join(30)
    assert reads["after"] > 0
    assert target.leftovers(prefix) == []
