"""``ackwise dashboard`` over HTTP (docs/dashboard.md): the pages against real brokers (SQLite,
Redis) and a real in-process worker; replay through the confirmation page; the CSRF token,
read-only mode and the access token; a real server process bound to a non-loopback address."""

from __future__ import annotations

import os
import re
import socket
import subprocess
import sys
import urllib.error
import urllib.request
import uuid
from pathlib import Path

import pytest

from ackwise import App
from ackwise.errors import ConfigurationError
from ackwise.testing import run_worker
from ackwise_conformance.brokers import missing_broker
from ackwise_conformance.helpers import eventually

pytest.importorskip("starlette")
pytest.importorskip("jinja2")
pytest.importorskip("httpx")

from starlette.testclient import TestClient

from ackwise.dashboard import create_app


@pytest.fixture(params=["sqlite", "redis"])
def broker(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path / 'q.db'}"
    url: str = request.getfixturevalue("shared_redis")("dash")
    return url


def _shop(broker: str, flag: Path) -> App:
    app = App("shop", broker=broker)

    @app.task(name="shop.add")
    def add(a: int, b: int) -> int:
        return a + b

    @app.task(name="shop.charge", autoretry_for=())
    def charge(order: int) -> None:
        if not flag.exists():
            raise ValueError(f"card declined for order {order}")
        flag.write_text(f"charged {order}")

    return app


def _ready(html: str, queue: str) -> int:
    row = re.search(rf'<tr data-queue="{queue}">.*?class="n ready">(\d+)<', html, re.S)
    assert row is not None, html
    return int(row.group(1))


def _csrf(html: str) -> str:
    found = re.search(r'name="csrf" value="([0-9a-f]+)"', html)
    assert found is not None, html
    return found.group(1)


def test_the_pages_follow_the_queue_and_a_dead_letter_is_replayed_after_confirming(
    broker: str, tmp_path: Path
) -> None:
    flag = tmp_path / "card-ok"
    app = _shop(broker, flag)
    add, charge = app.tasks["shop.add"], app.tasks["shop.charge"]
    for i in range(3):
        add.delay(i, 1)
    with TestClient(create_app(app)) as web:
        assert _ready(web.get("/").text, "default") == 3
        charge.delay(42)
        with run_worker(app) as w:
            w.join()
        page = web.get("/").text
        assert _ready(page, "default") == 0
        assert 'class="dead" href="/dead?queue=default">1<' in page
        dead = web.get("/dead").text
        [mid] = re.findall(r'<tr data-id="([0-9a-f]+)">', dead)
        assert "shop.charge" in dead and "card declined for order 42" in dead
        detail = web.get(f"/dead/default/{mid}").text
        assert "ValueError: card declined for order 42" in detail  # the traceback
        confirm = web.post(
            "/dead/confirm",
            data={"csrf": _csrf(dead), "action": "replay", "pick": f"default/{mid}"},
        )
        assert confirm.status_code == 200 and "Replay 1 dead letter(s)?" in confirm.text
        assert web.get("/dead").text.count("<tr data-id=") == 1  # nothing happened yet
        flag.touch()  # the card works now
        done = web.post(
            "/dead/act",
            data={"csrf": _csrf(confirm.text), "action": "replay", "confirmed": "yes",
                  "pick": f"default/{mid}"},
        )  # fmt: skip
        assert done.status_code == 200 and "replayed 1 dead letter(s)" in done.text
        with run_worker(app) as w:
            w.join()
        assert flag.read_text() == "charged 42"  # the replayed task ran
        assert "0 dead letter(s)" in web.get("/dead").text
    app.close()


def test_a_form_without_the_csrf_token_and_a_read_only_dashboard_change_nothing(
    tmp_path: Path,
) -> None:
    app = _shop(f"sqlite:///{tmp_path / 'q.db'}", tmp_path / "never")
    app.tasks["shop.charge"].delay(1)
    with run_worker(app) as w:
        w.join()
    with TestClient(create_app(app)) as web:
        [mid] = re.findall(r'<tr data-id="([0-9a-f]+)">', web.get("/dead").text)
        pick = {"action": "purge", "confirmed": "yes", "pick": f"default/{mid}"}
        refused = web.post("/dead/act", data={**pick, "csrf": "0" * 64})
        assert refused.status_code == 403 and "CSRF token" in refused.text
        assert web.post("/dead/act", data={**pick, "csrf": _csrf(web.get("/dead").text),
                                           "confirmed": "no"}).status_code == 403  # fmt: skip
    with TestClient(create_app(app, read_only=True)) as web:
        page = web.get("/dead").text
        assert "Purge selected" not in page and 'type="checkbox"' not in page
        refused = web.post("/dead/act", data={**pick, "csrf": _csrf(page)})
        assert refused.status_code == 403 and "read-only" in refused.text
    with TestClient(create_app(app)) as web:
        assert "1 dead letter(s)" in web.get("/dead").text  # still there
    app.close()


