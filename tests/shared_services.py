"""What a test run left in the shared services: a pytest plugin (the root ``conftest.py`` loads it).

At the start of the session (in the xdist controller, or in the one pytest process) it lists
what the shared services hold, and again at its end, and reports every name that is new and
still there:

- Redis (``ACKWISE_SHARED_REDIS``, default ``redis://127.0.0.1:6379``): the keys of db 0 and of
  every database that holds keys (``INFO keyspace``); a key that expires within
  :data:`SOON` seconds is not counted (leases and rate-limit slots go by themselves);
- RabbitMQ (``ACKWISE_SHARED_RABBITMQ``, default ``rabbitmqctl``: the command, which lists the
  node's queues and exchanges without the management plugin; it needs the node's cookie,
  i.e. root here);
- NATS (``ACKWISE_SHARED_NATS``, default ``nats://127.0.0.1:4222``): the JetStream streams,
  key-value buckets (``KV_<bucket>``) and object stores (``OBJ_<name>``) among them.

An empty variable leaves that service out; a service that cannot be listed at the start is not
checked (one line says why).  What is left is grouped by the part of its name before the first
random hex part (``dash`` for ``{dash1a2b3c4d:default}:seq``), which names the test that
made it.  Under ``CI=true`` (nothing else uses the services) the run fails; otherwise it only
warns, since other runs may share the services.
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import subprocess
import threading
import time
from collections import defaultdict
from collections.abc import Callable
from typing import Any

import pytest

#: A Redis key that expires within this many seconds of the end is not counted as left.
SOON = 60.0
#: Names shown per prefix in the report.
SHOWN = 5

DEFAULTS = {
    "ACKWISE_SHARED_REDIS": "redis://127.0.0.1:6379",
    "ACKWISE_SHARED_RABBITMQ": "rabbitmqctl",
    "ACKWISE_SHARED_NATS": "nats://127.0.0.1:4222",
}

#: What a listing returns: ``{(service, kind): names}``, e.g. ``("redis", "db0")``.
Listing = dict[tuple[str, str], set[str]]


def _setting(name: str) -> str:
    return os.environ.get(name, DEFAULTS[name])


# -- the services --------------------------------------------------------------------------
def list_redis(url: str) -> Listing:
    """The keys of db 0 and of every database that holds keys, by database."""
    import redis

    def client(db: int) -> Any:
        return redis.Redis.from_url(url, db=db, socket_timeout=10, socket_connect_timeout=3)

    with client(0) as first:
        keyspace = first.info("keyspace")
    found: Listing = {}
    for db in sorted({0} | {int(name[2:]) for name in keyspace if name.startswith("db")}):
        with client(db) as c:
            found["redis", f"db{db}"] = {k.decode() for k in c.scan_iter(count=1000)}
    return found


def _redis_lasting(url: str, db: int, keys: set[str]) -> set[str]:
    """Those of ``keys`` still there that do not expire within :data:`SOON` seconds."""
    import redis

    ordered = sorted(keys)
    with redis.Redis.from_url(url, db=db, socket_timeout=10, socket_connect_timeout=3) as client:
        pipe = client.pipeline(transaction=False)
        for key in ordered:
            pipe.pttl(key)
        ttls = pipe.execute()
    return {k for k, ms in zip(ordered, ttls, strict=True) if ms == -1 or ms > SOON * 1000}


def list_rabbitmq(command: str) -> Listing:
    """The queues and exchanges of the default virtual host, by ``rabbitmqctl``."""
    kinds = ("queues", "exchanges")
    procs = {
        kind: subprocess.Popen(
            [command, f"list_{kind}", "name", "-q", "--no-table-headers"],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for kind in kinds
    }  # both at once: each call starts an Erlang VM (~1 s)
    found: Listing = {}
    for kind, proc in procs.items():
        out, err = proc.communicate(timeout=60)
        if proc.returncode != 0:
            raise RuntimeError(f"{command} list_{kind}: {(err or out).strip().splitlines()[:1]}")
        found["rabbitmq", kind[:-1]] = {line.strip() for line in out.splitlines() if line.strip()}
    return found


def list_nats(url: str) -> Listing:
    """The JetStream streams (KV buckets and object stores are streams too)."""
    import nats

    async def names() -> set[str]:
        client = await nats.connect(url, connect_timeout=3, max_reconnect_attempts=0)
        try:
            found: set[str] = set()
            while True:
                reply = await client.request(
                    "$JS.API.STREAM.NAMES", json.dumps({"offset": len(found)}).encode(), 10
                )
                answer = json.loads(reply.data)
                if "error" in answer:
                    raise RuntimeError(f"STREAM.NAMES: {answer['error']}")
                page = answer.get("streams") or []
                found.update(page)
                if not page or len(found) >= answer.get("total", 0):
                    return found
        finally:
            await client.close()

    return {("nats", "stream"): asyncio.run(names())}


def snapshot() -> tuple[Listing, list[str]]:
    """What the configured services hold now, and a line per service that could not be listed."""
    listers: dict[str, Callable[[], Listing]] = {}
    if redis_url := _setting("ACKWISE_SHARED_REDIS"):
        listers["redis"] = lambda: list_redis(redis_url)
    if rabbitmqctl := _setting("ACKWISE_SHARED_RABBITMQ"):
        listers["rabbitmq"] = lambda: list_rabbitmq(rabbitmqctl)
    if nats_url := _setting("ACKWISE_SHARED_NATS"):
        listers["nats"] = lambda: list_nats(nats_url)
    found: Listing = {}
    problems: list[str] = []
    lock = threading.Lock()

    def run(name: str, lister: Callable[[], Listing]) -> None:
        try:
            listed = lister()
        except Exception as exc:
            with lock:
                problems.append(f"{name}: {type(exc).__name__}: {exc}")
            return
        with lock:
            found.update(listed)

    threads = [threading.Thread(target=run, args=item, daemon=True) for item in listers.items()]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return found, sorted(problems)


def left_behind(before: Listing, after: Listing) -> Listing:
    """What is in ``after`` and not in ``before``, of the services listed both times (a Redis
    database empty at the start was listed as empty)."""
    checked = {service for service, _ in before}
    new: Listing = {}
    for (service, kind), names in after.items():
        if service not in checked:
            continue
        added = names - before.get((service, kind), set())
        if added and service == "redis":
            added = _redis_lasting(_setting("ACKWISE_SHARED_REDIS"), int(kind[2:]), added)
        if added:
            new[service, kind] = added
    return new


_RANDOM = re.compile(r"[0-9a-f]{6,}")


def prefix_of(name: str) -> str:
    """The part of ``name`` before its first random hex part (a Redis hash tag's brace
    dropped): what the test that made it named it with."""
    bare = name.removeprefix("{")
    found = _RANDOM.search(bare)
    return bare[: found.start()] if found else bare


def report(left: Listing) -> list[str]:
    """One line per service, kind and prefix: how many names, and the first few."""
    lines = []
    for (service, kind), names in sorted(left.items()):
        groups: dict[str, list[str]] = defaultdict(list)
        for name in sorted(names):
            groups[prefix_of(name)].append(name)
        for prefix, members in sorted(groups.items()):
            more = f" (+{len(members) - SHOWN} more)" if len(members) > SHOWN else ""
            lines.append(
                f"{service} {kind}, prefix {prefix!r}: {len(members)} left: "
                + ", ".join(members[:SHOWN])
                + more
            )
    return lines


def _under_ci() -> bool:
    return os.environ.get("CI") == "true"  # as ackwise_conformance.brokers.missing_broker


# -- the plugin ----------------------------------------------------------------------------
class SharedServicesCheck:
    """Lists the shared services at the session's start and end; reports what was left."""

    def __init__(self) -> None:
        self.before: Listing = {}
        self.problems: list[str] = []
        self.lines: list[str] = []
        self.seconds = 0.0

    @pytest.hookimpl(tryfirst=True)  # before xdist starts its workers
    def pytest_sessionstart(self, session: pytest.Session) -> None:
        started = time.monotonic()
        self.before, self.problems = snapshot()
        self.seconds = time.monotonic() - started

    @pytest.hookimpl(trylast=True)  # after the workers (and their session fixtures) finished
    def pytest_sessionfinish(self, session: pytest.Session, exitstatus: Any) -> None:
        started = time.monotonic()
        after, _ = snapshot()
        self.lines = report(left_behind(self.before, after))
        self.seconds += time.monotonic() - started
        if self.lines and _under_ci() and session.exitstatus == pytest.ExitCode.OK:
            session.exitstatus = pytest.ExitCode.TESTS_FAILED

    def pytest_terminal_summary(self, terminalreporter: Any) -> None:
        for problem in self.problems:
            terminalreporter.write_line(f"shared services: not checked: {problem}")
        if not self.lines:
            return
        if _under_ci():
            title = "left in the shared services (CI=true: the run fails)"
        else:
            title = "left in the shared services (a warning: CI is not set, others may use them)"
        terminalreporter.write_sep("=", title, red=_under_ci(), yellow=not _under_ci())
        for line in self.lines:
            terminalreporter.write_line(line)
        terminalreporter.write_line(f"(listing the services took {self.seconds:.1f}s)")


def register(config: pytest.Config) -> None:
    """Register the check in this pytest process unless it is an xdist worker."""
    if hasattr(config, "workerinput"):
        return
    config.pluginmanager.register(SharedServicesCheck(), "ackwise-shared-services")
