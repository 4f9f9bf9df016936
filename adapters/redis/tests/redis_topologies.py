"""Redis Cluster and Sentinel deployments of the tests' own, from ``redis-server`` on free ports.

:class:`LocalCluster` starts primaries and replicas with ``cluster-enabled yes`` and joins
them with ``redis-cli --cluster create``; :class:`LocalSentinels` starts a primary, replicas
and sentinels (``redis-server --sentinel``) watching it.  Both use a short node timeout /
down-after time (1 s) so that a failover takes seconds, and neither keeps data on disk
beyond its temporary directory.  Nothing here touches the shared Redis on 6379.
"""

from __future__ import annotations

import contextlib
import functools
import shutil
import signal
import subprocess
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import redis

from ackwise_conformance.brokers import free_port
from ackwise_conformance.helpers import eventually

HOST = "127.0.0.1"
#: Milliseconds without an answer before a node (cluster) or master (sentinel) counts as down.
NODE_TIMEOUT_MS = 1000


class TopologyUnavailable(RuntimeError):
    """No redis-server / redis-cli here, or the deployment did not come up."""


def _binary(name: str) -> str:
    path = shutil.which(name)
    if path is None:
        raise TopologyUnavailable(f"{name} is not on PATH")
    return path


@dataclass
class Node:
    port: int
    directory: Path
    argv: list[str]
    proc: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        log = (self.directory / "server.log").open("ab")
        self.proc = subprocess.Popen(
            self.argv, cwd=self.directory, stdout=log, stderr=subprocess.STDOUT
        )
        log.close()

    def client(self) -> redis.Redis:
        return redis.Redis(HOST, self.port, socket_timeout=2, socket_connect_timeout=2)

    def answers(self) -> bool:
        try:
            with contextlib.closing(self.client()) as c:
                return bool(c.ping())
        except redis.RedisError:
            return False

    def exited(self) -> bool:
        return self.proc is not None and self.proc.poll() is not None

    def log(self) -> str:
        try:
            return (self.directory / "server.log").read_text(errors="replace")[-2000:]
        except OSError:
            return ""

    def kill(self) -> None:
        """SIGKILL: no shutdown, no last words to the replicas."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait(10)

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.kill()


def _server(directory: Path, *extra: str) -> Node:
    directory.mkdir(parents=True, exist_ok=True)
    port = free_port()
    argv = [_binary("redis-server"), "--port", str(port), "--bind", HOST, "--save", ""]
    argv += ["--appendonly", "no", "--dir", str(directory), "--daemonize", "no"]
    argv += ["--repl-diskless-sync-delay", "0", *extra]  # a replica syncs at once
    return Node(port, directory, argv)


#: Tries to start one node when the ports it was given were taken before it bound them.
_LAUNCH_ATTEMPTS = 5


def _up_or_exited(node: Node) -> bool:
    return node.answers() or node.exited()


def _launch(build: Callable[[], Node]) -> Node:
    """Start the node ``build`` makes (on ports free when it is called) and wait until it
    answers; when another process took one of its ports meanwhile (the log says so), start a
    new one on other ports.  Nodes are launched one by one, so each node's ports are bound
    before the next one's are picked."""
    for _ in range(_LAUNCH_ATTEMPTS):
        node = build()
        node.start()
        try:
            eventually(
                functools.partial(_up_or_exited, node),
                15,
                description=f"redis-server on {node.port} answers",
            )
        except AssertionError:
            pass
        if node.answers():
            return node
        node.stop()
        log = node.log()
        if "Address already in use" not in log:
            raise TopologyUnavailable(f"redis-server on {node.port} did not start: {log}")
        shutil.rmtree(node.directory, ignore_errors=True)
    raise TopologyUnavailable(
        f"redis-server: its ports were taken before it bound them {_LAUNCH_ATTEMPTS} times"
    )


def _in_sync(node: Node) -> bool:
    """A primary, or a replica whose link to its primary is up (its initial sync done)."""
    try:
        with contextlib.closing(node.client()) as c:
            info = c.info("replication")
    except redis.RedisError:
        return False
    return info.get("role") == "master" or info.get("master_link_status") == "up"


