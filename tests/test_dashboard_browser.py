"""The dashboard end to end in a real headless browser: Debian's chromium and chromedriver,
driven by selenium (no browser download at run time; ``make test`` installs them with apt-get).

Select them with ``-m browser`` (deselect with ``-m "not browser"``); under ``make test``
(``STREAMQ_REQUIRE_BROWSER=1``) a missing browser fails instead of skipping. Screenshots go
to ``$STREAMQ_ARTEFACTS/dashboard`` (default ``.streamq/artefacts/dashboard``)."""

from __future__ import annotations

import asyncio
import os
import shutil
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from dashboard_support import fill, registry, serve
from helpers import fast

from streamq import Worker
from streamq.dashboard import DashboardConfig, create_app

pytestmark = [pytest.mark.browser, pytest.mark.timeout(180)]

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
CHROMEDRIVER = shutil.which("chromedriver")
ARTEFACTS = Path(os.environ.get("STREAMQ_ARTEFACTS", ".streamq/artefacts")) / "dashboard"
WAIT_S = 20


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    if CHROMIUM is None or CHROMEDRIVER is None:
        if os.environ.get("STREAMQ_REQUIRE_BROWSER"):  # make test: a skip would hide a gap
            pytest.fail("chromium or chromedriver missing although make test installs them")
        pytest.skip("BROWSER TESTS NOT RUN: chromium and chromium-driver are not installed"
                    " (apt-get install -y chromium chromium-driver; make test does it)")
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    os.environ["SE_OFFLINE"] = "true"  # Selenium Manager must never download a browser
    opts = webdriver.ChromeOptions()
    opts.binary_location = CHROMIUM
    for arg in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
                "--window-size=1360,900", "--disable-extensions", "--no-first-run"):
        opts.add_argument(arg)
    driver = webdriver.Chrome(service=Service(executable_path=CHROMEDRIVER), options=opts)
    driver.set_page_load_timeout(30)
    ARTEFACTS.mkdir(parents=True, exist_ok=True)
    try:
        yield driver
    finally:
        driver.quit()


class WorkerThread:
    """A worker on its own event loop in a thread, so the browser test can stay blocking."""

    def __init__(self, url: str, qname: str, gate: threading.Event) -> None:
        self.url, self.qname, self.gate = url, qname, gate
        self.stop = threading.Event()
        self.thread = threading.Thread(target=lambda: asyncio.run(self._run()), daemon=True)

    async def _run(self) -> None:
        async with Worker(self.url, [self.qname], registry(self.gate), fast()):
            await asyncio.to_thread(self.stop.wait)

    def __enter__(self) -> WorkerThread:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop.set()
        self.thread.join(15)


def shot(driver: Any, name: str) -> None:
    driver.save_screenshot(str(ARTEFACTS / f"{name}.png"))


def wait_text(driver: Any, css: str, text: str) -> None:
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import WebDriverWait

    def has(d: Any) -> bool:
        try:
            return any(e.text.strip() == text for e in d.find_elements(By.CSS_SELECTOR, css))
        except Exception:  # noqa: BLE001 - an element replaced by a live refresh: look again
            return False

    WebDriverWait(driver, WAIT_S, poll_frequency=0.1).until(has)


@pytest.fixture
def dashboard(url: str, qname: str, browser: Any) -> Iterator[str]:
    app = create_app(url, config=DashboardConfig(queues=(qname,), poll_interval_s=0.25))
    browser.get("about:blank")
    browser.get_log("browser")  # drained: a test reads only its own page's console
    with serve(app) as base:
        try:
            yield base
        finally:  # leave the page before its server goes (its live requests would fail)
            browser.get("about:blank")


async def test_redrive_a_dead_job_and_watch_it_complete(browser: Any, dashboard: str,
                                                        url: str, qname: str) -> None:
    from selenium.webdriver.common.by import By

    gate = threading.Event()
    await fill(url, qname, registry(gate))
    d = browser
    d.get(f"{dashboard}/")
    assert "Queues" in d.title
    wait_text(d, f'[data-live="{qname}:dead"]', "4")
    shot(d, "overview")
    d.find_element(By.LINK_TEXT, qname).click()
    d.find_element(By.LINK_TEXT, "dead").click()
    wait_text(d, "td a", "b0")
    shot(d, "dead-letters")
    d.find_element(By.LINK_TEXT, "b0").click()
    wait_text(d, "#job-state", "failed")
    shot(d, "job-failed")
    d.execute_script("window.__sqMarker = 'no reload';")
    gate.set()  # the handler is fixed: the re-driven job succeeds
    with WorkerThread(url, qname, gate):
        d.find_element(By.CSS_SELECTOR, 'button[data-action="redrive"]').click()
        wait_text(d, "#flash .flash", "b0: redriven: 1")
        wait_text(d, "#job-state", "completed")
        assert d.execute_script("return window.__sqMarker") == "no reload"
        assert "Result" in d.page_source
        shot(d, "job-completed")
    logs = [e for e in d.get_log("browser") if e.get("level") == "SEVERE"]
    assert not logs, logs  # no CSP violation, no script error


