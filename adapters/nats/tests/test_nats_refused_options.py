"""NATS keeps no results, rate limits or idempotency keys of its own: an app that needs one and
has none is refused by the producer, before anything is published, in the line a worker would
refuse it with; stores given elsewhere serve it (docs/adapters/nats.md, "Stores")."""

from __future__ import annotations

import os
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from ackwise import Adapter, App, open_adapter
from ackwise.errors import ConfigurationError
from ackwise.testing import run_worker


@pytest.fixture
def watch(nats_url: str) -> Iterator[Adapter]:
    """The test's NATS, as a plain adapter that looks at its queues (deleted after the test)."""
    adapter = open_adapter(nats_url)
    adapter.open()
    before = set(adapter.queues())
    yield adapter
    for queue in set(adapter.queues()) - before:
        adapter.delete_queue(queue)
    adapter.close()


def test_an_app_storing_results_on_nats_without_a_result_store_is_refused_before_publishing(
    nats_url: str, watch: Adapter
) -> None:
    """Issue 37: ``delay()`` used to succeed here, and ``ackwise worker`` then exited 2 with
    "has no result store"."""
    queue = f"q-{uuid.uuid4().hex[:8]}"
    with pytest.raises(ConfigurationError) as refused:
        app = App("shop", broker=nats_url, store_results=True, default_queue=queue)

        @app.task(name="shop.add")
        def add(a: int, b: int) -> int:
            return a + b

        add.delay(1, 2)
    message = str(refused.value)
    assert "\n" not in message
    assert message.startswith(
        f"app 'shop': store_results=True needs a result store, and broker {nats_url} keeps "
        "no results of its own; set App(result_store=URL) with a URL of one of: "
    )
    assert queue not in watch.queues()  # nothing was published: the queue was never made


def test_ackwise_worker_refuses_the_app_in_the_producers_words(
    nats_url: str, tmp_path: Path
) -> None:
    (tmp_path / "nats_results_app.py").write_text(
        "from ackwise import App\n"
        f"app = App('shop', broker={nats_url!r}, store_results=True)\n"
        "@app.task(name='shop.add')\n"
        "def add(a, b):\n"
        "    return a + b\n"
    )
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tmp_path), *sys.path])}
    out = subprocess.run(
        [sys.executable, "-m", "ackwise", "worker", "nats_results_app:app", "--pool", "threads"],
        capture_output=True,
        text=True,
        env=env,
        cwd=tmp_path,
        timeout=60,
    )
    assert out.returncode == 2, out.stderr
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1, out.stderr
    assert lines[0].startswith(
        "ackwise: error: app 'shop': store_results=True needs a result store, and broker nats://"
    )


def test_a_result_store_of_another_scheme_serves_an_app_on_nats(
    nats_url: str, watch: Adapter, tmp_path: Path
) -> None:
    app = App(
        "shop",
        broker=nats_url,
        store_results=True,
        result_store=f"sqlite:///{tmp_path / 'results.db'}",
        default_queue=f"q-{uuid.uuid4().hex[:8]}",
    )

    @app.task(name="shop.add", track_started=True)
    def add(a: int, b: int) -> int:
        return a + b

    handle = add.delay(2, 3)
    with run_worker(app):
        assert handle.get(timeout=30) == 5
    app.close()