@dataclass
class LocalCluster:
    """``primaries`` primaries, each with ``replicas`` replicas, on free ports."""

    directory: Path
    primaries: int = 3
    replicas: int = 1
    nodes: list[Node] = field(default_factory=list)

    def start(self) -> LocalCluster:
        count = self.primaries * (1 + self.replicas)
        try:
            for i in range(count):
                self.nodes.append(_launch(functools.partial(self._node, i)))
            create = [_binary("redis-cli"), "--cluster", "create"]
            create += [f"{HOST}:{n.port}" for n in self.nodes]
            create += ["--cluster-replicas", str(self.replicas), "--cluster-yes"]
            done = subprocess.run(create, capture_output=True, text=True, timeout=60, check=False)
            if done.returncode != 0:
                raise TopologyUnavailable(f"redis-cli --cluster create failed: {done.stdout}")
            eventually(self.healthy, 30, interval=0.1, description="the cluster is ok")
        except BaseException:
            self.stop()
            raise
        return self

    def _node(self, i: int) -> Node:
        return _server(
            self.directory / f"node-{i}",
            "--cluster-enabled",
            "yes",
            "--cluster-port",
            str(free_port()),
            "--cluster-config-file",
            "nodes.conf",
            "--cluster-node-timeout",
            str(NODE_TIMEOUT_MS),
            "--cluster-replica-validity-factor",
            "0",  # a replica always may take over, however long it was cut off
        )

    def healthy(self) -> bool:
        """Every live node says ``cluster_state:ok`` and knows all slots' owners."""
        for node in self.live():
            try:
                with contextlib.closing(node.client()) as c:
                    info = c.execute_command("CLUSTER", "INFO")
            except redis.RedisError:
                return False
            text = info.decode() if isinstance(info, bytes) else str(info)
            if "cluster_state:ok" not in text or not _in_sync(node):
                return False
        return True

    def live(self) -> list[Node]:
        return [n for n in self.nodes if n.proc is not None and n.proc.poll() is None]

    def url(self, query: str = "") -> str:
        first, *others = self.nodes
        nodes = ",".join(f"{HOST}:{n.port}" for n in others)
        return f"redis+cluster://{HOST}:{first.port}?nodes={nodes}{'&' + query if query else ''}"

    def primary_of(self, key: bytes | str) -> Node:
        """The node that serves ``key``'s slot now (asked of any live node)."""
        for node in self.live():
            try:
                with contextlib.closing(node.client()) as c:
                    slot = int(c.execute_command("CLUSTER", "KEYSLOT", key))
                    for first, last, primary, *_ in c.execute_command("CLUSTER", "SLOTS"):
                        if int(first) <= slot <= int(last):
                            return self.by_port(int(primary[1]))
            except redis.RedisError:
                continue
        raise TopologyUnavailable(f"no live node knows who serves {key!r}")

    def by_port(self, port: int) -> Node:
        return next(n for n in self.nodes if n.port == port)

    def node_id(self, node: Node) -> str:
        with contextlib.closing(node.client()) as c:
            return str(c.execute_command("CLUSTER", "MYID").decode())

    def move_slot(self, key: bytes | str, to: Node) -> None:
        """Migrate ``key``'s slot, with its keys, to primary ``to`` (as a resharding does)."""
        source = self.primary_of(key)
        src, dst = source.client(), to.client()
        try:
            slot = int(src.execute_command("CLUSTER", "KEYSLOT", key))
            src_id, dst_id = self.node_id(source), self.node_id(to)
            dst.execute_command("CLUSTER", "SETSLOT", slot, "IMPORTING", src_id)
            src.execute_command("CLUSTER", "SETSLOT", slot, "MIGRATING", dst_id)
            while keys := src.execute_command("CLUSTER", "GETKEYSINSLOT", slot, 100):
                src.execute_command("MIGRATE", HOST, to.port, "", 0, 5000, "KEYS", *keys)
            for node in self.live():
                with contextlib.closing(node.client()) as c:
                    with contextlib.suppress(redis.ResponseError):  # a replica says no
                        c.execute_command("CLUSTER", "SETSLOT", slot, "NODE", dst_id)
        finally:
            src.close()
            dst.close()

    def stop(self) -> None:
        for node in self.nodes:
            node.stop()


