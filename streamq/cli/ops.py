"""Ops commands of the ``streamq`` CLI: stats, pending, job, flow, dead, requeue, cancel, pause,
resume, consumers, purge, enqueue. Every command takes --json, --url and --prefix."""

from __future__ import annotations

import argparse
import datetime as dt
import json
import sys
import time
from collections.abc import Callable
from typing import Any

import attrs

from .._core.errors import InvalidArgument, ShardCountMismatch, UnknownQueue
from .._core.keys import Keys, check_job_id
from .._ops.queues import forget
from .._producer.queue import Queue
from ..admin import Admin, DeadFilter
from .common import Ctx, _duration, _plain, _table
from .find import add_parser as _add_find
from .find import cmd_find
from .groups import add_parser as _add_groups
from .groups import cmd_groups
from .hints import page_limit
from .reshard import add_parser as _add_reshard
from .reshard import cmd_reshard


def cmd_stats(ctx: Ctx) -> None:
    for name in ctx.args.queues or ():
        ctx.queue(name)
    queues = ctx.args.queues or ctx.admin.queues()
    if not queues:
        raise InvalidArgument("no queues known yet: name them (streamq stats QUEUE ...)")
    count = 0
    while True:
        stats = []
        for q in queues:
            try:
                stats.append(ctx.admin.stats(q, shard=ctx.shard))
            except UnknownQueue:  # registered once, its keys gone since (purged, expired)
                if ctx.args.queues:
                    raise
            except ShardCountMismatch as exc:  # a queue not named: shown with its own count
                if ctx.args.queues:
                    raise
                own = Admin(ctx.admin.client, attrs.evolve(ctx.config, shards=exc.stored))
                stats.append(own.stats(q))
        if not stats:
            raise InvalidArgument("no known queue has any keys: name one (streamq stats QUEUE)")

        def human(stats: list[Any] = stats) -> str:
            rows = [{"queue": s.queue, "ready": s.ready, "pending": s.pending,
                     "scheduled": s.scheduled, "retrying": s.retrying, "dead": s.dead,
                     "completed": s.counters.get("completed", 0),
                     "failed": s.counters.get("failed", 0),
                     "oldest_ready": "-" if s.oldest_ready_age_s is None
                     else f"{s.oldest_ready_age_s:.1f}s",
                     "consumers": s.consumers, "workers": s.workers_alive,
                     "paused": "yes" if s.paused else ""} for s in stats]
            if any(s.groups for s in stats):  # grouped jobs waiting for a slot: not in ready
                for row, s in zip(rows, stats, strict=True):
                    row["group_waiting"] = s.group_waiting
            if any(s.waiting for s in stats):  # jobs waiting for their dependencies
                for row, s in zip(rows, stats, strict=True):
                    row["waiting"] = s.waiting
                    row["oldest_waiting"] = "-" if s.oldest_waiting_age_s is None \
                        else f"{s.oldest_waiting_age_s:.1f}s"
            orphans = [s.queue for s in stats if s.workers_alive == 0
                       and s.ready + s.scheduled + s.retrying + s.group_waiting > 0]
            notes = [f"note: {q!r} has jobs waiting and no live worker (a typo in a producer's"
                     " queue name, or no worker started yet)" for q in orphans]
            tables = [_table(rows, list(rows[0]))]
            levels = [{"queue": s.queue, "priority": p, "ready": lv.ready, "pending": lv.pending,
                       "oldest_ready": "-" if lv.oldest_ready_age_s is None
                       else f"{lv.oldest_ready_age_s:.1f}s"}
                      for s in stats if len(s.levels) > 1
                      for p, lv in sorted(s.levels.items(), reverse=True)]
            if levels:  # priorities in use: each level's share of ready and pending
                tables += ["", _table(levels, list(levels[0]))]
            return "\n".join([*tables, *notes])

        if ctx.args.watch and not ctx.args.json:
            sys.stdout.write("\x1b[H\x1b[2J")
            print(f"streamq stats  {dt.datetime.now():%H:%M:%S}  (every {ctx.args.watch:g}s,"
                  " Ctrl-C to stop)")
        ctx.out(stats, human)
        count += 1
        if not ctx.args.watch or (ctx.args.count and count >= ctx.args.count):
            return
        time.sleep(ctx.args.watch)


