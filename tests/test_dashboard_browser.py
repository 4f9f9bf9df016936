"""The dashboard in a real browser (Debian's chromium, driven by Selenium through its
chromedriver) against a real ``ackwise dashboard`` server and real workers, on SQLite and on
Redis (docs/dashboard.md): a queue's depth changes, a dead letter appears, replay is clicked
and confirmed, and the task runs; on RabbitMQ without its management plugin, the figures it
cannot report read "—" with the reason.  Every page's screenshot is saved; with
``ACKWISE_UPDATE_SCREENSHOTS=1`` the SQLite run writes them to docs/img/ (committed).  The
pages render and page through 100 queues and 10,000 dead letters; how fast they load is
bench/dashboard.py's to measure, not a test's."""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from ackwise import App
from ackwise.spi import Outgoing, QueueSpec
from ackwise.testing import run_worker
from ackwise_conformance.brokers import missing_broker
from ackwise_conformance.helpers import eventually

webdriver = pytest.importorskip("selenium.webdriver")
from selenium.webdriver.common.by import By  # noqa: E402
from selenium.webdriver.support import expected_conditions  # noqa: E402
from selenium.webdriver.support.wait import WebDriverWait  # noqa: E402

pytestmark = pytest.mark.slow

DOCS_IMG = Path(__file__).parent.parent / "docs" / "img"
CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
CHROMEDRIVER = shutil.which("chromedriver") or "/usr/bin/chromedriver"

APP_MODULE = """
import os
from pathlib import Path
from ackwise import App

app = App(
    "shop",
    broker=os.environ["DASH_TEST_BROKER"],
    default_queue=os.environ.get("DASH_TEST_QUEUE", "default"),
)
FLAG = Path(os.environ["DASH_TEST_FLAG"])


@app.task(name="shop.add")
def add(a, b):
    return a + b


@app.task(name="shop.charge", autoretry_for=())
def charge(order):
    if not FLAG.exists():
        raise ValueError(f"card declined for order {order}")
    FLAG.write_text(f"charged {order}")
"""


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    if not (Path(CHROMIUM).exists() and Path(CHROMEDRIVER).exists()):
        missing_broker("no chromium and chromedriver: apt-get install chromium chromium-driver")
    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for flag in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--disable-gpu",
                 "--window-size=1280,900"):  # fmt: skip
        options.add_argument(flag)
    driver = webdriver.Chrome(options=options, service=webdriver.ChromeService(CHROMEDRIVER))
    driver.set_page_load_timeout(30)
    yield driver
    driver.quit()


@pytest.fixture(params=["sqlite", "redis"])
def broker(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path / 'q.db'}"
    url: str = request.getfixturevalue("shared_redis")("dashb")
    return url


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class Dashboard:
    """A real ``ackwise dashboard`` process on a free port."""

    def __init__(self, tmp_path: Path, broker: str, flag: Path, queue: str = "default") -> None:
        (tmp_path / "dash_shop.py").write_text(APP_MODULE)
        self.env = {
            **os.environ,
            "PYTHONPATH": str(tmp_path),
            "DASH_TEST_BROKER": broker,
            "DASH_TEST_FLAG": str(flag),
            "DASH_TEST_QUEUE": queue,
        }
        self.port = _free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "ackwise", "dashboard", "dash_shop:app", "--port",
             str(self.port)],
            cwd=tmp_path, env=self.env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
        )  # fmt: skip

        def listening() -> bool:
            try:
                socket.create_connection(("127.0.0.1", self.port), timeout=0.5).close()
            except OSError:
                assert self.proc.poll() is None, self.proc.communicate()[1].decode()
                return False
            return True

        eventually(listening, 30.0, description="the dashboard to listen")

    def stop(self) -> None:
        self.proc.terminate()
        self.proc.wait(10)


