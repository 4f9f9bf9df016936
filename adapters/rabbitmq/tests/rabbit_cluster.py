"""A RabbitMQ cluster of the tests' own: several nodes on one machine, on free ports.

Each node is what the conformance suite's provisioner runs for one private node
(``ackwise_rabbitmq._provision``: its own name, AMQP, distribution and management ports,
data and logs), with one Erlang cookie for all of them (a shared ``HOME``), started in its
own process group (a SIGKILL of the group is the node's death).  The nodes after the first
join it with ``rabbitmqctl join_cluster``.  Nothing here touches the shared node on 5672.
"""

from __future__ import annotations

import os
import secrets
import signal
import subprocess
import urllib.request
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ackwise_conformance.brokers import free_port
from ackwise_conformance.helpers import eventually
from ackwise_conformance.provisioning import BrokerUnavailable, Slot
from ackwise_rabbitmq._provision import RabbitmqProvisioner

HOST = "127.0.0.1"
CTL = Path("/usr/lib/rabbitmq/bin/rabbitmqctl")


@dataclass
class RabbitNode:
    name: str  # the Erlang node name
    port: int
    management: int
    directory: Path
    argv: list[str]
    env: Mapping[str, str]
    proc: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        with (self.directory / "stdout.log").open("ab") as log:
            self.proc = subprocess.Popen(
                self.argv,
                env=dict(self.env),
                cwd=self.directory,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )

    def answers(self) -> bool:
        return RabbitmqProvisioner().ready(HOST, self.port)

    def ctl(self, *args: str, timeout: float = 120) -> str:
        done = subprocess.run(
            [str(CTL), "-n", self.name, *args],
            env=dict(self.env),
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
        )
        if done.returncode != 0:
            raise BrokerUnavailable(f"rabbitmqctl {' '.join(args)} on {self.name}: {done.stderr}")
        return done.stdout

    def kill(self) -> None:
        """SIGKILL the node's whole process group (the Erlang VM and its helpers)."""
        if self.proc is None:
            return
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        self.proc.wait(30)
        self.proc = None

    def terminate(self) -> None:
        """Ask the node to stop (SIGTERM to its process group); :meth:`stop` waits."""
        if self.proc is not None:
            try:
                os.killpg(self.proc.pid, signal.SIGTERM)
            except ProcessLookupError:
                pass

    def stop(self) -> None:
        if self.proc is None:
            return
        self.terminate()
        try:
            self.proc.wait(30)
        except subprocess.TimeoutExpired:
            pass
        self.kill()

    def api(self, path: str) -> Any:
        """GET ``path`` of this node's management API (guest/guest), parsed."""
        import base64
        import json

        request = urllib.request.Request(f"http://{HOST}:{self.management}{path}")
        token = base64.b64encode(b"guest:guest").decode()
        request.add_header("Authorization", f"Basic {token}")
        with urllib.request.urlopen(request, timeout=5) as reply:
            return json.loads(reply.read())


@dataclass
class LocalRabbitCluster:
    directory: Path
    size: int = 3
    nodes: list[RabbitNode] = field(default_factory=list)

    def start(self) -> LocalRabbitCluster:
        if not CTL.exists():
            raise BrokerUnavailable(f"{CTL} is not installed")
        home = self.directory / "home"
        home.mkdir(parents=True, exist_ok=True)
        cookie = home / ".erlang.cookie"
        cookie.write_text(secrets.token_hex(16).upper())
        cookie.chmod(0o400)
        for i in range(self.size):
            data = self.directory / f"node-{i}"
            data.mkdir(parents=True, exist_ok=True)
            slot = Slot(
                port=free_port(), data_dir=data, durable=True, config="", free_port=free_port
            )
            server = RabbitmqProvisioner().local(slot)
            env = dict(server.env or os.environ)
            env["HOME"] = str(home)  # the one cookie of the cluster
            management = int(server.url.rsplit(":", 1)[1])
            self.nodes.append(
                RabbitNode(
                    env["RABBITMQ_NODENAME"], slot.port, management, data, list(server.argv), env
                )
            )
        try:
            for node in self.nodes:
                node.start()
            for node in self.nodes:
                eventually(node.answers, 120, interval=0.2, description=f"{node.name} answers")
            first = self.nodes[0]
            for node in self.nodes[1:]:
                node.ctl("stop_app")
                node.ctl("join_cluster", first.name)
                node.ctl("start_app")
            eventually(self.formed, 60, interval=0.5, description="every node runs in the cluster")
        except BaseException:
            self.stop()
            raise
        return self

    def formed(self) -> bool:
        running = self.nodes[0].api("/api/nodes")
        return sum(1 for n in running if n.get("running")) == self.size

    def url(self, first: int = 0, management: int = 1) -> str:
        """The URL of node ``first``, the others as ``hosts``, the API of node ``management``."""
        head = self.nodes[first]
        others = ",".join(f"{HOST}:{n.port}" for n in self.nodes if n is not head)
        api = self.nodes[management].management
        return (
            f"amqp://guest:guest@{HOST}:{head.port}/%2F?hosts={others}&aux_queue_type=quorum"
            f"&management=http://{HOST}:{api}"
        )

    def leader_of(self, queue: str, *, ask: int = 1) -> RabbitNode | None:
        """The node that leads ``queue`` now, as node ``ask`` sees it (None: an election)."""
        info = self.nodes[ask].api(f"/api/queues/%2F/{queue}")
        leader = info.get("leader") or info.get("node")
        return next((n for n in self.nodes if n.name == leader), None)

    def stop(self) -> None:
        for node in self.nodes:
            node.terminate()  # all at once: each takes seconds to stop
        for node in self.nodes:
            node.stop()