def cmd_pending(ctx: Ctx) -> None:
    page = ctx.admin.pending(ctx.queue(ctx.args.queue), min_idle_s=ctx.args.idle or 0,
                             consumer=ctx.args.consumer, count=ctx.args.limit,
                             cursor=ctx.args.cursor, shard=ctx.shard)
    ctx.out(page, lambda: _table([{**_plain(p), "idle_s": f"{p.idle_s:.1f}"}
                                  for p in page.items],
                                 ["job_id", "type", "state", "consumer", "idle_s", "deliveries",
                                  "attempt", "entry_id"])
            + (f"\nmore: --cursor {page.cursor}" if page.cursor else ""))


def cmd_flow(ctx: Ctx) -> None:
    check_job_id(ctx.args.job_id)
    view = ctx.admin.flow(ctx.queue(ctx.args.queue), ctx.args.job_id, cursor=ctx.args.cursor,
                          limit=ctx.args.limit)

    def human() -> str:
        lines = [f"{view.queue} {view.job_id}: {view.state}"]
        if view.pending_total or view.ended_total or view.parents_total:
            lines.append(f"waits for {view.pending_total + view.ended_total:,}"
                         f" ({view.pending_total:,} pending, {view.ended_total:,} ended);"
                         f" waited on by {view.parents_total:,}")
        b = view.batch
        if b is not None:
            lines.append(f"batch ({'open' if b.open else 'closed'}): total {b.total},"
                         f" completed {b.completed}, dead {b.dead}, pending {b.pending}"
                         + (" (settled)" if b.settled else "") + "; callbacks: "
                         + ", ".join(f"{k} {v}" for k, v in b.callbacks.items()))
        blocked = view.blocked_by
        if blocked:
            lines.append(f"blocked by ({len(blocked)} on this page): " + ", ".join(
                f"{c.queue} {c.job_id} ({c.state})" for c in blocked[:20])
                + (" ..." if len(blocked) > 20 else ""))
        rows = [{"edge": "waits for", "queue": c.queue, "job_id": c.job_id, "state": c.state,
                 "policy": c.policy or "-", "ended as": c.outcome or "pending"}
                for c in view.children]
        rows += [{"edge": "waited on by", "queue": p.queue, "job_id": p.job_id,
                  "state": p.state, "policy": p.policy, "ended as": "-"} for p in view.parents]
        if rows:
            lines += ["", _table(rows, list(rows[0]))]
        else:
            lines.append("no dependencies and no job waiting for it (or they were settled)")
        if view.cursor:
            lines.append(f"more: --cursor {view.cursor}")
        return "\n".join(lines)

    ctx.out({**_plain(view), "blocked_by": [_plain(c) for c in view.blocked_by]}, human)


def cmd_job(ctx: Ctx) -> None:
    check_job_id(ctx.args.job_id)  # the argument first, then the queue
    info = ctx.admin.job(ctx.queue(ctx.args.queue), ctx.args.job_id)

    def human() -> str:
        plain = _plain(info)
        plain["payload"] = json.dumps(info.payload, default=str)
        if not info.max_attempts:
            plain["max_attempts"] = "handler's default"
        if info.progress is not None:
            plain["progress"] = json.dumps(info.progress)
        lines = [f"{k:12} {v}" for k, v in plain.items()
                 if k not in ("envelope", "errors", "error", "logs") and v not in (None, "", [])]
        for ln in info.logs[-20:]:
            at = dt.datetime.fromtimestamp(int(ln.get("t", 0)) / 1000).isoformat(
                timespec="seconds")
            lines.append(f"{'log':12} {at} {ln.get('m', '')}")
        for e in info.errors:
            lines.append(f"{'attempt ' + str(e.get('attempt')):12} failed with {e.get('type')}")
        if info.error:
            lines.append(f"{'last error':12} {info.error.get('type')}: {info.error.get('message')}")
            lines += ["             " + ln for ln in
                      str(info.error.get("traceback", "")).strip().splitlines()[-6:]]
        return "\n".join(lines)

    ctx.out(info, human)