def _shop(broker: str, flag: Path, queue: str = "default") -> App:
    os.environ["DASH_TEST_BROKER"], os.environ["DASH_TEST_FLAG"] = broker, str(flag)
    os.environ["DASH_TEST_QUEUE"] = queue
    namespace: dict[str, Any] = {"__name__": "dash_shop_here"}
    exec(compile(APP_MODULE, "dash_shop", "exec"), namespace)  # the module's own text
    app: App = namespace["app"]
    return app


def _find(driver: Any, by: str, what: str) -> Any:
    """The element, once the page that follows a click has loaded it."""
    return WebDriverWait(driver, 15).until(
        expected_conditions.presence_of_element_located((by, what))
    )


def _ready(driver: Any, queue: str) -> int:
    cell = driver.find_element(By.CSS_SELECTOR, f'tr[data-queue="{queue}"] td.ready')
    return int(cell.text)


def _shoot(driver: Any, tmp_path: Path, name: str, keep: bool) -> None:
    path = tmp_path / f"dashboard-{name}.png"
    assert driver.save_screenshot(str(path)), name
    if keep:
        DOCS_IMG.mkdir(exist_ok=True)
        shutil.copyfile(path, DOCS_IMG / path.name)


def test_depth_dead_letter_replay_and_run_in_the_browser(
    browser: Any, broker: str, tmp_path: Path
) -> None:
    flag = tmp_path / "card-ok"
    keep = broker.startswith("sqlite") and os.environ.get("ACKWISE_UPDATE_SCREENSHOTS") == "1"
    dash = Dashboard(tmp_path, broker, flag)
    shop = _shop(broker, flag)  # the same tasks as the dashboard's module, for this process
    try:
        for i in range(5):
            shop.tasks["shop.add"].delay(i, 1)
        browser.get(dash.url + "/")
        assert _ready(browser, "default") == 5
        _shoot(browser, tmp_path, "queues", keep)
        shop.tasks["shop.charge"].delay(42)
        with run_worker(shop) as w:
            w.join()

            def drained() -> bool:
                browser.refresh()
                return _ready(browser, "default") == 0

            eventually(drained, 30.0, description="the page to show the drained queue")
            browser.get(dash.url + "/workers")
            assert browser.find_element(By.CSS_SELECTOR, "#workers td.status-running")
            _shoot(browser, tmp_path, "workers", keep)
        browser.get(dash.url + "/dead")
        row = browser.find_element(By.CSS_SELECTOR, "#dead tr[data-id]")
        assert "shop.charge" in row.text and "card declined for order 42" in row.text
        _shoot(browser, tmp_path, "dead-letters", keep)
        row.find_element(By.TAG_NAME, "a").click()
        assert "ValueError: card declined for order 42" in _find(browser, By.TAG_NAME, "pre").text
        _shoot(browser, tmp_path, "dead-letter", keep)
        browser.get(dash.url + "/dead")
        _find(browser, By.CSS_SELECTOR, "#dead tr[data-id] input[type=checkbox]").click()
        browser.find_element(By.CSS_SELECTOR, "button[value=replay]").click()
        assert "Replay 1 dead letter(s)?" in _find(browser, By.ID, "confirm-title").text
        _shoot(browser, tmp_path, "confirm", keep)
        flag.touch()  # the card works now
        _find(browser, By.ID, "confirm").click()
        assert "replayed 1 dead letter(s)" in _find(browser, By.ID, "done").text
        with run_worker(shop) as w:
            w.join()
        assert flag.read_text() == "charged 42"
        browser.refresh()
        assert "0 dead letter(s)" in browser.find_element(By.ID, "count").text
    finally:
        dash.stop()
        shop.close()