@dataclass
class LocalSentinels:
    """A master named ``service``, ``replicas`` replicas and ``sentinels`` sentinels."""

    directory: Path
    service: str = "ackwise-test"
    replicas: int = 1
    sentinels: int = 3
    servers: list[Node] = field(default_factory=list)
    watchers: list[Node] = field(default_factory=list)

    def start(self) -> LocalSentinels:
        try:
            master = _launch(functools.partial(_server, self.directory / "master"))
            self.servers.append(master)
            for i in range(self.replicas):
                replica = functools.partial(
                    _server, self.directory / f"replica-{i}", "--replicaof", HOST, str(master.port)
                )
                self.servers.append(_launch(replica))
            for i in range(self.sentinels):
                self.watchers.append(_launch(functools.partial(self._sentinel, i, master.port)))
            eventually(self.replicated, 30, interval=0.1, description="replicas in sync")
            eventually(self.watched, 30, interval=0.1, description="sentinels see the replicas")
        except BaseException:
            self.stop()
            raise
        return self

    def _sentinel(self, i: int, master_port: int) -> Node:
        directory = self.directory / f"sentinel-{i}"
        directory.mkdir(parents=True, exist_ok=True)
        port = free_port()
        quorum = self.sentinels // 2 + 1
        conf = directory / "sentinel.conf"
        conf.write_text(
            f"port {port}\nbind {HOST}\ndir {directory}\n"
            f"sentinel monitor {self.service} {HOST} {master_port} {quorum}\n"
            f"sentinel down-after-milliseconds {self.service} {NODE_TIMEOUT_MS}\n"
            f"sentinel failover-timeout {self.service} 5000\n"
            f"sentinel parallel-syncs {self.service} 1\n"
        )
        return Node(port, directory, [_binary("redis-server"), str(conf), "--sentinel"])

    def replicated(self) -> bool:
        return all(_in_sync(n) for n in self.servers[1:])

    def watched(self) -> bool:
        """Every sentinel knows the master, its replicas and the other sentinels."""
        for node in self.watchers:
            try:
                with contextlib.closing(node.client()) as c:
                    state = c.sentinel_master(self.service)
            except redis.RedisError:
                return False
            if int(state["num-slaves"]) != self.replicas:
                return False
            if int(state["num-other-sentinels"]) != self.sentinels - 1:
                return False
        return True

    def master(self) -> Node:
        """The server the sentinels name master now."""
        with contextlib.closing(self.watchers[0].client()) as c:
            _host, port = c.execute_command("SENTINEL", "GET-MASTER-ADDR-BY-NAME", self.service)
        return next(n for n in self.servers if n.port == int(port))

    def url(self, query: str = "") -> str:
        first, *others = self.watchers
        more = ",".join(f"{HOST}:{n.port}" for n in others)
        return (
            f"redis+sentinel://{HOST}:{first.port}/{self.service}/0?sentinels={more}"
            f"{'&' + query if query else ''}"
        )

    def stop(self) -> None:
        for node in [*self.watchers, *self.servers]:
            node.stop()


@dataclass
class PublishOutcome:
    """What :func:`publish_through_failover` saw."""

    confirmed: set[str]  # publishes that returned
    attempted: set[str]  # publishes begun (returned, raised or cut off)
    present: set[str]  # what the new master holds
    failover: float  # seconds from the kill to the new master

    @property
    def lost(self) -> set[str]:
        return self.confirmed - self.present


def publish_through_failover(
    deployment: LocalSentinels, query: str, *, producers: int = 4, publish_for: float = 1.0
) -> PublishOutcome:
    """Producer threads publish one message per call on ``deployment`` (URL options ``query``)
    for ``publish_for`` seconds, then the master is SIGKILLed; once the sentinels promoted a
    replica, the new master's queue ``q`` is read out."""
    from ackwise import open_adapter
    from ackwise.errors import AdapterError
    from ackwise.spi import Outgoing, QueueSpec

    url = deployment.url(query)
    setup = open_adapter(url)
    setup.open()
    setup.declare(QueueSpec("q"))
    setup.close()
    confirmed: set[str] = set()
    attempted: set[str] = set()
    stop = threading.Event()

    def produce(n: int) -> None:
        adapter = open_adapter(url)
        adapter.open()
        i = 0
        while not stop.is_set():
            mid = f"p{n}-{i}"
            i += 1
            attempted.add(mid)
            try:
                adapter.publish("q", [Outgoing(id=mid, body=b"x" * 200)])
            except AdapterError:
                break
            confirmed.add(mid)
        adapter.close()

    threads = [threading.Thread(target=produce, args=(n,)) for n in range(producers)]
    for t in threads:
        t.start()
    time.sleep(publish_for)
    victim = deployment.master()
    killed = time.monotonic()
    victim.kill()
    stop.set()
    for t in threads:
        t.join(30)
    eventually(lambda: deployment.master() is not victim, 60, interval=0.05)
    took = time.monotonic() - killed
    reader = open_adapter(url)
    present: set[str] = set()
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        try:
            got = reader.receive("q", max_messages=1000, wait=0.2, lease=60)
        except AdapterError:  # the old master's connection, or the promotion under way
            reader.close()
            time.sleep(0.2)
            continue
        if not got:
            break
        present |= {d.message_id for d in got}
        reader.ack(got)
    reader.close()
    return PublishOutcome(confirmed, attempted, present, took)