def _filter(args: argparse.Namespace) -> DeadFilter:
    return DeadFilter(type=args.type, error_type=args.error,
                      older_than_s=args.older_than, newer_than_s=args.newer_than)


def cmd_dead(ctx: Ctx) -> None:
    a = ctx.args
    ctx.queue(a.queue)
    if a.action == "list":
        page = ctx.admin.dead(a.queue, _filter(a), limit=a.limit, cursor=a.cursor,
                              shard=ctx.shard)
        ctx.out(page, lambda: _table(
            [{**_plain(e), "at": dt.datetime.fromtimestamp(e.at_ms / 1000).isoformat(
                timespec="seconds")} for e in page.items],
            ["job_id", "type", "error_type", "reason", "at", "dead_id"])
            + (f"\nmore: --cursor {page.cursor}" if page.cursor else ""))
    elif a.action == "show":
        if not a.job_id:
            raise InvalidArgument("dead show needs a job id")
        cmd_job(ctx)
    elif a.action == "redrive":
        if a.job_id:
            page = ctx.admin.dead(a.queue, _filter(a), limit=1000)
            chosen = [e for e in page.items if e.job_id == a.job_id]
            if not chosen:
                raise InvalidArgument(f"job {a.job_id!r} is not in the dead letters of {a.queue!r}")
            result = ctx.admin.redrive(a.queue, chosen)
        else:
            ctx.confirm(f"re-drive every dead job of {a.queue!r} matching the filters")
            result = ctx.admin.redrive_matching(a.queue, _filter(a))
        ctx.out(result, lambda: ", ".join(f"{k}: {v}" for k, v in result.items()) or "nothing")
    elif a.action == "purge":
        ctx.confirm(f"delete every dead job of {a.queue!r}")
        n = ctx.admin.purge(a.queue, "failed", shard=ctx.shard)
        ctx.out({"purged": n}, lambda: f"purged {n} dead jobs")


def cmd_requeue(ctx: Ctx) -> None:
    check_job_id(ctx.args.job_id)
    res = ctx.admin.requeue(ctx.queue(ctx.args.queue), ctx.args.job_id)
    ctx.out({"job_id": ctx.args.job_id, "result": res}, lambda: res)


def cmd_cancel(ctx: Ctx) -> None:
    check_job_id(ctx.args.job_id)
    q = Queue(ctx.admin.client, ctx.queue(ctx.args.queue), ctx.config)
    res = q.cancel(ctx.args.job_id, wait_s=ctx.args.wait)

    def human() -> str:
        if res.cancelled:
            return "cancelled" if res.state != "active" else "cancelled (it was running)"
        if res.code == "cancel_requested" and res.final_state == "active":
            return "cancel requested: the job is running; its worker stops it"
        return f"not cancelled: {res.reason}"

    ctx.out(res, human)
    if not res.cancelled and not (res.code == "cancel_requested"
                                  and res.final_state == "active"):
        raise SystemExit(1)


def cmd_pause(ctx: Ctx) -> None:
    ctx.queue(ctx.args.queue)  # unknown queue -> error, not a stray key
    if ctx.args.command == "pause":
        ctx.admin.pause(ctx.args.queue)
    else:
        ctx.admin.resume(ctx.args.queue)
    state = "paused" if ctx.args.command == "pause" else "resumed"
    ctx.out({"queue": ctx.args.queue, "state": state}, lambda: f"{ctx.args.queue}: {state}")


