"""Upgrade without loss: records, stream entries and events written by the release before
compact records (layout 1; its scripts are in tests/fixtures/v1) keep working with today's
code: new workers run jobs an old producer enqueued, jobs an old worker had started are
reclaimed (or finished by that old worker), and readers accept both layouts."""

from __future__ import annotations

from typing import Any

import redis
from helpers import eventually, record, running
from v1 import v1_enqueue, v1_finish, v1_start

from streamq import Job, Queue, Registry
from streamq._core.keys import GROUP
from streamq.admin import Admin


async def test_new_code_drains_what_the_old_release_wrote(
        url: str, q: Queue, r: redis.Redis) -> None:
    k = q.keys
    ids = [f"old-{i}" for i in range(20)]
    assert v1_enqueue(r, k, [(j, "add", {"n": i}, 0) for i, j in enumerate(ids)]) == \
        [b"queued"] * 20
    assert v1_enqueue(r, k, [("old-later", "add", {"n": 100}, 50)]) == [b"scheduled"]
    assert record(r, k.job("old-0"))[b"state"] == b"queued"
    assert r.hget(k.job("old-0"), "state") == b"queued"  # layout 1 as it was written
    # an old worker starts three jobs; it finishes one itself while new code runs, and
    # dies with the other two in flight
    started = v1_start(r, k, "old-worker", 3)
    (e_kept, j_kept, t_kept), *lapsed = started
    # new readers see both layouts
    admin = Admin.from_url(url)
    info = admin.job(q.name, j_kept)
    admin.close()
    assert info.state == "active" and info.payload == {"n": 0} and info.owner == "old-worker"
    # a new producer's duplicate enqueue answers from the old record and leaves it alone
    dup = q.enqueue("add", {"n": 0}, job_id=j_kept)
    assert (dup.status, dup.state) == ("duplicate", "active")
    assert r.hget(k.job(j_kept), "state") == b"active"  # an old worker's: not rewritten

    reg = Registry()
    ran: list[str] = []

    @reg.handler("add")
    async def add(job: Job) -> int:
        ran.append(job.id)
        return int(job.payload["n"]) + 1

    # the old worker finishes its job after new code read and touched it
    assert v1_finish(r, k, j_kept, e_kept, t_kept, "1") == [b"completed"]
    async with running(url, q.name, reg, visibility_timeout_s=0.5, reclaim_interval_s=0.1):
        await eventually(lambda: all(record(r, k.job(j)).get(b"state") == b"completed"
                                     for j in [*ids, "old-later"]),
                         timeout_s=20, what="every old job completed")
    assert j_kept not in ran  # the old worker's own outcome stood
    assert {j for _, j, _ in lapsed} <= set(ran)  # reclaimed from the dead old worker
    for i, j in enumerate(ids):
        assert q.result(j, timeout=1) == i + 1
    assert q.result("old-later", timeout=1) == 101
    assert r.xlen(k.stream) == 0 and r.zcard(k.delayed) == 0
    pending: Any = r.xpending(k.stream, GROUP)
    assert pending["pending"] == 0
    # the records new code touched keep layout 1 (an old producer may wait for their result);
    # the old events stay readable
    assert r.hget(k.job("old-5"), "state") == b"completed" and r.hget(k.job("old-5"), "s") is None
    assert r.hget(k.job("old-5"), "result") == b"6"
    events: Any = r.xrange(k.events)
    assert {f[b"ev"] for _, f in events} >= {b"enqueued", b"started", b"reclaimed"}
    # a new producer's duplicate of an old completed job answers with its result
    dup = q.enqueue("add", job_id="old-3")
    assert (dup.status, dup.state, dup.result) == ("duplicate", "completed", 4)


def test_old_record_keeps_every_field_and_its_layout(q: Queue, r: redis.Redis, url: str) -> None:
    k = q.keys
    v1_enqueue(r, k, [("u1", "add", {"n": 7}, 60_000)])
    r.hset(k.job("u1"), mapping={"errors": '[{"attempt":1,"type":"E","t":5}]',
                                 "error": '{"type":"E","message":"m"}'})
    ttl_before = r.ttl(k.job("u1"))
    admin = Admin.from_url(url)
    before = admin.job(q.name, "u1")
    assert q.cancel("u1").cancelled  # cancel.lua cancels it in layout 1
    raw: Any = r.hgetall(k.job("u1"))
    assert b"s" not in raw and raw[b"state"] == b"cancelled" and raw[b"finished"]
    after = admin.job(q.name, "u1")
    admin.close()
    assert after.state == "cancelled" and after.payload == {"n": 7} == before.payload
    assert after.created_at == before.created_at and after.errors == before.errors
    assert after.error == before.error and after.type == "add"
    assert ttl_before == -1 and r.ttl(k.job("u1")) > 0
