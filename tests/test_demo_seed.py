"""``streamq demo --web`` opens on a queue with something to show: a week of history in the
charts, completed and dead-lettered jobs, jobs scheduled for later and cron entries."""

from __future__ import annotations

import asyncio
import json
import re
import threading
import time

import httpx
import pytest
from dashboard_support import serve

from streamq import AsyncQueue
from streamq._core.server import RedisServer
from streamq._core.timeseries import KEEP_MINUTES, decode
from streamq.admin import Admin
from streamq.cli import demo_seed
from streamq.cli.demo_panel import demo_app
from streamq.cli.demo_web import QUEUE

pytestmark = pytest.mark.timeout(240)


def test_the_history_ends_before_now_and_its_hours_add_up_its_minutes() -> None:
    now_ms = 1_795_923_123_456
    now_minute = now_ms // 60_000
    minutes, hours = demo_seed.history(now_ms)
    assert len(minutes) == KEEP_MINUTES - 1 and max(minutes) == now_minute - 1
    assert len(hours) == demo_seed.HISTORY_HOURS and max(hours) == now_minute // 60
    for field, raw in [*minutes.items(), *hours.items()]:
        assert decode(field, raw, 60_000) is not None
    points = {m: json.loads(v) for m, v in minutes.items()}
    for hour in range(min(minutes) // 60 + 1, now_minute // 60):  # hours wholly in minutes
        in_hour = [points[m] for m in range(hour * 60, hour * 60 + 60)]
        h = json.loads(hours[hour])
        assert h["c"] == sum(p["c"] for p in in_hour) > 0
        assert h["f"] == sum(p["f"] for p in in_hour)
    assert demo_seed.history(now_ms) == (minutes, hours)  # the same history every time


def test_the_web_demo_opens_on_a_full_queue() -> None:
    ready = threading.Event()
    with RedisServer() as server, serve(demo_app(server.url, on_ready=ready.set),
                                        lifespan="on") as base:
        assert ready.wait(180), "the seeded jobs did not run"
        admin = Admin.from_url(server.url)
        try:
            s = admin.stats(QUEUE)
            assert s.counters.get("completed", 0) >= demo_seed.JOBS
            assert s.counters.get("failed", 0) == s.dead == demo_seed.FAILING
            assert s.scheduled == demo_seed.SCHEDULED
            deadline = time.monotonic() + 60  # the scheduler publishes its entries
            while {c.name for c in admin.cron(QUEUE)} != {c.name for c in demo_seed.CRON}:
                assert time.monotonic() < deadline, admin.cron(QUEUE)
                time.sleep(0.2)
            minutes = admin.series(QUEUE)
            assert len(minutes) >= KEEP_MINUTES - 1 and sum(p.completed for p in minutes) > 0
            assert len(admin.series(QUEUE, hours=True)) >= demo_seed.HISTORY_HOURS
        finally:
            admin.close()
        with httpx.Client(base_url=base, timeout=30) as c:
            for window in ("15m", "1h", "6h", "1d", "7d"):
                page = c.get("/queue", params={"q": QUEUE, "tab": "charts", "range": window})
                assert page.status_code == 200
                lines = re.findall(r'<polyline class="[^"]*" points="([^"]*)"', page.text)
                assert lines and max(len(p.split()) for p in lines) > 10, window
            dead = c.get("/queue", params={"q": QUEUE, "tab": "dead"}).text
            assert "card declined" in dead and "mailbox full" in dead

        async def again() -> bool:  # a restart over the same server adds nothing
            async with AsyncQueue.from_url(server.url, QUEUE) as q:
                return await demo_seed.seed(q)

        assert asyncio.run(again()) is False