def cmd_consumers(ctx: Ctx) -> None:
    ctx.queue(ctx.args.queue)
    if ctx.args.prune:
        ctx.confirm(f"prune dead consumers of {ctx.args.queue!r}")
        pruned = ctx.admin.prune(ctx.args.queue, ctx.args.dead_after)
        ctx.out({"pruned": pruned}, lambda: f"pruned: {', '.join(pruned) or 'none'}")
        return
    rows = ctx.admin.consumers(ctx.args.queue)
    ctx.out(rows, lambda: _table([{**_plain(c), "idle_s": f"{c.idle_s:.1f}",
                                   "heartbeat_age_s": "-" if c.heartbeat_age_s is None
                                   else f"{c.heartbeat_age_s:.1f}"} for c in rows],
                                 ["name", "pending", "idle_s", "heartbeat_age_s", "alive"]))


def cmd_purge(ctx: Ctx) -> None:
    ctx.queue(ctx.args.queue)
    ctx.confirm(f"delete every {ctx.args.state} job of {ctx.args.queue!r}")
    n = ctx.admin.purge(ctx.args.queue, ctx.args.state, shard=ctx.shard)
    ctx.out({"purged": n, "state": ctx.args.state}, lambda: f"purged {n} {ctx.args.state} jobs")


def _payload(text: str) -> Any:
    """JSON from the argument, from a file (``@path``) or from stdin (``-``)."""
    where = "payload"
    if text == "-":
        text, where = sys.stdin.read(), "payload from stdin"
    elif text.startswith("@"):
        path = text[1:]
        try:
            with open(path, encoding="utf-8") as f:
                text = f.read()
        except OSError as exc:
            raise InvalidArgument(f"cannot read the payload file {path!r}: {exc.strerror}"
                                  ) from None
        where = f"payload in {path}"
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        raise InvalidArgument(f"{where} is not valid JSON: {exc}") from None


def _instant(text: str) -> dt.datetime:
    """An ISO 8601 time; without an offset it is UTC."""
    try:
        t = dt.datetime.fromisoformat(text)
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"not an ISO 8601 time: {text!r} (e.g. 2030-01-31T09:00:00+01:00)") from None
    return t if t.tzinfo else t.replace(tzinfo=dt.UTC)


def _header(text: str) -> tuple[str, str]:
    key, sep, value = text.partition("=")
    if not sep or not key:
        raise argparse.ArgumentTypeError(f"a header is KEY=VALUE, got {text!r}")
    return key, value


def cmd_enqueue(ctx: Ctx) -> None:
    a = ctx.args
    payload = _payload(a.payload) if a.payload is not None else None
    if not a.create:
        try:
            ctx.queue(a.queue)
        except UnknownQueue as exc:
            raise UnknownQueue(f"{exc} (--create enqueues on a new queue)") from None
    q = Queue(ctx.admin.client, a.queue, ctx.config)
    options: dict[str, Any] = {}
    for name in ("delay", "run_at", "max_attempts", "result_ttl", "idempotency_key",
                 "version"):
        if getattr(a, name) is not None:
            options[name] = getattr(a, name)
    if a.deadline is not None:
        options["deadline"] = a.deadline
    if a.id:
        options["job_id"] = a.id
    if a.header:
        options["headers"] = dict(a.header)
    res = q.enqueue(a.type, payload, **options)
    ctx.out(res, lambda: f"{res.job_id}: {res.status}"
            + (f" (existing job is {res.state})" if res.status == "duplicate" else ""))