async def test_pause_a_queue_from_its_page(browser: Any, dashboard: str, url: str,
                                           qname: str) -> None:
    from selenium.webdriver.common.by import By

    await fill(url, qname)
    d = browser
    d.get(f"{dashboard}/queue?q={qname}&tab=scheduled")
    wait_text(d, "td a", "s0")
    d.execute_script("window.__sqMarker = 'no reload';")
    d.find_element(By.CSS_SELECTOR, 'button[data-action="pause"]').click()
    wait_text(d, ".badge.paused", "PAUSED")
    assert d.execute_script("return window.__sqMarker") == "no reload"
    shot(d, "queue-paused")
    d.execute_cdp_cmd("Emulation.setEmulatedMedia", {"features": [
        {"name": "prefers-color-scheme", "value": "dark"}]})
    shot(d, "queue-paused-dark")
    d.execute_cdp_cmd("Emulation.setEmulatedMedia", {"features": []})
    d.get(f"{dashboard}/")
    wait_text(d, f'[data-live="{qname}:paused"]', "PAUSED")
    d.find_element(By.XPATH, f'//form[input[@name="q" and @value="{qname}"]]'
                             '/button[@data-action="resume"]').click()  # this queue's row
    wait_text(d, f'[data-live="{qname}:paused"]', "")
    logs = [e for e in d.get_log("browser") if e.get("level") == "SEVERE"]
    assert not logs, logs


async def test_charts_tab(browser: Any, dashboard: str, url: str, qname: str,
                          r: Any) -> None:
    """Six hours of minute buckets as workers write them (synthetic values), drawn."""
    import json
    import math

    from streamq import Keys

    k = Keys(qname)
    now_min = int(r.time()[0]) // 60
    buckets = {}
    for i in range(360):
        wave = 1 + math.sin(i / 30)
        buckets[str(now_min - i)] = json.dumps({
            "c": int(300 * wave) + 50, "f": int(12 * wave) % 9, "o": int(4000 * wave),
            "w": {"3": 100, "5": int(40 * wave) + 1, "7": 5},
            "r": {"6": 80, "8": int(30 * wave) + 1, "10": 2}})
    r.hset(k.series_minutes, mapping=buckets)
    r.hset(k.stats, "enqueued", 1)
    d = browser
    d.get(f"{dashboard}/queue?q={qname}&tab=charts")
    wait_text(d, "figcaption", "Throughput per min completed failed")
    assert len(d.find_elements("css selector", "svg.chart polyline")) >= 5
    d.set_window_size(1360, 1300)
    shot(d, "charts")
    d.set_window_size(1360, 900)


async def test_chart_windows_from_15_minutes(browser: Any, dashboard: str, url: str,
                                            qname: str, r: Any) -> None:
    """A new queue (a few busy minutes) opens on the 15-minute window, not as a sliver at the
    right edge of 6 hours; the axis reads 200k, not 2e+05; the other windows are a click."""
    import json

    from selenium.webdriver.common.by import By

    from streamq import Keys

    k = Keys(qname)
    now_min = int(r.time()[0]) // 60
    r.hset(k.series_minutes, mapping={
        str(now_min - 4): json.dumps({"c": 144721, "f": 12, "o": 1500, "w": {"9": 10}}),
        str(now_min - 1): json.dumps({"c": 90000, "f": 0, "o": 0, "w": {"5": 10}})})
    r.hset(k.stats, "enqueued", 1)
    d = browser
    d.get(f"{dashboard}/queue?q={qname}&tab=charts")
    wait_text(d, ".windows a.on", "15 min")
    ticks = [t.text for t in d.find_elements(By.CSS_SELECTOR, "svg.chart text.tick")]
    assert "200k" in ticks and "100k" in ticks and not any("e+" in t for t in ticks), ticks
    line = d.find_element(By.CSS_SELECTOR, "svg.chart polyline.s1").get_attribute("points")
    assert len(line.split()) == 15
    shot(d, "charts-15m")
    d.find_element(By.CSS_SELECTOR, '.windows a[data-range="1h"]').click()
    wait_text(d, ".windows a.on", "1 hour")
    line = d.find_element(By.CSS_SELECTOR, "svg.chart polyline.s1").get_attribute("points")
    assert len(line.split()) == 60
    d.find_element(By.CSS_SELECTOR, '.windows a[data-range="30d"]').click()
    wait_text(d, ".windows a.on", "30 days")
    logs = [e for e in d.get_log("browser") if e.get("level") == "SEVERE"]
    assert not logs, logs


