"""OpenTelemetry (docs/observability.md): the producer's span and the linked consumer span,
across processes, read from the SDK's in-memory exporter of each process."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path
from typing import Any

import pytest

APP = """
import atexit, json, os
from opentelemetry import trace
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from ackwise import App

exporter = InMemorySpanExporter()


class DumpOnFlush(SimpleSpanProcessor):
    # Each process writes what its in-memory exporter holds when its provider is flushed
    # (a prefork child before it exits; others at exit).
    def force_flush(self, timeout_millis=30000):
        spans = exporter.get_finished_spans()
        if spans:
            path = os.path.join({spans_dir!r}, f"spans-{{os.getpid()}}.jsonl")
            with open(path, "w") as f:
                for s in spans:
                    f.write(json.dumps(json.loads(s.to_json())) + "\\n")
        return True


provider = TracerProvider()
provider.add_span_processor(DumpOnFlush(exporter))
trace.set_tracer_provider(provider)
atexit.register(provider.force_flush)

app = App("traced", broker={url!r})

@app.task(name="traced.ok")
def ok():
    with trace.get_tracer("user").start_as_current_span("inside the task"):
        pass

@app.task(name="traced.boom", autoretry_for=())
def boom():
    raise RuntimeError("boom")
"""


def _spans(spans_dir: Path) -> list[dict[str, Any]]:
    out = []
    for path in spans_dir.glob("spans-*.jsonl"):
        out += [json.loads(line) for line in path.read_text().splitlines()]
    return out


@pytest.mark.slow
@pytest.mark.parametrize("pool", ["prefork", "threads"])
def test_consumer_span_is_a_linked_child_of_the_producer_span(tmp_path: Path, pool: str) -> None:
    spans_dir = tmp_path / "spans"
    spans_dir.mkdir()
    name = f"traced_app_{uuid.uuid4().hex[:8]}"
    url = f"sqlite:///{tmp_path / 'broker.db'}"
    (tmp_path / f"{name}.py").write_text(APP.format(url=url, spans_dir=str(spans_dir)))
    env = {**os.environ, "PYTHONPATH": str(tmp_path)}
    producer = subprocess.run(
        [sys.executable, "-c", f"import {name} as m; print(m.ok.delay()); print(m.boom.delay())"],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert producer.returncode == 0, producer.stderr
    ok_id, boom_id = producer.stdout.split()
    worker = subprocess.Popen(
        [sys.executable, "-m", "ackwise", "worker", f"{name}:app", "--pool", pool, "-c", "1"],
        cwd=tmp_path,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    sys.path.insert(0, str(tmp_path))
    try:
        from ackwise import App

        adapter = App("probe", broker=url).adapter()
        adapter.open()
        deadline = time.monotonic() + 60
        while True:
            st = adapter.stats("default")
            if (st.ready, st.in_flight, st.dead) == (0, 0, 1):
                break
            assert time.monotonic() < deadline, st
            time.sleep(0.05)
        adapter.close()
    finally:
        sys.path.remove(str(tmp_path))
        worker.send_signal(signal.SIGTERM)
        _, err = worker.communicate(timeout=60)
    assert worker.returncode == 0, err.decode()

    spans = _spans(spans_dir)
    producers = {
        s["attributes"]["messaging.message.id"]: s
        for s in spans
        if s["kind"] == "SpanKind.PRODUCER"
    }
    consumers = {
        s["attributes"]["messaging.message.id"]: s
        for s in spans
        if s["kind"] == "SpanKind.CONSUMER"
    }
    assert set(producers) == set(consumers) == {ok_id, boom_id}, spans
    for message_id, outcome in ((ok_id, "succeeded"), (boom_id, "failed")):
        sent, ran = producers[message_id], consumers[message_id]
        assert sent["name"] == "send default" and ran["name"] == "process default"
        assert sent["attributes"]["messaging.system"] == "sqlite"
        assert sent["attributes"]["messaging.destination.name"] == "default"
        assert sent["attributes"]["messaging.operation.type"] == "send"
        # Same trace, child of the producer span, and linked to it.
        assert ran["context"]["trace_id"] == sent["context"]["trace_id"]
        assert ran["parent_id"] == sent["context"]["span_id"]
        assert [link["context"]["span_id"] for link in ran["links"]] == [sent["context"]["span_id"]]
        assert ran["attributes"] == {
            "messaging.system": "sqlite",
            "messaging.operation.type": "process",
            "messaging.operation.name": "process",
            "messaging.destination.name": "default",
            "messaging.message.id": message_id,
            "ackwise.task": f"traced.{'ok' if outcome == 'succeeded' else 'boom'}",
            "ackwise.mode": "late",
            "ackwise.delivery_count": 1,
            "ackwise.outcome": outcome,
        }
    assert consumers[boom_id]["status"]["status_code"] == "ERROR"
    assert "RuntimeError: boom" in consumers[boom_id]["status"]["description"]
    # The task's own span nests under the consumer span.
    [inner] = [s for s in spans if s["name"] == "inside the task"]
    assert inner["parent_id"] == consumers[ok_id]["context"]["span_id"]


def test_without_opentelemetry_nothing_is_traced_and_publishing_works(tmp_path: Path) -> None:
    code = (
        "import sys, uuid\n"
        "sys.modules['opentelemetry'] = None  # as if it were not installed\n"
        "from ackwise import App\n"
        "from ackwise.app import _tracing\n"
        "from ackwise.testing import run_worker\n"
        "assert not _tracing.ENABLED\n"
        "app = App('t', broker=f'memory://{uuid.uuid4().hex}')\n"
        "@app.task(name='t.ok')\n"
        "def ok(): pass\n"
        "ok.delay()\n"
        "app.send_many([ok.s()])\n"
        "with run_worker(app) as w:\n"
        "    assert len(w.join().succeeded) == 2\n"
        "print('ok')\n"
    )
    proc = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, cwd=tmp_path
    )
    assert proc.returncode == 0 and proc.stdout.strip() == "ok", proc.stderr


def test_trace_context_travels_in_the_envelope_headers_once_a_provider_is_set(
    tmp_path: Path,
) -> None:
    # In a process of its own: a tracer provider is set once per process.
    code = """
import uuid
from opentelemetry import trace
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from ackwise import App, decode_envelope

app = App("t", broker=f"memory://{uuid.uuid4().hex}")

@app.task(name="t.ok")
def ok():
    pass

def headers():
    adapter = app.adapter()
    adapter.open()
    deliveries = adapter.receive("default", max_messages=10, wait=0, lease=5)
    adapter.ack(deliveries)
    return [decode_envelope(d.body).headers for d in deliveries]

# The API without a provider: spans would record nothing, so nothing is done at all.
ok.delay()
assert headers() == [{}], "no provider: no trace headers"

exporter = InMemorySpanExporter()
provider = TracerProvider()
provider.add_span_processor(SimpleSpanProcessor(exporter))
trace.set_tracer_provider(provider)
with trace.get_tracer("web").start_as_current_span("request") as parent:
    ok.delay()
    app.send_many([ok.s(), ok.s()])
sent = {s.context.span_id: s for s in exporter.get_finished_spans() if s.name.startswith("send")}
assert len(sent) == 2
got = headers()
assert len(got) == 3
for h in got:
    _, trace_id, span_id, _ = h["traceparent"].split("-")
    assert int(trace_id, 16) == parent.get_span_context().trace_id
    assert int(span_id, 16) in sent, "the producer span's own context is what travels"
print("ok")
"""
    proc = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, cwd=tmp_path
    )
    assert proc.returncode == 0 and proc.stdout.strip() == "ok", proc.stderr