def cmd_queues(ctx: Ctx) -> None:
    if ctx.args.action == "list":
        names = ctx.admin.queues()
        ctx.out(names, lambda: "\n".join(names) or "(none)")
        return
    name = ctx.args.queue
    if not name:
        raise InvalidArgument("queues forget needs a queue name")
    if ctx.config.shards > 1 and not ctx.args.force:  # jobs in any shard keep it known
        try:
            st = ctx.admin.stats(name)
        except UnknownQueue:
            st = None
        jobs = 0 if st is None else st.ready + st.pending + st.scheduled + st.retrying + st.dead
        if st is not None and (jobs or st.workers_alive):
            raise InvalidArgument(
                f"queue {name!r} still has {jobs} jobs over its {ctx.config.shards} shards and"
                f" {st.workers_alive} live workers; purge them first, or forget it anyway"
                " with --force (its keys stay)")
    removed = forget(ctx.admin.client, Keys(name, ctx.config.key_prefix), force=ctx.args.force)
    if not removed:
        ctx.queue(name)  # not known at all: the usual "did you mean"
    ctx.out({"queue": name, "forgotten": removed},
            lambda: f"{name}: forgotten" if removed else f"{name}: was not in the known queues")


def _ms_iso(ms: Any) -> str | None:
    if not isinstance(ms, int | float) or ms <= 0:
        return None
    return dt.datetime.fromtimestamp(ms / 1000, dt.UTC).isoformat(timespec="seconds")


def cmd_cron(ctx: Ctx) -> None:
    queues = [ctx.queue(q) for q in ctx.args.queues] or ctx.admin.queues()
    rows: list[dict[str, Any]] = []
    for qname in queues:
        raw: Any = ctx.admin.client.hgetall(Keys(qname, ctx.config.key_prefix).cron)
        for field, value in sorted(raw.items()):
            name = field.decode()
            if name.endswith(":last"):
                continue
            try:
                info = json.loads(value)
            except ValueError:
                continue
            last = _ms_iso(info.get("last_tick_ms"))
            rows.append({"name": name, "queue": info.get("queue", qname),
                         "schedule": info.get("expr") or (f"every {info['every']:g}s"
                                                          if info.get("every") else ""),
                         "tz": info.get("tz"), "job_type": info.get("job_type"),
                         "last": last, "last_job": info.get("last_job"),
                         "next": _ms_iso(info.get("next_tick_ms"))})
    ctx.out(rows, lambda: _table(rows, ["name", "queue", "schedule", "tz", "job_type", "last",
                                        "next", "last_job"]))


COMMANDS: dict[str, Callable[[Ctx], None]] = {
    "stats": cmd_stats, "pending": cmd_pending, "job": cmd_job, "flow": cmd_flow, "dead": cmd_dead,
    "requeue": cmd_requeue, "cancel": cmd_cancel, "pause": cmd_pause, "resume": cmd_pause,
    "consumers": cmd_consumers, "purge": cmd_purge, "enqueue": cmd_enqueue,
    "queues": cmd_queues, "cron": cmd_cron, "groups": cmd_groups, "find": cmd_find,
    "reshard": cmd_reshard,
}


def _shard_option(p: argparse.ArgumentParser) -> None:
    p.add_argument("--shard", type=int, default=None, metavar="I",
                   help="only shard I (0..shards-1) of a sharded queue (default: all)")


