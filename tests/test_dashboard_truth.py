"""finish.lua notes recent completions in a capped list whatever the event kinds (#31): once
per call, safe to repeat, and nothing from an older worker's call."""

from __future__ import annotations

from typing import Any

import pytest
import redis
from helpers import started

from streamq import Queue, QueueConfig
from streamq._core.keys import GROUP, RECENT_KEEP
from streamq._core.scripts import SCRIPTS

pytestmark = pytest.mark.timeout(120)


def _finish_ok(r: redis.Redis, q: Queue, job_id: str, entry: str, token: str,
               recent: bool = True) -> list[bytes]:
    """finish.lua as today's worker calls it: group keys, marker and the recent list."""
    k = q.keys
    keys = [k.stream, k.delayed, k.dead, k.stats, k.events, k.job(job_id), *k.group_keys,
            k.finished("c1")] + ([k.recent] if recent else [])
    args: list[Any] = [GROUP, "0", 3600, 1000, "", 1, job_id, entry, token, "ok", b"42", 0, "",
                       QueueConfig().group_arg] + ([RECENT_KEEP] if recent else [])
    out: list[bytes] = SCRIPTS["finish"](r, keys, args)
    return out


def test_finish_notes_recent_completions_once_and_bounded(r: redis.Redis, url: str,
                                                          qname: str) -> None:
    q = Queue.from_url(url, qname)
    r.xgroup_create(q.keys.stream, GROUP, id="0", mkstream=True)
    entry, token = started(r, q, "j1")
    assert _finish_ok(r, q, "j1", entry, token) == [b"completed"]
    assert _finish_ok(r, q, "j1", entry, token) == [b"completed"]  # a repeat: reply lost
    items: Any = r.lrange(q.keys.recent, 0, -1)
    (item,) = items  # noted once
    at, _, jid = item.decode().partition(" ")
    assert jid == "j1" and at.isdigit()
    entry, token = started(r, q, "j2")  # an older worker (no list key): nothing noted
    assert _finish_ok(r, q, "j2", entry, token, recent=False) == [b"completed"]
    assert r.llen(q.keys.recent) == 1
