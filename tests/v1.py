"""The release before compact records (layout 1), driven from tests: its scripts are in
tests/fixtures/v1, exactly as it shipped them. ``v1_enqueue`` is an old producer;
``OldWorker`` does what an old worker's loops did with those scripts (promote due jobs,
reclaim lapsed leases, read and start entries, settle them, hand them back at stop)."""

from __future__ import annotations

import contextlib
import itertools
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import attrs
import redis

from streamq import Keys
from streamq._core.keys import GROUP

V1 = Path(__file__).parent / "fixtures" / "v1"


def v1_script(r: redis.Redis, name: str) -> Any:
    return r.register_script((V1 / "_lib.lua").read_text() + "\n"
                             + (V1 / f"{name}.lua").read_text())


def v1_enqueue(r: redis.Redis, k: Keys, jobs: list[tuple[str, str, Any, int]]) -> list[Any]:
    """An old producer: (id, type, payload, delay_ms) per job, 100,000 events kept."""
    keys = [k.stream, k.delayed, k.stats, k.events, *(k.job(j) for j, *_ in jobs)]
    args: list[Any] = [100_000, 0, k.wake_channel, len(jobs)]
    for jid, jtype, payload, delay_ms in jobs:
        env = json.dumps({"i": jid, "t": jtype, "p": payload, "created_ms": 1,
                          "result_ttl_s": 86400}, separators=(",", ":"))
        args += [jid, jtype, env, 0, 86400, 0, delay_ms, 0, "", ""]
    out: list[Any] = v1_script(r, "enqueue")(keys=keys, args=args)
    return out


def v1_start(r: redis.Redis, k: Keys, consumer: str, count: int) -> list[tuple[str, str, str]]:
    """An old worker: read ``count`` entries and start them (layout-1 start.lua)."""
    with contextlib.suppress(redis.ResponseError):
        r.xgroup_create(k.stream, GROUP, id="0", mkstream=True)
    got: Any = r.xreadgroup(GROUP, consumer, {k.stream: ">"}, count=count)
    part = [(e.decode(), f[b"id"].decode(), f"old-{n}") for n, (e, f) in enumerate(got[0][1])]
    keys = [k.stream, k.dead, k.stats, k.events, k.paused, *(k.job(j) for _, j, _ in part)]
    args: list[Any] = [GROUP, consumer, 100_000, 3600, 1000, len(part)]
    for e, j, t in part:
        args += [e, j, t]
    args.append(0)
    reply = v1_script(r, "start")(keys=keys, args=args)
    assert [reply[7 * i] for i in range(len(part))] == [b"run"] * len(part)
    return part


def v1_finish(r: redis.Redis, k: Keys, jid: str, entry: str, token: str, result: str) -> Any:
    keys = [k.stream, k.delayed, k.dead, k.stats, k.events, k.job(jid)]
    args = [GROUP, 100_000, 3600, 1000, "", 1, jid, entry, token, "ok", result, 0, ""]
    return v1_script(r, "finish")(keys=keys, args=args)


@attrs.define
class OldLease:
    entry: str
    job_id: str
    token: str
    attempt: int
    payload: Any


_tokens = itertools.count(1)


