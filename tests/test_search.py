"""Job search (docs/search.md) against a real server: each filter, across queues and shards,
cursor paging, the scan bound, expired records, a queue from before search, bad filters.

Each test uses a key prefix of its own, so the queue registry it searches holds only its
queues (the session's server is shared)."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from typing import Any

import pytest
import redis
from helpers import eventually, fast, wait_until

from streamq import (
    Dedup,
    Fail,
    InvalidSearch,
    Job,
    JobSpec,
    Queue,
    QueueConfig,
    Registry,
    SearchConfig,
    Worker,
    chain,
)
from streamq._core.keys import Keys
from streamq.admin import Admin, AsyncAdmin

FIELDS = SearchConfig(fields={"email.send": ["customer_id", "to.domain"]})


@pytest.fixture
def prefix(qname: str) -> str:
    return f"p{qname}"


@pytest.fixture
def admin(url: str, prefix: str) -> Iterator[Admin]:
    a = Admin.from_url(url, QueueConfig(key_prefix=prefix))
    yield a
    a.close()


def queue(url: str, name: str, prefix: str, **cfg: object) -> Queue:
    return Queue.from_url(url, name, config=QueueConfig(key_prefix=prefix, **cfg))  # type: ignore[arg-type]


def all_pages(admin: Admin, limit: int, **flt: object) -> list[tuple[str, str, int]]:
    out: list[tuple[str, str, int]] = []
    cursor = None
    while True:
        page = admin.find(limit=limit, cursor=cursor, **flt)  # type: ignore[arg-type]
        out.extend((h.queue, h.job_id, h.at_ms) for h in page.items)
        cursor = page.cursor
        if cursor is None:
            return out


def test_each_filter_on_a_sharded_queue(url: str, prefix: str, admin: Admin, r: redis.Redis
                                        ) -> None:
    q = queue(url, "mail", prefix, shards=3, search=FIELDS)
    ids = [q.enqueue("email.send", {"customer_id": i % 4, "to": {"domain": f"d{i % 2}.io"}},
                     group=f"tenant-{i % 3}").job_id for i in range(24)]
    other = q.enqueue_many([{"type": "report", "payload": {"n": i}} for i in range(6)])
    later = q.enqueue("email.send", {"customer_id": 99}, delay=3600).job_id

    def got(**flt: object) -> set[str]:
        hits = admin.find(limit=100, **flt).items  # type: ignore[arg-type]
        times = [h.at_ms for h in hits]
        assert times == sorted(times, reverse=True)  # newest first
        assert len({h.job_id for h in hits}) == len(hits)
        return {h.job_id for h in hits}

    assert got(type="email.send") == {later, *ids}
    assert got(type="report") == {o.job_id for o in other}
    assert got(group="tenant-1") == {j for i, j in enumerate(ids) if i % 3 == 1}
    assert got(fields={"customer_id": "2"}) == {j for i, j in enumerate(ids) if i % 4 == 2}
    assert got(fields={"to.domain": "d1.io", "customer_id": "3"}) == {
        j for i, j in enumerate(ids) if i % 2 == 1 and i % 4 == 3}
    assert got(type="email.send", fields={"customer_id": "99"}) == {later}
    assert got(state="scheduled") == {later}
    assert got(group="tenant-1", type="report") == set()
    assert got(type="report", state="queued") == {o.job_id for o in other}
    assert got(group="tenant-2", state="queued") == {j for i, j in enumerate(ids) if i % 3 == 2}
    assert got(id=ids[7]) == {ids[7]}
    assert ids[7] in got(id_prefix=ids[7][:3])
    assert all(j.startswith(ids[7][:3]) for j in got(id_prefix=ids[7][:3]))
    hits = admin.find(type="email.send", limit=100).items
    mid = hits[10].at_ms
    assert all(h.at_ms <= mid for h in admin.find(until_ms=mid, limit=100).items)
    assert hits[10].job_id in got(until_ms=mid)
    assert all(h.at_ms >= mid for h in admin.find(since_ms=mid, limit=100).items)
    assert hits[10].job_id in got(since_ms=mid, type="email.send")
    first = admin.find(id=ids[0]).items[0]
    assert (first.queue, first.type, first.state, first.group) == (
        "mail", "email.send", "queued", "tenant-0")
    # the index is per shard: every shard has its own time index
    assert sum(r.zcard(Keys("mail", prefix, s).ix_all) for s in range(3)) == 31


async def test_error_filters_find_dead_letters(url: str, prefix: str, admin: Admin) -> None:
    reg = Registry()

    @reg.handler("charge")
    async def charge(job: Job) -> None:
        if job.payload["card"] == "bad":
            raise Fail("card declined by issuer")
        if job.payload["card"] == "slow":
            raise TimeoutError("gateway timed out")

    q = queue(url, "pay", prefix, search=SearchConfig())
    bad = q.enqueue("charge", {"card": "bad"}, max_attempts=1).job_id
    slow = q.enqueue("charge", {"card": "slow"}, max_attempts=1).job_id
    good = q.enqueue("charge", {"card": "ok"}).job_id
    async with Worker(url, ["pay"], reg, fast(), QueueConfig(key_prefix=prefix)):
        await eventually(lambda: {h.job_id for h in admin.find(state="failed").items}
                         == {bad, slow} and admin.find(id=good).items[0].state == "completed",
                         30, "two dead letters and one completed job")
    assert [h.job_id for h in admin.find(error="DECLINED").items] == [bad]
    hit = admin.find(error_type="TimeoutError").items
    assert [h.job_id for h in hit] == [slow] and "timed out" in hit[0].error
    assert admin.find(error="declined", type="other").items == []
    # text only in the record's error (the dead letter says "attempts exhausted")
    assert [h.job_id for h in admin.find(error="GATEWAY timed").items] == [slow]
    # one text across the parts: '<error type> <reason> <message>'
    assert [h.job_id for h in admin.find(error="exhausted gateway").items] == [slow]
    assert [h.job_id for h in admin.find(error="timeouterror attempts").items] == [slow]
    assert [h.job_id for h in admin.find(error="gateway", error_type="TimeoutError").items
            ] == [slow]
    assert admin.find(error="gateway", error_type="Fail").items == []
    assert [h.job_id for h in admin.find(state="completed").items] == [good]


def test_across_queues_and_shards_pages_without_duplicates(url: str, prefix: str,
                                                           admin: Admin) -> None:
    a = queue(url, "a", prefix, shards=4, search=SearchConfig())
    b = queue(url, "b", prefix, search=SearchConfig())
    want: set[str] = set()
    for _ in range(5):  # bulk calls: many jobs share one millisecond (ties across sources)
        want |= {r.job_id for r in a.enqueue_many([{"type": "x"}] * 30)}
        want |= {r.job_id for r in b.enqueue_many([{"type": "x"}] * 7)}
    seen = all_pages(admin, 9)
    assert len(seen) == len(want) == 185
    assert {j for _, j, _ in seen} == want  # every job once
    assert [t for _, _, t in seen] == sorted((t for _, _, t in seen), reverse=True)
    assert {qn for qn, _, _ in seen} == {"a", "b"}
    # one queue only
    assert {qn for qn, _, _ in all_pages(admin, 50, queue="b")} == {"b"}


def test_bound_is_reported_and_the_cursor_continues(url: str, prefix: str, admin: Admin
                                                    ) -> None:
    q = queue(url, "big", prefix, search=SearchConfig())
    q.enqueue_many([{"type": "common", "delay": 3600} for _ in range(300)])
    rare = q.enqueue("common", {}).job_id  # the newest queued one; then 300 older scheduled
    q.enqueue_many([{"type": "common", "delay": 3600} for _ in range(300)])
    page = admin.find(type="common", state="queued", max_scan=100, limit=10)
    assert page.items == [] and page.bound_hit and page.scanned == 100
    assert page.source == "type"
    found, cursor, scanned = [], page.cursor, page.scanned
    while cursor is not None:
        page = admin.find(type="common", state="queued", max_scan=100, limit=10,
                          cursor=cursor)
        found += [h.job_id for h in page.items]
        scanned += page.scanned
        cursor = page.cursor
    assert found == [rare] and scanned == 601


def test_a_state_with_its_own_set_answers_from_it(url: str, prefix: str, admin: Admin
                                                  ) -> None:
    """scheduled/retrying read the delayed set, not 10,000 records of the time index: a rare
    scheduled job among many queued ones is found at once, with every other filter, paged
    newest first by enqueue time."""
    q = queue(url, "sched", prefix, shards=2, search=FIELDS)
    q.enqueue_many([{"type": "email.send", "payload": {"customer_id": 1}}
                    for _ in range(400)])
    later = [q.enqueue("email.send", {"customer_id": i % 2}, delay=3600 + i,
                       group=f"g{i % 2}").job_id for i in range(5)]
    q.enqueue_many([{"type": "email.send", "payload": {"customer_id": 1}}
                    for _ in range(400)])
    page = admin.find(state="scheduled", max_scan=100, limit=10)
    assert page.source == "state" and not page.bound_hit and page.cursor is None
    assert {h.job_id for h in page.items} == set(later)
    times = [h.at_ms for h in page.items]
    assert times == sorted(times, reverse=True)  # newest enqueued first
    assert page.scanned == 5 and all(h.state == "scheduled" for h in page.items)
    assert [h[1] for h in all_pages(admin, 2, state="scheduled")] == [
        h.job_id for h in page.items]
    assert {h.job_id for h in admin.find(state="scheduled", group="g1").items} == {
        later[1], later[3]}
    got = admin.find(state="scheduled", fields={"customer_id": "0"}, max_scan=100)
    assert {h.job_id for h in got.items} == {later[0], later[2], later[4]}
    assert not got.bound_hit
    at = admin.find(id=later[2]).items[0].at_ms
    assert {h.job_id for h in admin.find(state="scheduled", since_ms=at).items} >= {
        later[2], later[3], later[4]}
    assert admin.find(state="retrying").items == []
    assert admin.find(state="waiting", type="email.send").items == []


def test_jobs_that_wait_for_dependencies_are_indexed(url: str, prefix: str, admin: Admin
                                                    ) -> None:
    """depends_on and flows write the same index entries as enqueue (wait.lua), once."""
    q = queue(url, "deps", prefix, search=FIELDS)
    first = q.enqueue("email.send", {"customer_id": 7}).job_id
    after = q.enqueue("email.send", {"customer_id": 7}, depends_on=[first], job_id="after1")
    again = q.enqueue("email.send", {"customer_id": 7}, depends_on=[first], job_id="after1")
    assert (after.status, again.status) == ("waiting", "duplicate")
    out = q.enqueue_flow(chain(JobSpec("email.send", {"customer_id": 8}),
                               JobSpec("report", {"customer_id": 8})), flow_id="fl")
    waiting = {"after1", out.job_ids[1]}
    assert {h.job_id for h in admin.find(state="waiting").items} == waiting
    assert admin.find(state="waiting").source == "state"
    assert {h.job_id for h in admin.find(fields={"customer_id": "7"}).items} == {
        first, "after1"}
    assert {h.job_id for h in admin.find(type="report").items} == {out.job_ids[1]}
    assert admin.find(id_prefix="after").items[0].state == "waiting"
    assert {h.job_id for h in admin.find(queue="deps").items} == {first, *out.job_ids,
                                                                   "after1"}


def test_a_debounce_fold_is_found_by_its_new_payload(url: str, prefix: str, admin: Admin
                                                    ) -> None:
    q = queue(url, "deb", prefix, search=FIELDS)
    d = Dedup(key="k", mode="debounce", delay_ms=60_000, max_wait_ms=600_000)
    jid = q.enqueue("email.send", {"customer_id": 1}, dedup=d).job_id
    folded = q.enqueue("email.send", {"customer_id": 2}, dedup=d)
    assert folded.status == "deduplicated"
    assert [h.job_id for h in admin.find(fields={"customer_id": "2"}).items] == [jid]
    assert admin.find(fields={"customer_id": "1"}).items == []  # its old payload's
    assert [h.job_id for h in admin.find(type="email.send").items] == [jid]


def test_expired_records_are_dropped_from_results_and_index(url: str, prefix: str,
                                                            admin: Admin, r: redis.Redis) -> None:
    q = queue(url, "exp", prefix, search=SearchConfig())
    keep = q.enqueue("t", {}).job_id
    gone = q.enqueue("t", {}).job_id
    k = Keys("exp", prefix)
    r.pexpire(k.job(gone), 1)  # the record expires as a finished one's would
    wait_until(lambda: not r.exists(k.job(gone)), what="the record to expire")
    assert [h.job_id for h in admin.find(type="t").items] == [keep]
    assert r.zscore(k.ix_type("t"), gone) is None  # dropped as met
    assert r.zscore(k.ix_type("t"), keep) is not None


def test_queue_from_before_search(url: str, prefix: str, admin: Admin, r: redis.Redis) -> None:
    old = queue(url, "old", prefix)  # no SearchConfig: writes no index at all
    jid = old.enqueue("t", {"customer_id": 1}).job_id
    assert not [k for k in r.scan_iter(f"{prefix}:*ix*")]
    page = admin.find(type="t")
    assert page.items == [] and page.index_since_ms == {"old": None}
    assert [h.job_id for h in admin.find(id=jid).items] == [jid]  # an exact id still works
    # search turned on later: the index starts then, the older job is found by id only
    new = queue(url, "old", prefix, search=SearchConfig())
    jid2 = new.enqueue("t", {}).job_id
    page = admin.find(type="t")
    assert [h.job_id for h in page.items] == [jid2]
    assert page.index_since_ms["old"] is not None
    assert [h.job_id for h in admin.find(id=jid).items] == [jid]


def test_a_repeated_enqueue_indexes_nothing_new(url: str, prefix: str, r: redis.Redis) -> None:
    q = queue(url, "rep", prefix, search=SearchConfig())
    jid = q.enqueue("t", {}, job_id="j-1").job_id
    k = Keys("rep", prefix)
    score = r.zscore(k.ix_all, jid)
    assert q.enqueue("t", {}, job_id="j-1").status == "duplicate"
    assert r.zscore(k.ix_all, jid) == score and r.zcard(k.ix_all) == 1


def test_bad_filters_are_typed_errors(url: str, prefix: str, admin: Admin) -> None:
    queue(url, "m", prefix, search=FIELDS).enqueue("email.send", {"customer_id": 1})
    with pytest.raises(InvalidSearch, match="unknown state 'done'"):
        admin.find(state="done")
    with pytest.raises(InvalidSearch, match="'plan' is not declared"):
        admin.find(fields={"plan": "pro"})
    with pytest.raises(InvalidSearch, match="not declared indexable for job type 'report'"):
        admin.find(type="report", fields={"customer_id": "1"})
    with pytest.raises(InvalidSearch, match="cursor"):
        admin.find(cursor="nonsense!")
    with pytest.raises(InvalidSearch, match="since"):
        admin.find(since_ms=10, until_ms=5)
    with pytest.raises(ValueError):  # InvalidSearch is an InvalidArgument, a ValueError
        SearchConfig(fields={"email.send": "customer_id"})


async def test_async_admin_finds_the_same(url: str, prefix: str, admin: Admin) -> None:
    q = queue(url, "as", prefix, search=SearchConfig())
    ids = [q.enqueue("t", {}).job_id for _ in range(3)]
    a = AsyncAdmin.from_url(url, QueueConfig(key_prefix=prefix))
    try:
        page = await a.find(type="t")
    finally:
        await a.close()
    assert {h.job_id for h in page.items} == set(ids)
    assert page == admin.find(type="t")


def test_cli_find(url: str, prefix: str) -> None:
    import json
    import subprocess
    import sys

    q = queue(url, "mail", prefix, search=FIELDS)
    ids = [q.enqueue("email.send", {"customer_id": i % 2}).job_id for i in range(4)]

    def run(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, "-m", "streamq", "find", *args, "--url", url,
                               "--prefix", prefix], capture_output=True, text=True, timeout=60)

    out = run("--field", "customer_id=1", "--since", "1h", "--json")
    assert out.returncode == 0, out.stderr
    data = json.loads(out.stdout)
    assert {h["job_id"] for h in data["items"]} == {ids[1], ids[3]}
    assert (data["source"], data["bound_hit"], data["cursor"]) == ("field", False, None)
    out = run("--id", ids[2][:4] + "*", "--limit", "1")
    assert out.returncode == 0 and ids[2] in out.stdout and "prefix index" in out.stdout


async def test_dashboard_search_box(url: str, prefix: str) -> None:
    import httpx

    from streamq.dashboard import DashboardConfig, create_app

    q = queue(url, "mail", prefix, search=FIELDS)
    ids = [q.enqueue("email.send", {"customer_id": i % 2}, group="acme").job_id
           for i in range(4)]
    app = create_app(url, config=DashboardConfig(queue_config=QueueConfig(key_prefix=prefix)))
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app),
                                 base_url="http://dash") as c:
        home = (await c.get("/")).text
        assert 'action="/search"' in home
        assert 'name="q" value="mail"' in (await c.get("/queue?q=mail")).text
        page = (await c.get("/search", params={"s": "customer_id:1 group:acme"})).text
        assert {j for j in ids if j in page} == {ids[1], ids[3]}
        assert "checked via the field index" in page
        one = await c.get("/search", params={"s": ids[2], "q": "mail"})  # a bare id: its page
        assert one.status_code == 303 and one.headers["location"].endswith(f"id={ids[2]}")
        bad = await c.get("/search", params={"s": "state:finished"})
        assert bad.status_code == 400 and "unknown state" in bad.text


@pytest.mark.cluster
def test_on_a_redis_cluster(cluster_url: str, prefix: str) -> None:
    """A sharded queue over every primary: the indexes sit in each shard's slot, and one
    search reads every node (pipelines by node), checks records in each slot (search.lua)."""
    from streamq._core.conn import sync_client
    from streamq._core.keys import shard_keys

    q = queue(cluster_url, "cl", prefix, shards=6, search=FIELDS)
    client: Any = sync_client(cluster_url)
    nodes = {client.get_node_from_key(k.stream).name for k in shard_keys("cl", 6, prefix)}
    assert len(nodes) > 1
    ids = [r.job_id for r in q.enqueue_many(
        [{"type": "email.send", "payload": {"customer_id": i % 5}} for i in range(40)])]
    later = q.enqueue("email.send", {"customer_id": 1}, delay=3600).job_id
    a = Admin.from_url(cluster_url, QueueConfig(key_prefix=prefix))
    try:
        assert {j for _, j, _ in all_pages(a, 7)} == {*ids, later}
        assert {h.job_id for h in a.find(fields={"customer_id": "1"}).items} == {
            *(j for i, j in enumerate(ids) if i % 5 == 1), later}
        assert [h.job_id for h in a.find(state="scheduled").items] == [later]
        assert [h.job_id for h in a.find(id=ids[3]).items] == [ids[3]]
        assert ids[3] in {h.job_id for h in a.find(id_prefix=ids[3][:4]).items}
    finally:
        a.close()
        client.close()
        q.close()


def test_with_dedup_priority_and_groups_in_one_call(url: str, prefix: str,
                                                    r: redis.Redis) -> None:
    """The search section comes after enqueue.lua's other optional sections: a call with
    dedup keys, priorities and groups indexes exactly the jobs it created."""
    from streamq import Dedup

    q = queue(url, "mix", prefix, search=FIELDS)
    res = q.enqueue_many([
        {"type": "email.send", "payload": {"customer_id": 1}, "priority": 4, "group": "g",
         "dedup": Dedup(key="k1", mode="until_finish")},
        {"type": "email.send", "payload": {"customer_id": 1},
         "dedup": Dedup(key="k1", mode="until_finish")},  # folded into the first
        {"type": "email.send", "payload": {"customer_id": 2}, "priority": 0},
    ])
    assert [x.status for x in res] == ["queued", "deduplicated", "queued"]
    k = Keys("mix", prefix)
    assert set(r.zrange(k.ix_all, 0, -1)) == {res[0].job_id.encode(), res[2].job_id.encode()}
    assert r.zrange(k.ix_group("g"), 0, -1) == [res[0].job_id.encode()]
    assert r.zrange(k.ix_field("email.send", "customer_id", "1"), 0, -1) == [
        res[0].job_id.encode()]
    assert res[1].job_id == res[0].job_id


def test_entries_past_the_retention_are_trimmed(url: str, prefix: str, r: redis.Redis
                                                ) -> None:
    q = queue(url, "ret", prefix, search=SearchConfig(retention_s=1))
    k = Keys("ret", prefix)

    def server_ms() -> int:
        sec, usec = r.time()
        return int(sec) * 1000 + int(usec) // 1000

    old = q.enqueue("t", {}).job_id
    assert r.pttl(k.ix_type("t")) != -1  # the index has a TTL (or has expired already)
    written_by = server_ms()  # the entry's score (the script's now) is at most this

    def past() -> bool:  # more jobs meanwhile keep the indexes alive (their TTL: 1 s)
        q.enqueue("t", {})
        return server_ms() > written_by + 1000

    wait_until(past, what="the first entry to pass the retention")
    new = q.enqueue("t", {}).job_id
    for key in (k.ix_all, k.ix_ids, k.ix_type("t")):
        assert r.zscore(key, old) is None, key  # trimmed
        assert r.zscore(key, new) is not None, key


# Error text (docs/search.md#error-text): the error-word index and the stream scan answer by
# one rule, the query occurring where a word starts.

async def _bury(url: str, prefix: str, admin: Admin, name: str, msgs: list[str],
                search: SearchConfig | None) -> list[str]:
    r = redis.Redis.from_url(url)
    """Dead-letter one job per message (a handler's Fail), oldest first; their ids."""
    reg = Registry()

    @reg.handler("charge")
    async def charge(job: Job) -> None:
        raise Fail(job.payload["m"])

    q = queue(url, name, prefix, search=search)
    before = int(r.xlen(Keys(name, prefix).dead))
    ids = [r.job_id for r in q.enqueue_many(
        [{"type": "charge", "payload": {"m": m}, "max_attempts": 1} for m in msgs])]
    async with Worker(url, [name], reg, fast(concurrency=64), QueueConfig(key_prefix=prefix)):
        await eventually(lambda: r.xlen(Keys(name, prefix).dead) >= before + len(msgs), 60,
                         f"{len(msgs)} dead letters in {name}")
    q.close()
    r.close()
    return ids


MSGS = ["card declined by issuer", "scorecard declined", "Gateway timed-out: retry later Éclair",
        "one two three four five six seven eight nine ten eleven twelve thirteen fourteen"
        " fifteen sixteen seventeen"]


async def test_error_text_is_found_where_a_word_starts_by_index_and_scan_alike(
        url: str, prefix: str, admin: Admin) -> None:
    idx = await _bury(url, prefix, admin, "ix", MSGS, SearchConfig())
    scan = await _bury(url, prefix, admin, "scan", MSGS, None)
    for q, ids, source in (("ix", idx, "words"), ("scan", scan, "dead")):
        def found(text: str, q: str = q, ids: list[str] = ids, source: str = source
                  ) -> list[int]:
            page = admin.find(q, error=text)
            assert page.source == (source if any(c.isalnum() for c in text) else "dead")
            return sorted(ids.index(h.job_id) for h in page.items)

        assert found("declin") == [0, 1]          # a word's start
        assert found("eclined") == []             # not inside a word
        assert found("card") == [0]               # 'scorecard' does not start with it
        assert found("CARD DECLINED BY") == [0]
        assert found("timed-out: r") == [2]       # any text, its first word at a start
        assert found("timed out") == []           # the text as it is: '-' is not ' '
        assert found("fail gateway") == [2]       # the error type leads the text
        assert found("LATER Éclair") == [2]       # a non-ASCII letter as it is
        assert found(": retry") == [2]            # starts with no letter: anywhere
        assert found("ÉCLAIR") == [2] and found("éclair") == []  # (lower case: ASCII only)
        assert found("fifteen") == [3]            # 'fail' is the first of 16 distinct words
        assert found("sixteen") == []             # the 17th: not searchable
        assert found(":") == [2]                  # no word at all: the stream answers
        assert [h.job_id for h in admin.find(q, error_type="Fail").items] == ids[::-1]


async def test_a_rare_error_among_many_is_found_without_the_bound(
        url: str, prefix: str, admin: Admin, r: redis.Redis, monkeypatch: pytest.MonkeyPatch
) -> None:
    from streamq._ops import search_words

    monkeypatch.setattr(search_words, "SYNC_MAX", 1000)  # (the search indexes all 600 first)
    msgs = ["insufficient funds"] * 600
    msgs[3] = "address not verified"
    ids = await _bury(url, prefix, admin, "many", msgs, SearchConfig())
    page = admin.find(error="address not", max_scan=100)
    assert [h.job_id for h in page.items] == [ids[3]] and not page.bound_hit
    assert page.source == "words" and page.scanned == 1 and page.cursor is None
    # the stream alone (no index) reads 100 dead letters and stops there
    r.delete(Keys("many", prefix).ix_ew, Keys("many", prefix).ix_ewl)
    r.delete(Keys("many", prefix).ix_all)
    page = admin.find(error="address not", max_scan=100)
    assert page.items == [] and page.bound_hit and page.source == "dead"


async def test_paging_over_the_index_and_the_dead_letters_it_has_not_reached(
        url: str, prefix: str, admin: Admin, r: redis.Redis, monkeypatch: pytest.MonkeyPatch
) -> None:
    from streamq._ops import search_words

    monkeypatch.setattr(search_words, "SYNC_MAX", 7)  # a search indexes 7 more each time
    ids = await _bury(url, prefix, admin, "pg", [f"gateway error {i}" for i in range(40)],
                      SearchConfig())
    raw: Any = r.xrevrange(Keys("pg", prefix).dead)
    dead = [f[b"job"].decode() for _e, f in raw]
    got = [h[1] for h in all_pages(admin, 6, error="gateway err")]
    assert got == dead  # newest first, each once, across the mark
    assert [h.job_id for h in admin.find(error="error 17").items] == [ids[17]]


async def test_redriven_and_purged_dead_letters_are_no_longer_found(
        url: str, prefix: str, admin: Admin, r: redis.Redis) -> None:
    ids = await _bury(url, prefix, admin, "rd", ["card declined"] * 3 + ["other"],
                      SearchConfig())
    k = Keys("rd", prefix)
    assert len(admin.find(error="card declined").items) == 3  # (indexed now)
    entries = [e for e in admin.dead("rd").items if e.job_id == ids[0]]
    admin.redrive("rd", entries)
    page = admin.find(error="card declined")
    assert {h.job_id for h in page.items} == {ids[1], ids[2]} and page.source == "words"
    # the re-driven one's entries left the index when the search met them
    assert r.zcard(k.ix_ewl) == 3
    assert admin.purge("rd", "failed") >= 3
    assert admin.find(error="card declined").items == []
    admin.find(error="other")  # the next search (or a worker) drops what the stream lost
    assert r.zcard(k.ix_ew) == 0 and r.zcard(k.ix_ewl) == 0


async def test_dead_letters_from_before_the_index_are_found(
        url: str, prefix: str, admin: Admin) -> None:
    """Dead letters written while the queue had no search are found by the stream scan,
    and, once search is on, indexed from the stream's start."""
    old = await _bury(url, prefix, admin, "late", ["old gateway failure"], None)
    page = admin.find(error="gateway")
    assert [h.job_id for h in page.items] == old and page.source == "dead"
    new = await _bury(url, prefix, admin, "late", ["new gateway failure"], SearchConfig())
    page = admin.find(error="gateway")
    assert [h.job_id for h in page.items] == new + old and page.source == "words"


async def test_a_worker_keeps_the_error_index_up_to_date(
        url: str, prefix: str, admin: Admin, r: redis.Redis, monkeypatch: pytest.MonkeyPatch
) -> None:
    from streamq._ops import search_words

    monkeypatch.setattr(search_words, "ERROR_INDEX_EVERY_S", 0.05)
    monkeypatch.setattr(search_words, "SYNC_MAX", 4)  # (a worker's call: more at once again)
    reg = Registry()

    @reg.handler("charge")
    async def charge(job: Job) -> None:
        raise Fail(f"quota exceeded {job.payload['i']}")

    q = queue(url, "hk", prefix, search=SearchConfig())
    ids = {x.job_id for x in q.enqueue_many(
        [{"type": "charge", "payload": {"i": i}, "max_attempts": 1} for i in range(10)])}
    k = Keys("hk", prefix)
    async with Worker(url, ["hk"], reg, fast(), QueueConfig(key_prefix=prefix)):
        # the worker indexes them as they come: no search runs meanwhile
        await eventually(lambda: r.zcard(k.ix_ewl) == 10, 30, "10 dead letters indexed")
    assert r.exists(k.ix_ew)
    assert {h.job_id for h in admin.find(error="quota").items} == ids
    q.close()


async def test_queued_jobs_are_read_from_the_ready_streams(url: str, prefix: str,
                                                          admin: Admin) -> None:
    """state="queued" alone reads each shard's ready streams (every priority level), newest
    entry first: a few queued jobs among many scheduled, active and finished ones are found
    without the bound; delivered entries (active jobs) are checked out on their records."""
    q = queue(url, "rq", prefix, shards=2, search=SearchConfig())
    reg = Registry()
    started: list[str] = []

    @reg.handler("hold")
    async def hold(job: Job) -> None:
        started.append(job.id)
        await asyncio.sleep(3600)

    q.enqueue_many([{"type": "later", "delay": 3600} for _ in range(300)])
    held = [q.enqueue("hold", {}).job_id for _ in range(4)]
    async with Worker(url, ["rq"], reg, fast(concurrency=4),
                      QueueConfig(key_prefix=prefix, shards=2)):
        await eventually(lambda: len(started) == 4, 20, "4 active jobs")
        queued = [q.enqueue("t", {}, priority=p).job_id for p in (0, 2, 4, 2)]
        q.enqueue_many([{"type": "later", "delay": 3600} for _ in range(300)])
        page = admin.find(state="queued", max_scan=50)
        assert page.source == "stream" and not page.bound_hit
        assert {h.job_id for h in page.items} == set(queued)
        assert all(h.state == "queued" for h in page.items) and not set(held) & {
            h.job_id for h in page.items}
        assert {h[1] for h in all_pages(admin, 1, state="queued")} == set(queued)
    # grouped jobs beyond their group's first slot wait in no stream: listed with the rest
    grouped = [q.enqueue("t", {}, group="g").job_id for _ in range(3)]
    r = redis.Redis.from_url(url)
    assert sum(r.zcard(Keys("rq", prefix, sh).group_wait) for sh in (0, 1)) >= 1
    r.close()
    page = admin.find(state="queued", max_scan=50)
    assert page.source == "stream" and not page.bound_hit
    # (the held ones too: the worker's stop handed them back, queued again)
    assert {h.job_id for h in page.items} == set(queued) | set(grouped) | set(held)
    q.close()