async def test_cancel_asks_before_it_cancels(browser: Any, dashboard: str, url: str,
                                            qname: str) -> None:
    """A row's cancel button asks first: dismissed, nothing happens; accepted, cancelled."""
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support import expected_conditions as ec
    from selenium.webdriver.support.ui import WebDriverWait

    from streamq.admin import Admin

    await fill(url, qname)
    d = browser
    d.get(f"{dashboard}/queue?q={qname}&tab=ready")
    wait_text(d, "td a", "r0")
    button = 'form:has(input[name="id"][value="r0"]) button[data-action="cancel"]'
    d.find_element(By.CSS_SELECTOR, button).click()
    alert = WebDriverWait(d, WAIT_S).until(ec.alert_is_present())
    assert alert.text == "Cancel job r0? It will not run."
    alert.dismiss()
    admin = Admin.from_url(url)
    assert admin.job(qname, "r0").state == "queued"  # dismissed: nothing sent
    d.find_element(By.CSS_SELECTOR, button).click()
    WebDriverWait(d, WAIT_S).until(ec.alert_is_present()).accept()
    wait_text(d, "#flash .flash", "r0: cancelled")
    assert admin.job(qname, "r0").state == "cancelled"
    shot(d, "cancel-confirmed")


async def test_every_page_and_a_bulk_redrive(browser: Any, dashboard: str, url: str,
                                             qname: str) -> None:
    """Each tab, the confirmation that counts first, the bulk re-drive's live progress."""
    from selenium.webdriver.common.by import By

    await fill(url, qname)
    d = browser
    for tab in ("ready", "active", "scheduled", "retrying", "completed", "cancelled", "workers",
                "cron"):
        d.get(f"{dashboard}/queue?q={qname}&tab={tab}")
        wait_text(d, ".tabs a.on", tab)
        shot(d, f"tab-{tab}")
    d.get(f"{dashboard}/queue?q={qname}&tab=dead&type=bad")
    d.find_element(By.PARTIAL_LINK_TEXT, "re-drive all matching").click()
    wait_text(d, "button[data-action='redrive-all']", "re-drive 3")
    assert "3 dead jobs match" in d.find_element(By.CSS_SELECTOR, "p.count").text
    shot(d, "confirm-redrive-all")
    d.find_element(By.CSS_SELECTOR, "button[data-action='redrive-all']").click()
    wait_text(d, '[data-live="task:state"]', "done")
    assert "redriven: 3" in d.find_element(By.CSS_SELECTOR, '[data-live="task:outcome"]').text
    shot(d, "bulk-redrive-done")
    d.get(f"{dashboard}/job?q={qname}&id=nope")
    assert "404" in d.title
    shot(d, "not-found")


async def test_a_hidden_tab_closes_its_stream(browser: Any, url: str, qname: str) -> None:
    """One stream per visible tab; hiding the tab closes it, showing it opens it again."""
    from helpers import wait_until

    await fill(url, qname)
    app = create_app(url, config=DashboardConfig(queues=(qname,), poll_interval_s=0.25))
    hub = app.state.dashboard.hub
    topic = f"job {qname} b0"
    with serve(app) as base:
        d = browser
        d.get(f"{base}/job?q={qname}&id=b0")
        wait_until(lambda: len(hub.subs.get(topic, ())) == 1, what="the tab's stream")
        flip = ("Object.defineProperty(document, 'hidden', {value: %s, configurable: true});"
                " document.dispatchEvent(new Event('visibilitychange'));")
        d.execute_script(flip % "true")
        wait_until(lambda: topic not in hub.subs, what="the hidden tab's stream closed")
        d.execute_script(flip % "false")
        wait_until(lambda: len(hub.subs.get(topic, ())) == 1, what="the stream reopened")
        wait_text(d, "#job-state", "failed")