def test_with_a_token_every_request_needs_it(tmp_path: Path) -> None:
    app = App("t", broker=f"sqlite:///{tmp_path / 'q.db'}")
    with TestClient(create_app(app, token="s3cret")) as web:
        refused = web.get("/")
        assert refused.status_code == 401 and "Basic" in refused.headers["www-authenticate"]
        assert web.get("/", headers={"Authorization": "Bearer wrong"}).status_code == 401
        assert web.get("/", headers={"Authorization": "Bearer s3cret"}).status_code == 200
        assert web.get("/", auth=("anyone", "s3cret")).status_code == 200
    app.close()


def test_the_broker_password_is_never_shown() -> None:
    # RabbitMQ has no worker registry: the workers page says so without reaching the broker.
    app = App("t", broker="amqp://guest:s3cret-pw@127.0.0.1:5672/%2F")
    with TestClient(create_app(app)) as web:
        html = web.get("/workers").text
    assert "s3cret-pw" not in html and "127.0.0.1:5672" in html
    assert "No worker registry for this broker" in html
    app.close()


def test_binding_a_non_loopback_address_needs_a_token() -> None:
    from ackwise.cli._dashboard import cmd_dashboard

    class Args:
        app = "unused:app"
        host = "0.0.0.0"
        port = 0
        token = None
        read_only = False

    with pytest.raises(ConfigurationError, match="not loopback\\) needs a token"):
        cmd_dashboard(Args())  # type: ignore[arg-type]


@pytest.mark.slow
def test_a_dashboard_bound_to_every_address_refuses_a_request_without_its_token(
    tmp_path: Path,
) -> None:
    (tmp_path / "dash_app.py").write_text(
        f"from ackwise import App\napp = App('dash', broker='sqlite:///{tmp_path / 'q.db'}')\n"
    )
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    server = subprocess.Popen(
        [sys.executable, "-m", "ackwise", "dashboard", "dash_app:app", "--host", "0.0.0.0",
         "--port", str(port), "--token", "t0ken"],
        cwd=tmp_path, env={**os.environ, "PYTHONPATH": str(tmp_path)},
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
    )  # fmt: skip
    url = f"http://127.0.0.1:{port}/"

    def status(headers: dict[str, str]) -> int:
        try:
            with urllib.request.urlopen(urllib.request.Request(url, headers=headers), timeout=5):
                return 200
        except urllib.error.HTTPError as exc:
            return exc.code
        except OSError:
            return 0

    try:
        eventually(lambda: status({}) != 0, 30.0, description="the dashboard to listen")
        assert status({}) == 401
        assert status({"Authorization": "Bearer t0ken"}) == 200
    finally:
        server.terminate()
        server.wait(10)


def test_the_charts_count_what_the_workers_finished_between_samples() -> None:
    from ackwise import QueueStats, WorkerInfo
    from ackwise.dashboard.history import History, sparkline

    def worker(wid: str, by_queue: dict[str, list[int]]) -> WorkerInfo:
        return WorkerInfo(
            id=wid, host="h", pid=1, app="a", queues=["q"], pool="threads", concurrency=1,
            version="0", started_at=0.0, last_seen=0.0, by_queue=by_queue,
        )  # fmt: skip

    history = History()
    samples = [  # (depth of q, worker 1's [succeeded, failed] on q and r, worker 2's on q)
        (9, {"q": [0, 0]}, {"q": [0, 0]}),
        (4, {"q": [6, 1], "r": [2, 0]}, {"q": [3, 0]}),
        (0, {"q": [16, 1], "r": [2, 0]}, {"q": [13, 0]}),
    ]
    for depth, w1, w2 in samples:
        history.add([QueueStats("q", depth, 0, 1, 0, 0.0)], [worker("h:1", w1), worker("h:2", w2)])
    for sample, at in zip(history.samples, (0.0, 5.0, 10.0), strict=True):
        sample.at = at
    assert history.depth("q") == [10.0, 5.0, 1.0]
    assert history.throughput("q") == [2.0, 4.0]  # (6+1+3)/5, (10+10)/5
    assert history.throughput() == [2.4, 4.0]  # r's 2 in the first step
    assert history.failure_rate("q") == [0.1, 0.0]
    assert history.throughput("r") == [0.4, 0.0]
    assert sparkline([1.0]) == "" and "<polyline" in sparkline([0.0, 2.0, 1.0])