@attrs.define
class OldWorker:
    """An old worker (layout-1 scripts) on one queue. ``dead`` collects every start.lua reply
    that dead-lettered an entry (reason and job id): an upgrade must leave it empty."""

    r: redis.Redis
    k: Keys
    consumer: str
    dead: list[tuple[str, str]] = attrs.field(factory=list)
    settled: list[tuple[str, str]] = attrs.field(factory=list)  # (job id, finish outcome)

    def _start(self, items: list[tuple[str, str]]) -> list[OldLease]:
        if not items:
            return []
        part = [(e, j, f"old-{self.consumer}-{next(_tokens)}") for e, j in items]
        k = self.k
        keys = [k.stream, k.dead, k.stats, k.events, k.paused, *(k.job(j) for _, j, _ in part)]
        args: list[Any] = [GROUP, self.consumer, 100_000, 3600, 1000, len(part)]
        for e, j, t in part:
            args += [e, j, t]
        args.append(0)
        reply: Any = v1_script(self.r, "start")(keys=keys, args=args)
        out: list[OldLease] = []
        for i, (e, j, t) in enumerate(part):
            code, _tok, attempt, data = reply[7 * i:7 * i + 4]
            if code == b"run":
                env = json.loads(data)
                assert env["i"] == j, (j, env)
                out.append(OldLease(e, j, t, int(attempt), env["p"]))
            elif code == b"dead":
                self.dead.append((j, data.decode()))
        return out

    def fetch(self, count: int) -> list[OldLease]:
        """Read up to ``count`` new entries and start them."""
        with contextlib.suppress(redis.ResponseError):
            self.r.xgroup_create(self.k.stream, GROUP, id="0", mkstream=True)
        got: Any = self.r.xreadgroup(GROUP, self.consumer, {self.k.stream: ">"}, count=count)
        items = [(e.decode(), f[b"id"].decode()) for e, f in got[0][1]] if got else []
        return self._start(items)

    def reclaim(self, min_idle_ms: int, count: int = 100) -> list[OldLease]:
        """XAUTOCLAIM entries idle for ``min_idle_ms`` and start them (a takeover)."""
        got: Any = self.r.xautoclaim(self.k.stream, GROUP, self.consumer, min_idle_ms,
                                     "0-0", count=count)
        items = [(e.decode(), f[b"id"].decode()) for e, f in got[1] if f]
        return self._start(items)

    def promote(self) -> int:
        """Move due jobs from the delayed set into the stream (the old promote.lua)."""
        k = self.k
        now_s, now_us = self.r.time()
        ids: Any = self.r.zrangebyscore(k.delayed, "-inf", now_s * 1000 + now_us // 1000,
                                        start=0, num=100)
        if not ids:
            return 0
        names = [i.decode() for i in ids]
        keys = [k.delayed, k.stream, k.dead, k.stats, k.events, *(k.job(j) for j in names)]
        reply: Any = v1_script(self.r, "promote")(keys=keys, args=[100_000, 3600, 1000, *names])
        return int(reply[0])

    def finish(self, lease: OldLease, outcome: str = "ok", data: str = "null",
               delay_ms: int = 0) -> str:
        """Settle an attempt: 'ok' with a result, or 'retry' after ``delay_ms``."""
        k = self.k
        keys = [k.stream, k.delayed, k.dead, k.stats, k.events, k.job(lease.job_id)]
        etype = "" if outcome == "ok" else "E"
        extra: Any = 0 if outcome == "ok" else delay_ms
        if outcome != "ok":
            data = json.dumps({"type": "E", "message": "again"})
        args = [GROUP, 100_000, 3600, 1000, "", 1, lease.job_id, lease.entry, lease.token,
                outcome, data, extra, etype]
        reply: Any = v1_script(self.r, "finish")(keys=keys, args=args)
        got = str(reply[0].decode())
        self.settled.append((lease.job_id, got))
        return got

    def release(self, leases: list[OldLease]) -> list[int]:
        """Hand started jobs back unrun (a graceful stop)."""
        if not leases:
            return []
        k = self.k
        keys = [k.stream, k.stats, k.events, *(k.job(x.job_id) for x in leases)]
        args: list[Any] = [GROUP, 100_000, self.consumer]
        for x in leases:
            args += [x.job_id, x.entry, x.token]
        return [int(v) for v in v1_script(self.r, "release")(keys=keys, args=args)]

    def step(self, run: Callable[[OldLease], str | None], count: int = 10,
             reclaim_idle_ms: int | None = None) -> int:
        """One turn of the old worker's loops: promote, reclaim (when asked), fetch, then run
        each started job (``run`` returns the result JSON, or None to retry it at once).
        Returns the number of jobs started."""
        self.promote()
        leases = self.reclaim(reclaim_idle_ms) if reclaim_idle_ms is not None else []
        leases += self.fetch(count)
        for lease in leases:
            result = run(lease)
            if result is None:
                self.finish(lease, "retry")
            else:
                self.finish(lease, "ok", result)
        return len(leases)

    def completed(self) -> list[str]:
        return [j for j, outcome in self.settled if outcome == "completed"]
