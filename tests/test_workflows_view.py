"""Looking at a flow (docs/workflows.md#looking-at-a-flow): Admin.flow and `streamq flow`."""

from __future__ import annotations

import json
from typing import Any

import pytest
from helpers import eventually, running, state

import streamq
from streamq import JobRef, Queue, Registry
from streamq.admin import Admin
from streamq.cli.main import main as cli


def _reg() -> Registry:
    reg = Registry()

    @reg.handler("noop")
    def noop(job: streamq.Job) -> Any:
        return job.payload

    return reg


def test_flow_shows_children_parents_and_blocked_by(url: str, q: Queue, qname: str) -> None:
    other = Queue.from_url(url, f"{qname}-o")
    try:
        q.enqueue("noop", 1, job_id="a")
        other.enqueue("noop", 2, job_id="b")
        q.enqueue("noop", 3, job_id="p", depends_on=["a", JobRef(other.name, "b", "continue")])
        q.enqueue("noop", 4, job_id="gp", depends_on=["p"])
        admin = Admin.from_url(url)
        view = admin.flow(qname, "p")
        assert view.state == "waiting" and view.cursor == ""
        got = sorted((c.index, c.queue, c.job_id, c.state, c.policy, c.outcome)
                     for c in view.children)
        assert got == [(0, qname, "a", "queued", "fail", ""),
                       (1, other.name, "b", "queued", "continue", "")]
        assert sorted(c.job_id for c in view.blocked_by) == ["a", "b"]
        assert (view.pending_total, view.ended_total, view.parents_total) == (2, 0, 1)
        assert [(p.queue, p.job_id, p.state, p.policy) for p in view.parents] == [
            (qname, "gp", "waiting", "fail")]
        leaf = admin.flow(qname, "a")
        assert leaf.children == [] and [p.job_id for p in leaf.parents] == ["p"]
        with pytest.raises(streamq.JobNotFound):
            admin.flow(qname, "nope")
        admin.close()
    finally:
        other.close()


async def test_flow_records_ended_children(url: str, q: Queue, qname: str) -> None:
    q.enqueue("noop", 1, job_id="a")
    q.enqueue("noop", 3, job_id="b", delay=3600)  # (not run by this test)
    q.enqueue("noop", 2, job_id="p", depends_on=["a", "b"])
    async with running(url, qname, _reg()):
        await eventually(lambda: state(q, "a") == "completed", 30)
        admin = Admin.from_url(url)
        view = admin.flow(qname, "p")
        assert view.state == "waiting"
        assert {c.job_id: c.outcome for c in view.children} == {"a": "completed", "b": ""}
        assert [(c.job_id, c.state) for c in view.blocked_by] == [("b", "scheduled")]
        admin.close()


def test_flow_pages_a_big_fan_in(url: str, q: Queue, qname: str) -> None:
    n = 450
    q.enqueue_many([{"type": "noop", "payload": i, "job_id": f"c{i}"} for i in range(n)])
    q.enqueue("noop", 0, job_id="fan", depends_on=[f"c{i}" for i in range(n)])
    admin = Admin.from_url(url)
    seen: list[str] = []
    cursor: str | None = None
    pages = 0
    while True:
        view = admin.flow(qname, "fan", cursor=cursor, limit=100)
        pages += 1
        assert len(view.children) <= 300  # counts are hints, never the whole set at once
        seen += [c.job_id for c in view.children]
        if not view.cursor:
            break
        cursor = view.cursor
    assert pages >= 3
    assert sorted(set(seen)) == sorted(f"c{i}" for i in range(n))
    with pytest.raises(streamq.InvalidArgument):
        admin.flow(qname, "fan", cursor="zz:1")
    admin.close()


def test_flow_command_text_and_json(url: str, q: Queue, qname: str,
                                    capsys: pytest.CaptureFixture[str]) -> None:
    q.enqueue("noop", 1, job_id="a")
    q.enqueue("noop", 2, job_id="p", depends_on=["a"])
    assert cli(["--url", url, "flow", qname, "p"]) == 0
    out = capsys.readouterr().out
    assert "p: waiting" in out and "blocked by" in out and "waits for" in out
    assert "waits for 1 (1 pending, 0 ended); waited on by 0" in out
    assert cli(["--url", url, "--json", "flow", qname, "a"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["state"] == "queued" and data["children"] == []
    assert [p["job_id"] for p in data["parents"]] == ["p"]


def test_flow_of_a_sharded_queue(url: str, qname: str) -> None:
    from streamq import QueueConfig

    cfg = QueueConfig(shards=4)
    sq = Queue.from_url(url, qname, cfg)
    admin = Admin.from_url(url, cfg)
    try:
        kids = [f"k{i}" for i in range(8)]
        for k in kids:
            sq.enqueue("noop", job_id=k)
        sq.enqueue("noop", job_id="fan", depends_on=kids)
        view = admin.flow(qname, "fan")
        assert [(c.job_id, c.state) for c in view.children] == [(k, "queued") for k in kids]
        assert [p.job_id for p in admin.flow(qname, "k5").parents] == ["fan"]
    finally:
        admin.close()
        sq.close()
