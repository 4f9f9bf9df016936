"""A late ack after this process was paused (SIGSTOP, then SIGCONT): the adapter does not
trust a connection it has not heard from since, so the ack says whether it was taken in.

A real process is paused, as the conformance scenarios C07 and C08 pause a worker: the child
below consumes one message, is stopped, and acks the moment it runs again.  With a 1 s
heartbeat the broker closes the connection of a client it has not heard from for 2 s, and gives
the message to others: the ack must then report the receipt stale (C08 waits for the worker to
say so), and after a shorter pause the same ack must go through.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator

import pytest

from ackwise import BrokerURL
from ackwise.spi import Outgoing, QueueSpec
from ackwise_conformance.brokers import BrokerHandle
from ackwise_conformance.harness import with_options
from ackwise_conformance.helpers import eventually
from ackwise_rabbitmq import RabbitMQAdapter

pytestmark = pytest.mark.slow

_CHILD = """
import signal, sys, time
from ackwise import BrokerURL
from ackwise.errors import StaleReceipt
from ackwise_rabbitmq import RabbitMQAdapter

url, queue = sys.argv[1], sys.argv[2]
adapter = RabbitMQAdapter(BrokerURL.parse(url))
adapter.open()
deliveries = []
while not deliveries:
    deliveries = adapter.receive(queue, max_messages=1, wait=1.0, lease=1.0)
resumed = []
signal.signal(signal.SIGCONT, lambda *_: resumed.append(True))
print("ready", flush=True)
while not resumed:
    time.sleep(0.001)
try:
    adapter.ack(deliveries)
    print("acked", flush=True)
except StaleReceipt:
    print("stale", flush=True)
adapter.close()
"""


def _paused_ack(url: str, queue: str, pause: float) -> str:
    """What the child says of its ack after a pause of ``pause`` seconds."""
    child = subprocess.Popen(
        [sys.executable, "-c", _CHILD, url, queue], stdout=subprocess.PIPE, text=True
    )
    try:
        assert child.stdout is not None
        assert child.stdout.readline().strip() == "ready"
        os.kill(child.pid, signal.SIGSTOP)
        time.sleep(pause)  # the fault itself: the process stays stopped this long
        os.kill(child.pid, signal.SIGCONT)
        out, _ = child.communicate(timeout=60)
    finally:
        if child.poll() is None:
            child.kill()
    return out.strip()


@pytest.fixture
def base(rabbitmq_broker: BrokerHandle) -> str:
    return rabbitmq_broker.url


@pytest.fixture
def queue(base: str) -> Iterator[str]:
    name = f"pause-{uuid.uuid4().hex[:10]}"
    adapter = RabbitMQAdapter(_url(base, 1))
    adapter.open()
    adapter.declare(QueueSpec(name))
    adapter.publish(name, [_message()])
    adapter.close()
    yield name
    adapter = RabbitMQAdapter(_url(base, 1))
    adapter.open()
    adapter.delete_queue(name)
    adapter.close()


def _url(base: str, heartbeat: int) -> BrokerURL:
    return BrokerURL.parse(with_options(base, heartbeat=heartbeat))


def _message() -> Outgoing:
    return Outgoing(uuid.uuid4().hex, b"paused", 0.0, 0)


def test_an_ack_after_a_pause_the_connection_did_not_survive_is_reported_stale(
    base: str, queue: str
) -> None:
    url = with_options(base, heartbeat=1)
    assert _paused_ack(url, queue, pause=4.0) == "stale"
    # The broker took the delivery back when it closed the connection: another consumer gets it.
    other = RabbitMQAdapter(_url(base, 1))
    other.open()
    try:
        got: list[object] = []
        eventually(
            lambda: got.extend(other.receive(queue, max_messages=1, wait=0.5, lease=1.0)) or got,
            10.0,
            description="the message delivered again",
        )
    finally:
        other.close()


def test_an_ack_after_a_pause_the_connection_survived_goes_through(base: str, queue: str) -> None:
    url = with_options(base, heartbeat=30)
    assert _paused_ack(url, queue, pause=1.5) == "acked"
    other = RabbitMQAdapter(_url(base, 1))
    other.open()
    try:
        assert other.stats(queue).ready == 0
        assert other.receive(queue, max_messages=1, wait=1.0, lease=1.0) == []
    finally:
        other.close()
