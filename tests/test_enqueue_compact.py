"""enqueue.lua's compact form (prepare._compact: a batch whose jobs differ only in id and body
sends the 8 shared values once and 2 arguments per job) writes the same records and answers
the same as the full form, with every section after the jobs (groups, priorities, dedup,
search), and a repeated call is still answered 'duplicate' by the same rules (invariant 12)."""

from __future__ import annotations

from typing import Any

import pytest
import redis
from helpers import records_untimed

from streamq import Dedup, Queue, QueueConfig, SearchConfig
from streamq._producer import prepare

# fields whose values depend on the time of the call (entry ids, creation and due times)
TIMED = {b"e", b"c", b"due"}

SHAPES: dict[str, tuple[dict[str, Any], QueueConfig]] = {
    "plain": ({}, QueueConfig()),
    "options": ({"max_attempts": 3, "result_ttl": 60, "headers": {"h": "v"}}, QueueConfig()),
    "delayed": ({"delay": 30}, QueueConfig()),
    "group": ({"group": "g1"}, QueueConfig()),
    "priority": ({"priority": 0}, QueueConfig()),
    "search": ({}, QueueConfig(search=SearchConfig())),
}


def _batch(prefix: str, opts: dict[str, Any], n: int = 5) -> list[dict[str, Any]]:
    return [{"type": "t", "payload": {"i": i}, "job_id": f"{prefix}{i}", **opts}
            for i in range(n)]


@pytest.mark.parametrize("shape", sorted(SHAPES))
def test_compact_form_is_used_and_writes_what_the_full_form_writes(
        url: str, r: redis.Redis, qname: str, shape: str,
        monkeypatch: pytest.MonkeyPatch) -> None:
    opts, cfg = SHAPES[shape]
    with Queue.from_url(url, qname + "c", cfg) as qc, Queue.from_url(url, qname + "f", cfg) as qf:
        _, args = prepare.enqueue_call(qc.keys, cfg, prepare.prepare_many(
            qc.keys, cfg, _batch("x", opts)))
        assert str(args[3]).startswith("="), args[:6]
        compact = qc.enqueue_many(_batch("j", opts))
        again = qc.enqueue_many(_batch("j", opts))  # a repeat: duplicates, its own rows
        with monkeypatch.context() as m:
            m.setattr(prepare, "_compact", lambda args, n: None)
            full = qf.enqueue_many(_batch("j", opts))
            full_again = qf.enqueue_many(_batch("j", opts))
        ids = [f"j{i}" for i in range(5)]
        assert [x.status for x in compact] == [x.status for x in full]
        assert [(x.status, x.state) for x in again] == [(x.status, x.state) for x in full_again]
        assert {x.status for x in again} == {"duplicate"}
        assert records_untimed(r, qc, ids, TIMED) == records_untimed(r, qf, ids, TIMED)
        assert r.xlen(qc.keys.stream) == r.xlen(qf.keys.stream)


def test_a_batch_with_differing_options_is_sent_in_full(url: str, qname: str) -> None:
    cfg = QueueConfig()
    with Queue.from_url(url, qname, cfg) as q:
        jobs = _batch("a", {}) + _batch("b", {"max_attempts": 2})
        _, args = prepare.enqueue_call(q.keys, cfg, prepare.prepare_many(q.keys, cfg, jobs))
        assert not str(args[3]).startswith("=")
        assert {x.status for x in q.enqueue_many(jobs)} == {"queued"}


def test_compact_dedup_section(url: str, r: redis.Redis, qname: str) -> None:
    cfg = QueueConfig()
    with Queue.from_url(url, qname, cfg) as q:
        jobs = [{"type": "t", "payload": {"i": i}, "job_id": f"d{i}",
                 "dedup": Dedup(key="same", mode="until_start")} for i in range(3)]
        res = q.enqueue_many(jobs)
        assert [x.status for x in res] == ["queued", "deduplicated", "deduplicated"]
        assert r.exists(q.keys.job("d0")) == 1 and r.exists(q.keys.job("d1")) == 0