def add_parsers(sub: Any, common: argparse.ArgumentParser) -> None:
    p = sub.add_parser("stats", parents=[common], help="queue depths, counters, consumers")
    p.add_argument("queues", nargs="*", default=None)
    p.add_argument("--watch", type=_duration, nargs="?", const=2.0, default=None,
                   help="refresh in place every N seconds (default 2)")
    p.add_argument("--count", type=int, default=0, help="with --watch: stop after N refreshes")
    _shard_option(p)
    p = sub.add_parser("pending", parents=[common], help="delivered, unsettled entries")
    p.add_argument("queue")
    p.add_argument("--idle", type=_duration, help="only entries idle at least this long")
    p.add_argument("--consumer")
    p.add_argument("--limit", type=page_limit, default=100, help="items per page (<= 1000)")
    p.add_argument("--cursor")
    _shard_option(p)
    p = sub.add_parser("job", parents=[common], help="a job's whole record and error history")
    p.add_argument("queue")
    p.add_argument("job_id")
    p = sub.add_parser("flow", parents=[common],
                       help="a job's dependencies, what blocks it, the jobs waiting for it")
    p.add_argument("queue")
    p.add_argument("job_id")
    p.add_argument("--limit", type=page_limit, default=100, help="edges per page (<= 1000)")
    p.add_argument("--cursor")
    p = sub.add_parser("dead", parents=[common], help="dead letters: list, show, redrive, purge")
    p.add_argument("action", choices=["list", "show", "redrive", "purge"])
    p.add_argument("queue")
    p.add_argument("job_id", nargs="?")
    p.add_argument("--type", help="only this job type")
    p.add_argument("--error", help="only this error class (e.g. TimeoutError)")
    p.add_argument("--older-than", type=_duration)
    p.add_argument("--newer-than", type=_duration)
    p.add_argument("--limit", type=page_limit, default=100, help="items per page (<= 1000)")
    p.add_argument("--cursor")
    _shard_option(p)
    for name, text in [("requeue", "hand a stuck pending job back now"),
                       ("cancel", "cancel a job (a running one: its worker stops it)")]:
        p = sub.add_parser(name, parents=[common], help=text)
        p.add_argument("queue")
        p.add_argument("job_id")
    p.add_argument("--wait", type=_duration, default=None, metavar="DURATION",
                   help="a running job: wait this long for it to stop and say how it ended")
    for name, text in [("pause", "workers stop fetching (in-flight jobs finish)"),
                       ("resume", "workers fetch again")]:
        p = sub.add_parser(name, parents=[common], help=text)
        p.add_argument("queue")
    p = sub.add_parser("consumers", parents=[common], help="consumers of the group")
    p.add_argument("queue")
    p.add_argument("--prune", action="store_true", help="delete dead consumers with no pending")
    p.add_argument("--dead-after", type=_duration, default=600.0)
    p = sub.add_parser("purge", parents=[common], help="delete every job in a state")
    p.add_argument("queue")
    p.add_argument("--state", required=True, choices=["queued", "scheduled", "retrying", "failed"])
    _shard_option(p)
    p = sub.add_parser("enqueue", parents=[common], help="enqueue one job")
    p.add_argument("queue")
    p.add_argument("type")
    p.add_argument("payload", nargs="?", help="JSON, @file with JSON, or - to read stdin")
    p.add_argument("--id", help="job id (an existing one answers as a duplicate)")
    p.add_argument("--delay", type=_duration, help="run no earlier than now + D")
    p.add_argument("--run-at", type=_instant, help="ISO 8601 time (UTC without an offset)")
    p.add_argument("--deadline", type=_duration, help="dead-letter if not started within D")
    p.add_argument("--max-attempts", type=int)
    p.add_argument("--result-ttl", type=_duration)
    p.add_argument("--idempotency-key")
    p.add_argument("--header", action="append", type=_header, metavar="KEY=VALUE")
    p.add_argument("--version", type=int)
    p.add_argument("--create", action="store_true",
                   help="allow a queue that does not exist yet (else refused as a typo)")
    p = sub.add_parser("queues", parents=[common], help="known queues: list, forget")
    p.add_argument("action", choices=["list", "forget"])
    p.add_argument("queue", nargs="?")
    p.add_argument("--force", action="store_true",
                   help="forget even while the queue has jobs or live workers")
    _add_groups(sub, common)
    _add_find(sub, common)
    _add_reshard(sub, common)
    p = sub.add_parser("cron", parents=[common],
                       help="cron entries of the scheduler: schedule, last and next fire")
    p.add_argument("action", choices=["list"])
    p.add_argument("queues", nargs="*")
