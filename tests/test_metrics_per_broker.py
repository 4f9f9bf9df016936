"""docs/observability.md on every broker: a real ``ackwise worker --metrics-port 0`` exports
every counter at 0 from its start, for its known label sets, and no queue gauge carries a
figure the broker cannot report (no sample, not a 0), while the figures it reports are there.
"""

from __future__ import annotations

import math
import os
import re
import signal
import subprocess
import sys
import urllib.request
import uuid
from pathlib import Path
from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families

from ackwise import open_adapter
from ackwise.worker._events import DEAD_LETTER_REASONS, STALE_OPERATIONS
from ackwise_conformance.helpers import eventually

pytestmark = pytest.mark.timeout(120)

APP = """
from ackwise import App

app = App("zeros", broker={url!r}, default_queue={queue!r})


@app.task(name="zeros.noop")
def noop():
    pass
"""

#: The figures each broker cannot report, as the shared services run (RabbitMQ without its
#: management plugin counts only the asking connection's deliveries; SQS keeps the oldest
#: message's age in CloudWatch).  The test also checks these against the capabilities.
CANNOT_REPORT = {"rabbitmq": {"in_flight", "oldest_age"}, "sqs": {"oldest_age"}}

#: The queue gauges, by the field of ``QueueStats`` they carry.
QUEUE_GAUGES = {
    "ready": "ackwise_queue_ready_messages",
    "delayed": "ackwise_queue_delayed_messages",
    "in_flight": "ackwise_queue_in_flight_messages",
    "dead": "ackwise_queue_dead_messages",
    "oldest_age": "ackwise_queue_oldest_age_seconds",
}

#: Every counter of docs/observability.md's table (the family names, without ``_total``).
ACKWISE_COUNTERS = {
    "ackwise_tasks",
    "ackwise_deliveries",
    "ackwise_redeliveries",
    "ackwise_retries",
    "ackwise_dead_letters",
    "ackwise_lost_messages",
    "ackwise_stale_receipts",
    "ackwise_lease_renewals",
    "ackwise_lease_renewal_failures",
    "ackwise_broker_errors",
    "ackwise_broker_reconnects",
    "ackwise_queue_stats_errors",
}


def _families(port: int) -> dict[str, Any]:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as reply:
        text = reply.read().decode()
    return {f.name: f for f in text_string_to_metric_families(text)}


def _labels(family: Any) -> dict[tuple[tuple[str, str], ...], float]:
    return {tuple(sorted(s.labels.items())): s.value for s in family.samples}


def _wait_for_port(log: Path, proc: subprocess.Popen[bytes]) -> int:
    def said() -> int | None:
        assert proc.poll() is None, log.read_text()
        found = re.search(r"metrics on http://[^:]+:(\d+)/metrics", log.read_text())
        return int(found.group(1)) if found else None

    port: int = eventually(said, 60.0, description="the worker's metrics port")
    return port