def test_the_queues_page_on_rabbitmq_shows_the_depth() -> None:
    # RabbitMQ cannot list its queues (no management plugin): the page shows the app's own.
    try:
        socket.create_connection(("127.0.0.1", 5672), timeout=1).close()
    except OSError:
        missing_broker("RabbitMQ is not answering on 127.0.0.1:5672")
    queue = f"dash-{uuid.uuid4().hex[:8]}"
    app = App("t", broker="amqp://guest:guest@127.0.0.1:5672/%2F", default_queue=queue)

    @app.task(name="t")
    def t() -> None: ...

    t.delay()
    t.delay()
    try:
        with TestClient(create_app(app)) as web:
            eventually(lambda: _ready(web.get("/").text, queue) == 2, 10.0, description="2")
    finally:
        adapter = app.adapter()
        adapter.open()
        adapter.delete_queue(queue)
        adapter.close()
        app.close()


def _row(html: str, queue: str) -> str:
    row = re.search(rf'<tr data-queue="{queue}">(.*?)</tr>', html, re.S)
    assert row is not None, html
    return row.group(1)


def test_on_rabbitmq_the_figures_it_cannot_report_read_a_dash_with_the_reason() -> None:
    # The shared node has no management plugin: RabbitMQ counts only the asking connection's
    # unacknowledged messages, and reports no age; `ackwise stats` says n/a for both.
    try:
        socket.create_connection(("127.0.0.1", 5672), timeout=1).close()
    except OSError:
        missing_broker("RabbitMQ is not answering on 127.0.0.1:5672")
    queue = f"dash-{uuid.uuid4().hex[:8]}"
    app = App("t", broker="amqp://guest:guest@127.0.0.1:5672/%2F", default_queue=queue)

    @app.task(name="t")
    def t() -> None: ...

    for _ in range(7):
        t.delay()
    try:
        with TestClient(create_app(app)) as web:

            def seven_ready() -> str | None:
                html = web.get("/").text
                return html if _ready(html, queue) == 7 else None

            html = eventually(seven_ready, 10.0, description="7 ready")
        row = _row(html, queue)
        in_flight = re.search(r'<td class="n in-flight unknown" title="([^"]+)">(.*?)</td>', row)
        oldest = re.search(r'<td class="oldest unknown" title="([^"]+)">(.*?)</td>', row)
        assert in_flight and oldest, row
        assert in_flight.group(2) == "—" and "management plugin" in in_flight.group(1)
        assert oldest.group(2) == "—" and "oldest message" in oldest.group(1)
        assert "0.0s" not in row
        note = re.search(r'<p id="unknown" class="muted">(.*?)</p>', html, re.S)
        assert note is not None, html
        assert "not shown as 0" in note.group(1)
        assert "the depth chart counts the ready messages only" in note.group(1)
        assert 'title="ready (in flight unknown)">depth<' in html
    finally:
        adapter = app.adapter()
        adapter.open()
        adapter.delete_queue(queue)
        adapter.close()
        app.close()


def test_a_broker_that_reports_every_figure_shows_them_all(tmp_path: Path) -> None:
    app = App("t", broker=f"sqlite:///{tmp_path / 'q.db'}")

    @app.task(name="t")
    def t() -> None: ...

    t.delay()
    with TestClient(create_app(app)) as web:
        html = web.get("/").text
    row = _row(html, "default")
    assert '<td class="n in-flight">0</td>' in row and re.search(r'class="oldest">\d+\.\ds<', row)
    assert "—" not in row and 'id="unknown"' not in html
    assert 'title="ready + in flight">depth<' in html
    app.close()


def test_the_depth_chart_counts_an_unknown_in_flight_as_nothing() -> None:
    from ackwise import QueueStats
    from ackwise.dashboard.history import History

    known, blind = History(), History()
    for ready in (7, 5):
        stats = [QueueStats("q", ready, 0, 3, 0, 0.0)]
        known.add(stats, None)
        blind.add(stats, None, {"in_flight": "the broker cannot tell"})
    assert known.depth("q") == [10.0, 8.0]
    assert blind.depth("q") == [7.0, 5.0]
