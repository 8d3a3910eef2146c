"""``streamq demo --web``: the demo panel's actions over HTTP, and in a real browser a pool
with a hang rate whose hung jobs come back."""

from __future__ import annotations

import re
import time
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
import redis
from dashboard_support import csrf_of, serve
from test_dashboard_browser import browser, shot, wait_text  # noqa: F401 - the fixture

from streamq import Keys
from streamq._core.server import RedisServer
from streamq.cli.demo_panel import demo_app
from streamq.cli.demo_web import QUEUE

pytestmark = pytest.mark.timeout(180)


@pytest.fixture
def demo() -> Iterator[tuple[str, RedisServer]]:
    """The demo on a server of its own (its queue name is fixed)."""
    with RedisServer() as server, serve(demo_app(server.url, seeded=False), lifespan="on") as base:
        yield base, server


def _stats(server: RedisServer) -> dict[bytes, bytes]:
    got: Any = redis.Redis.from_url(server.url).hgetall(Keys(QUEUE).stats)
    return dict(got)


def test_panel_enqueues_resizes_and_reclaims(demo: tuple[str, RedisServer]) -> None:
    base, server = demo
    with httpx.Client(base_url=base, timeout=10) as c:
        page = c.get("/demo")
        assert page.status_code == 200 and "Worker pool" in page.text
        token = csrf_of(page.text)
        assert c.post("/demo/enqueue", data={"kind": "mix", "count": "40"}).status_code == 403
        resp = c.post("/demo/enqueue", data={"csrf": token, "kind": "mix", "count": "40"})
        assert resp.status_code == 200 and "enqueued 40 mix jobs" in resp.text
        for bad in ({"kind": "rm -rf", "count": "1"}, {"kind": "mix", "count": "999999"},
                    {"kind": "mix", "count": "x"}):
            assert c.post("/demo/enqueue", data={"csrf": token, **bad}).status_code == 400
        resp = c.post("/demo/pool", data={"csrf": token, "size": "1", "latency_ms": "10",
                                          "failure": "0", "hang": "0"})
        assert "pool: 1 worker processes" in resp.text
        deadline = time.monotonic() + 60
        while int(_stats(server).get(b"completed", 0)) < 40:
            assert time.monotonic() < deadline, _stats(server)
            time.sleep(0.2)
        resp = c.post("/demo/reclaim", data={"csrf": token})
        assert re.search(r"reclaimed \d+ jobs", resp.text)
        assert c.post("/demo/pool", data={"csrf": token, "size": "99", "latency_ms": "1",
                                          "failure": "0", "hang": "0"}).status_code == 400
        assert c.get("/").status_code == 200 and "demo panel" in c.get("/").text


@pytest.mark.browser
def test_hung_workers_jobs_come_back(browser: Any, demo: tuple[str, RedisServer]) -> None:  # noqa: F811
    from selenium.webdriver.common.by import By

    base, server = demo
    d = browser
    d.get(f"{base}/demo")
    for name, value in (("size", "3"), ("latency_ms", "50"), ("failure", "0"), ("hang", "20")):
        field = d.find_element(By.NAME, name)
        field.clear()
        field.send_keys(value)
    d.find_element(By.CSS_SELECTOR, 'button[data-action="demo-pool"]').click()
    wait_text(d, "#flash .flash", "pool: 3 worker processes")
    count = d.find_element(By.NAME, "count")
    count.clear()
    count.send_keys("30")
    d.find_element(By.CSS_SELECTOR, 'button[data-action="demo-enqueue"]').click()
    wait_text(d, "#flash .flash", "enqueued 30 mix jobs")
    deadline = time.monotonic() + 120
    while True:
        s = _stats(server)
        settled = int(s.get(b"completed", 0)) + int(s.get(b"failed", 0))
        if settled == 30 and int(s.get(b"reclaimed", 0)) >= 1:
            break
        assert time.monotonic() < deadline, s
        time.sleep(0.5)
    shot(d, "demo-panel")
    d.find_element(By.CSS_SELECTOR, 'button[data-action="demo-reclaim"]').click()
    wait_text(d, '[data-live="demo:ready"]', "0")