def test_every_counter_has_a_sample_at_start_and_no_gauge_carries_an_unknown_figure(
    each_broker: Any, tmp_path: Path
) -> None:
    queue = each_broker.queue
    module = f"zeros_{uuid.uuid4().hex[:8]}"
    (tmp_path / f"{module}.py").write_text(APP.format(url=each_broker.url, queue=queue))
    log = tmp_path / "worker.log"
    with open(log, "wb") as out:
        proc = subprocess.Popen(
            [
                *(sys.executable, "-m", "ackwise", "worker", f"{module}:app"),
                *("--pool", "threads", "-c", "1"),
                *("--metrics-port", "0", "--metrics-host", "127.0.0.1"),
                *("--metrics-stats-interval", "0.2"),
            ],
            cwd=tmp_path,
            env={**os.environ, "PYTHONPATH": str(tmp_path)},
            stdout=out,
            stderr=subprocess.STDOUT,
        )
    try:
        port = _wait_for_port(log, proc)
        # The first scrape, as early as a scraper can make it: every counter is there at 0.
        first = _families(port)
        counters = {name: f for name, f in first.items() if f.type == "counter"}
        assert set(counters) >= ACKWISE_COUNTERS, sorted(ACKWISE_COUNTERS - set(counters))
        empty = sorted(name for name, f in counters.items() if not f.samples)
        assert not empty, f"counters without a sample at start: {empty}"
        task = "zeros.noop"
        known = {
            "ackwise_tasks": [
                {"task": task, "queue": queue, "outcome": o}
                for o in ("succeeded", "failed", "interrupted")
            ],
            "ackwise_retries": [{"task": task, "queue": queue}],
            "ackwise_lost_messages": [{"task": task, "queue": queue}],
            "ackwise_dead_letters": [{"queue": queue, "reason": r} for r in DEAD_LETTER_REASONS],
            "ackwise_stale_receipts": [{"queue": queue, "operation": o} for o in STALE_OPERATIONS],
            "ackwise_deliveries": [
                {"queue": queue, "attempt": a} for a in [*map(str, range(1, 10)), "10+"]
            ],
            "ackwise_redeliveries": [{"queue": queue}],
            "ackwise_broker_errors": [{"kind": "transient"}, {"kind": "permanent"}],
            "ackwise_broker_reconnects": [{}],
            "ackwise_lease_renewals": [{}],
            "ackwise_lease_renewal_failures": [{}],
            "ackwise_queue_stats_errors": [{}],
        }
        for name, label_sets in known.items():
            samples = _labels(counters[name])
            for labels in label_sets:
                key = tuple(sorted(labels.items()))
                assert samples.get(key) == 0.0, f"{name}{labels}: {samples.get(key)} at start"

        # The queue gauges, once the sampler has read the broker.
        def sampled() -> dict[str, Any] | None:
            families = _families(port)
            [age] = families["ackwise_queue_stats_age_seconds"].samples
            return None if math.isnan(age.value) else families

        gauges: dict[str, Any] = eventually(sampled, 30.0, description="a read of the stats")
        adapter = open_adapter(each_broker.url)
        adapter.open()
        try:
            caps = adapter.capabilities
        finally:
            adapter.close()
        cannot = {f for f, able in (("in_flight", caps.global_in_flight),
                                    ("oldest_age", caps.oldest_age)) if not able}  # fmt: skip
        assert cannot == CANNOT_REPORT.get(each_broker.name, set()), caps
        for field, name in QUEUE_GAUGES.items():
            queues = [s.labels.get("queue") for s in gauges[name].samples]
            if field in cannot:
                assert queue not in queues, f"{name}: a sample the broker cannot report"
            else:
                assert queues.count(queue) == 1, f"{name}: no sample for {queue}"
        [stats_errors] = gauges["ackwise_queue_stats_errors"].samples
        assert stats_errors.value == 0.0
    finally:
        proc.send_signal(signal.SIGTERM)
        status = proc.wait(timeout=60)
    assert status == 0, log.read_text()


def test_the_label_values_exported_at_start_are_the_documented_ones() -> None:
    docs = Path(__file__).resolve().parents[1] / "docs"
    table = docs.joinpath("failure-handling.md").read_text().split("## Dead letters", 1)[1]
    reasons = re.findall(r"^\| `(\w+)` \|", table.split("### ", 1)[0], re.M)
    assert reasons == list(DEAD_LETTER_REASONS)
    observability = docs.joinpath("observability.md").read_text()
    [row] = [
        line for line in observability.splitlines() if "(`ackwise_stale_receipts_total`)" in line
    ]
    assert re.findall(r"`([a-z_ ]+)`", row.split("|")[2]) == list(STALE_OPERATIONS)
    [stale] = [line for line in observability.splitlines() if line.startswith("| `stale` |")]
    assert set(re.findall(r"`([a-z_ ]+)`", stale.split("|")[4])) >= set(STALE_OPERATIONS)


def test_the_queue_gauges_wait_for_the_worker_to_declare_its_queues(each_broker: Any) -> None:
    """The metrics port is served before the worker has declared its queues: a scrape then
    reads nothing (no queue gauge has a sample, no stats read failed).  Read at once,
    RabbitMQ answers "not found" for a queue not declared yet, which counted a stats error
    at start in a clean run."""
    import threading

    from prometheus_client import CollectorRegistry, generate_latest

    from ackwise.spi import QueueSpec
    from ackwise.worker._metrics import QueueSampler

    ready = threading.Event()
    queue = each_broker.queue
    sampler = QueueSampler(lambda: open_adapter(each_broker.url), [queue], 0.01, ready=ready.is_set)
    registry = CollectorRegistry()
    registry.register(sampler)

    def scrape() -> dict[str, Any]:
        text = generate_latest(registry).decode()
        return {f.name: f for f in text_string_to_metric_families(text)}

    try:
        early = scrape()
        assert _labels(early["ackwise_queue_stats_errors"]) == {(): 0.0}
        assert _labels(early["ackwise_queue_ready_messages"]) == {}
        adapter = open_adapter(each_broker.url)
        adapter.open()
        try:
            adapter.declare(QueueSpec(queue))
        finally:
            adapter.close()
        ready.set()

        def sampled() -> dict[str, Any] | None:
            families = scrape()
            ready_messages = _labels(families["ackwise_queue_ready_messages"])
            return families if ready_messages else None

        later = eventually(sampled, 30.0, description="the queue gauges once ready")
        assert _labels(later["ackwise_queue_ready_messages"]) == {(("queue", queue),): 0.0}
        assert _labels(later["ackwise_queue_stats_errors"]) == {(): 0.0}
    finally:
        sampler.close()