def test_a_figure_rabbitmq_cannot_report_reads_a_dash_with_its_reason_in_the_browser(
    browser: Any, tmp_path: Path
) -> None:
    # The shared node runs without its management plugin: no in-flight count of the workers'
    # deliveries, no age of the oldest message (`ackwise stats` says n/a for both).
    try:
        socket.create_connection(("127.0.0.1", 5672), timeout=1).close()
    except OSError:
        missing_broker("RabbitMQ is not answering on 127.0.0.1:5672")
    broker = "amqp://guest:guest@127.0.0.1:5672/%2F"
    queue = f"dashb-{uuid.uuid4().hex[:8]}"
    shop = _shop(broker, tmp_path / "unused", queue)
    dash = Dashboard(tmp_path, broker, tmp_path / "unused", queue)
    try:
        for i in range(7):
            shop.tasks["shop.add"].delay(i, 1)

        def seven() -> bool:
            browser.get(dash.url + "/")
            return _ready(browser, queue) == 7

        eventually(seven, 30.0, description="the page to show 7 ready")
        row = f'tr[data-queue="{queue}"]'
        in_flight = browser.find_element(By.CSS_SELECTOR, f"{row} td.in-flight")
        oldest = browser.find_element(By.CSS_SELECTOR, f"{row} td.oldest")
        assert (in_flight.text, oldest.text) == ("—", "—")
        assert "management plugin" in in_flight.get_attribute("title")
        assert "oldest message" in oldest.get_attribute("title")
        note = browser.find_element(By.ID, "unknown")
        assert note.is_displayed()
        assert "not shown as 0" in note.text
        assert "the depth chart counts the ready messages only" in note.text
        _shoot(browser, tmp_path, "queues-rabbitmq", keep=False)
    finally:
        dash.stop()
        adapter = shop.adapter()
        adapter.open()
        adapter.delete_queue(queue)
        adapter.close()
        shop.close()


def _shown(driver: Any, rows: str, attribute: str) -> list[str]:
    """The ``data-…`` attribute of every row, read in one script: the queues page's own
    refresh replaces its rows while Selenium would read them one by one."""
    return list(
        driver.execute_script(
            f"return [...document.querySelectorAll('{rows}')].map(r => r.dataset.{attribute})"
        )
    )


def test_the_pages_show_and_page_through_100_queues_and_10000_dead_letters(
    browser: Any, tmp_path: Path
) -> None:
    broker = f"sqlite:///{tmp_path / 'q.db'}"
    app = App("big", broker=broker)
    adapter = app.adapter()
    adapter.open()
    queues = [f"q{n:03d}" for n in range(100)]
    for q in queues:
        adapter.declare(QueueSpec(q))
        adapter.publish_dead(
            q,
            [Outgoing(uuid.uuid4().hex, b'{"v":1}') for _ in range(100)],
            reason="failed",
        )
    adapter.close()
    dash = Dashboard(tmp_path, broker, tmp_path / "unused")
    try:
        browser.get(dash.url + "/")
        shown = _shown(browser, "tr[data-queue]", "queue")
        assert set(queues) <= set(shown), sorted(set(queues) - set(shown))
        browser.get(dash.url + "/dead")
        assert browser.find_element(By.ID, "count").text == "10000 dead letter(s), page 1 of 200"
        first = _shown(browser, "#dead tr[data-id]", "id")
        assert len(first) == 50
        browser.find_element(By.LINK_TEXT, "older →").click()
        WebDriverWait(browser, 15).until(
            expected_conditions.text_to_be_present_in_element((By.ID, "count"), "page 2 of 200")
        )
        second = _shown(browser, "#dead tr[data-id]", "id")
        assert len(second) == 50 and not set(first) & set(second)
        browser.get(dash.url + "/dead?page=200")
        assert browser.find_element(By.ID, "count").text == "10000 dead letter(s), page 200 of 200"
        assert len(_shown(browser, "#dead tr[data-id]", "id")) == 50
        assert browser.find_elements(By.LINK_TEXT, "← newer")
        assert not browser.find_elements(By.LINK_TEXT, "older →")
    finally:
        dash.stop()
        app.close()
