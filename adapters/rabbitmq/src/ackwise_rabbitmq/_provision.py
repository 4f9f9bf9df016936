"""Private RabbitMQ nodes for the conformance suite (entry point, loaded by it only).

Registered under ``ackwise.conformance.provisioners`` in this package's ``pyproject.toml``;
nothing in ``ackwise_rabbitmq`` imports this module, so the adapter never imports the suite.
"""

from __future__ import annotations

import os
import shutil
import socket
import uuid
from pathlib import Path

from ackwise_conformance.provisioning import (
    BrokerUnavailable,
    ContainerSpec,
    LocalServer,
    Provisioner,
    Slot,
)

__all__ = ["RabbitmqProvisioner"]


def _rabbitmq_binary() -> str | None:
    explicit = os.environ.get("ACKWISE_TEST_RABBITMQ_SERVER")
    if explicit:
        return explicit
    # Debian's /usr/sbin/rabbitmq-server is a wrapper that, run as root, re-runs the real
    # script as the rabbitmq user through su: that user cannot write our temporary directory.
    real = Path("/usr/lib/rabbitmq/bin/rabbitmq-server")
    if real.exists():
        return str(real)
    return shutil.which("rabbitmq-server")


class RabbitmqProvisioner(Provisioner):
    """A private RabbitMQ node.

    It shares the machine's epmd (``ERL_EPMD_PORT`` is one per host), so its node name is
    unique; its Erlang distribution port (``RABBITMQ_DIST_PORT``, else AMQP port + 20000) must
    differ from every other node's, the shared one's 25672 included, so it is a free port too.
    ``RABBITMQ_CONF_ENV_FILE`` points at an empty file: the system's ``rabbitmq-env.conf``
    would otherwise set the shared node's name.  The management plugin listens on a free
    port of its own (the URL's ``management`` option): AMQP cannot count unacknowledged
    messages, and the conformance checks need the broker's own in-flight count.  Its queues
    are quorum queues, durable whatever ``durable`` says.
    """

    name = "rabbitmq"
    ready_timeout = 60.0
    stop_timeout = 30.0

    def local(self, slot: Slot) -> LocalServer:
        binary = _rabbitmq_binary()
        if binary is None:
            raise BrokerUnavailable("rabbitmq-server is not on PATH")
        node = f"ackwise-{uuid.uuid4().hex[:12]}@localhost"
        port, data_dir = slot.port, slot.data_dir
        dist_port = slot.free_port()
        mgmt_port = slot.free_port()
        log_dir = data_dir / "log"
        log_dir.mkdir()
        config = data_dir / "rabbitmq.conf"
        config.write_text(
            f"listeners.tcp.default = {slot.host}:{port}\n"
            f"management.tcp.ip = {slot.host}\nmanagement.tcp.port = {mgmt_port}\n"
            # Queue totals read from the queues themselves at each request, not from the
            # statistics database (sampled every 5 s): exact in-flight counts for the checks.
            "management.disable_stats = true\nmanagement.enable_queue_totals = true\n"
            + slot.config
            + "\n"
        )
        # Quorum queues report their counts on every leader tick (default 5 s).
        advanced = data_dir / "advanced.config"
        advanced.write_text(
            # A channel checks its consumers' consumer_timeout once per tick (default 60 s).
            "[{rabbit, [{quorum_tick_interval, 200}, {collect_statistics_interval, 100},\n"
            "           {channel_tick_interval, 1000}]},\n"
            " {rabbitmq_management_agent, [{collect_statistics_interval, 100}]},\n"
            " {rabbitmq_management, [{collect_statistics_interval, 100}]}].\n"
        )
        plugins = data_dir / "enabled_plugins"
        plugins.write_text("[rabbitmq_management].\n")
        env_file = data_dir / "rabbitmq-env.conf"
        env_file.write_text("")
        env = dict(os.environ)
        env.update(
            HOME=str(data_dir),  # its own Erlang cookie
            RABBITMQ_CONF_ENV_FILE=str(env_file),
            RABBITMQ_NODENAME=node,
            RABBITMQ_NODE_IP_ADDRESS=slot.host,
            RABBITMQ_NODE_PORT=str(port),
            RABBITMQ_DIST_PORT=str(dist_port),
            RABBITMQ_MNESIA_BASE=str(data_dir / "mnesia"),
            RABBITMQ_LOG_BASE=str(log_dir),
            RABBITMQ_CONFIG_FILE=str(config),
            RABBITMQ_ADVANCED_CONFIG_FILE=str(advanced),
            RABBITMQ_ENABLED_PLUGINS_FILE=str(plugins),
            RABBITMQ_SERVER_ADDITIONAL_ERL_ARGS="-kernel inet_dist_use_interface {127,0,0,1}",
            ERL_EPMD_ADDRESS="127.0.0.1",
        )
        return LocalServer(
            argv=[binary],
            url=f"amqp://guest:guest@{slot.host}:{port}/%2F"
            f"?management=http://{slot.host}:{mgmt_port}",
            env=env,
            log_files=[log_dir / f"{node}.log"],
        )

    def ready(self, host: str, port: int) -> bool:
        """True when the AMQP 0-9-1 protocol header gets a frame back (``Connection.Start``).

        The port accepts connections a little before the broker can serve them.
        """
        try:
            with socket.create_connection((host, port), timeout=1.0) as sock:
                sock.settimeout(3.0)
                sock.sendall(b"AMQP\x00\x00\x09\x01")
                return sock.recv(8).startswith(b"\x01")  # frame type 1: a method frame
        except OSError:
            return False

    def container(self, *, durable: bool) -> ContainerSpec:
        return ContainerSpec(
            image="rabbitmq:3.13-alpine",
            port=5672,
            url="amqp://ackwise:ackwise@{host}:{port}/%2F",
            # guest may only log in over loopback; through Docker's port mapping it is not.
            env={"RABBITMQ_DEFAULT_USER": "ackwise", "RABBITMQ_DEFAULT_PASS": "ackwise"},
        )