async def test_search_box_finds_jobs_by_a_declared_field(browser: Any, dashboard: str,
                                                         url: str, qname: str) -> None:
    """The overview's search box: a declared payload field and a state, newest first; the
    result links to the job (docs/search.md; the screenshot in docs/img/dashboard-search.png)."""
    from selenium.webdriver.common.by import By

    from streamq import Queue, QueueConfig, SearchConfig

    q = Queue.from_url(url, qname, config=QueueConfig(
        search=SearchConfig(fields={"invoice.send": ["customer_id"]})))
    for i in range(8):
        q.enqueue("invoice.send", {"customer_id": f"cus_{42 + i % 2}", "n": i},
                  job_id=f"inv-{i:02d}", group=f"tenant-{i % 3}", delay=3600 if i == 6 else None)
    q.cancel("inv-04")
    q.close()
    d = browser
    d.get(f"{dashboard}/")
    box = d.find_element(By.CSS_SELECTOR, "form.search input[name=s]")
    box.send_keys("customer_id:cus_42 type:invoice.send")
    d.find_element(By.CSS_SELECTOR, "form.search button").click()
    wait_text(d, "#search-results td a", "inv-06")
    rows = d.find_elements(By.CSS_SELECTOR, "#search-results tbody tr")
    assert [r.find_element(By.CSS_SELECTOR, "td a").text for r in rows] == [
        "inv-06", "inv-04", "inv-02", "inv-00"]  # newest first
    assert "checked via the field index" in d.find_element(By.ID, "search-meta").text
    shot(d, "search")
    d.find_element(By.LINK_TEXT, "inv-04").click()
    wait_text(d, "#job-state", "cancelled")
    logs = [e for e in d.get_log("browser") if e.get("level") == "SEVERE"]
    assert not logs, logs


async def test_flow_page_click_from_a_job_to_its_parent(browser: Any, dashboard: str,
                                                        url: str, qname: str) -> None:
    """A flow drawn as a tree (docs/dashboard.md#flows); from a dependency's job page, the
    job waiting for it is one click away."""
    from helpers import eventually, state
    from selenium.webdriver.common.by import By

    from streamq import Queue

    q = Queue.from_url(url, qname)
    try:
        q.enqueue_many([{"type": "ok", "payload": {"img": i}, "job_id": f"thumb-{i}"}
                        for i in range(3)])
        q.enqueue("ok", {"img": 3}, job_id="thumb-3", delay=3600)  # (scheduled: it blocks)
        q.enqueue("ok", None, job_id="index", depends_on=[f"thumb-{i}" for i in range(4)])
        q.enqueue("ok", None, job_id="notify", depends_on=["index"])
        async with Worker(url, [qname], registry(), fast()):
            await eventually(lambda: all(state(q, f"thumb-{i}") == "completed"
                                         for i in range(3)), 30)
    finally:
        q.close()
    d = browser
    d.get(f"{dashboard}/flow?q={qname}&id=notify")
    wait_text(d, "#job-state", "waiting")
    assert [e.get_attribute("data-job") for e in d.find_elements(
        By.CSS_SELECTOR, "#deps li[data-job]")] == ["index", "thumb-3", "thumb-0", "thumb-1",
                                                    "thumb-2"]
    shot(d, "flow")
    d.find_element(By.CSS_SELECTOR, '#deps li[data-job="thumb-3"] > a').click()  # its job page
    wait_text(d, "#job-state", "scheduled")
    d.find_element(By.CSS_SELECTOR, "#flow-parents td a").click()  # the job waiting for it
    wait_text(d, "h1", "index")
    wait_text(d, "#job-state", "waiting")
    logs = [e for e in d.get_log("browser") if e.get("level") == "SEVERE"]
    assert not logs, logs


@pytest.mark.cluster
async def test_workers_tab_shows_the_shards_on_a_cluster(browser: Any, redis_cluster: Any
                                                         ) -> None:
    """A sharded queue on the cluster: the workers tab's shard table, one row per shard, from
    CLUSTER SLOT-STATS or (Redis 7.0) CLUSTER COUNTKEYSINSLOT (docs/scaling.md#server-versions).
    """
    import uuid

    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import WebDriverWait

    from streamq import Queue, QueueConfig

    name, cfg = f"bs-{uuid.uuid4().hex[:8]}", QueueConfig(shards=3)
    with Queue.from_url(redis_cluster.url, name, cfg) as q:
        q.enqueue_many([{"type": "t", "job_id": f"j{i}"} for i in range(12)])
    app = create_app(redis_cluster.url, config=DashboardConfig(queues=(name,), queue_config=cfg))
    d = browser
    d.get("about:blank")
    d.get_log("browser")
    with serve(app) as base:
        try:
            d.get(f"{base}/queue?q={name}&tab=workers")
            WebDriverWait(d, WAIT_S, poll_frequency=0.1).until(
                lambda b: len(b.find_elements(By.CSS_SELECTOR, "#shard-slots tbody tr")) == 3)
            shards = [r.find_element(By.CSS_SELECTOR, "td").text
                      for r in d.find_elements(By.CSS_SELECTOR, "#shard-slots tbody tr")]
            assert shards == ["0", "1", "2"]
            shot(d, "queue-shards-cluster")
            logs = [e for e in d.get_log("browser") if e.get("level") == "SEVERE"]
            assert not logs, logs
        finally:
            d.get("about:blank")
