"""The ``streamq`` command line (``python -m streamq`` works the same)."""

from __future__ import annotations

import argparse
import asyncio
import importlib
import json
import logging
import os
import sys
from collections.abc import Sequence
from typing import Any

from ._config import QueueConfig, WorkerConfig
from ._registry import Registry


def _import_attr(spec: str, what: str) -> Any:
    """Import ``module:attribute`` named on the command line (code comes from code, never from
    data in Redis)."""
    module_name, _, attr = spec.partition(":")
    if not module_name or not attr:
        raise SystemExit(f"streamq: {what} must be given as module:attribute, got {spec!r}")
    sys.path.insert(0, os.getcwd())
    try:
        return getattr(importlib.import_module(module_name), attr)
    except (ImportError, AttributeError) as exc:
        raise SystemExit(f"streamq: cannot load {what} {spec!r}: {exc}") from exc


def load_registry(spec: str) -> Registry:
    obj = _import_attr(spec, "registry")
    if not isinstance(obj, Registry):
        raise SystemExit(f"streamq: {spec!r} is a {type(obj).__name__}, not a streamq.Registry")
    return obj


def _worker(args: argparse.Namespace) -> int:
    from ._worker import Worker

    registry = load_registry(args.registry)
    cfg = WorkerConfig(concurrency=args.concurrency, visibility_timeout_s=args.visibility_timeout,
                       grace_period_s=args.grace_period, promote=not args.no_promote)
    qcfg = QueueConfig(key_prefix=args.prefix, events_maxlen=args.events_maxlen)
    Worker(args.url, args.queue, registry, cfg, qcfg).run()
    return 0


def _load_cron(spec: str) -> list[Any]:
    from schedulers import Cron

    obj = _import_attr(spec, "cron schedule")
    entries = list(obj) if isinstance(obj, (list, tuple)) else [obj]
    if not all(isinstance(e, Cron) for e in entries):
        raise SystemExit(f"streamq: {spec!r} must be a schedulers.Cron or a list of them")
    return entries


def _scheduler(args: argparse.Namespace) -> int:
    from schedulers import Scheduler, SchedulerConfig

    cron = [e for spec in args.cron or [] for e in _load_cron(spec)]
    if not args.queue and not cron:
        raise SystemExit("streamq scheduler: give at least one --queue or --cron")
    cfg = SchedulerConfig(poll_interval_s=args.poll_interval,
                          visibility_timeout_s=args.visibility_timeout)
    qcfg = QueueConfig(key_prefix=args.prefix, events_maxlen=args.events_maxlen)
    asyncio.run(Scheduler(args.url, args.queue or [], cron, cfg, qcfg).run())
    return 0


def _export(args: argparse.Namespace) -> int:
    try:
        from pyspark.sql import SparkSession

        from .spark import export_events
    except ImportError:
        raise SystemExit("streamq export needs the spark extra: pip install 'streamq[spark]'"
                         " (and Java 17)") from None
    spark = (SparkSession.builder.master(args.master).appName("streamq-export")
             .config("spark.ui.enabled", "false").getOrCreate())
    spark.sparkContext.setLogLevel("ERROR")
    try:
        result = export_events(spark, url=args.url, queue=args.queue, to=args.to,
                               key_prefix=args.prefix, partitions=args.partitions,
                               cluster=args.cluster)
    finally:
        spark.stop()
    if args.json:
        print(json.dumps(result))
    else:
        print(f"exported {result['exported']} events to {args.to}/events"
              f" (checkpoint {result['last_event_id']})")
        if result["gap"]:
            print("warning: some events were trimmed before they could be exported; raise"
                  " --events-maxlen (QueueConfig.events_maxlen) or export more often")
    return 0


def _demo(args: argparse.Namespace) -> int:
    from ._demo import run_demo

    return run_demo(args.url, args.jobs)


def build_parser() -> argparse.ArgumentParser:
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--url", default=os.environ.get("STREAMQ_URL", "redis://localhost:6379/0"),
                        help="redis://[user:password@]host:port/db, rediss:// for TLS,"
                        " unix:///path.sock; default $STREAMQ_URL")
    common.add_argument("--prefix", default=os.environ.get("STREAMQ_PREFIX", "streamq"),
                        help="key prefix (default streamq)")
    common.add_argument("--json", action="store_true", help="machine-readable output")
    common.add_argument("--yes", "-y", action="store_true",
                        help="do not ask before bulk or destructive changes")
    common.add_argument("--debug", action="store_true", help="show tracebacks")
    common.add_argument("--events-maxlen", type=int, default=QueueConfig().events_maxlen,
                        help="approximate cap of the lifecycle events stream (0 = no events);"
                        " keep it the same for producers, workers and schedulers")
    p = argparse.ArgumentParser(prog="streamq", description="streamq job engine")
    p.add_argument("--log-level", default=os.environ.get("STREAMQ_LOG_LEVEL", "INFO"))
    sub = p.add_subparsers(dest="command", required=True)
    w = sub.add_parser("worker", parents=[common], help="run a worker process")
    w.add_argument("registry", help="module:attribute of a streamq.Registry")
    w.add_argument("--queue", action="append", required=True, help="queue name (repeatable)")
    w.add_argument("--concurrency", type=int, default=64)
    w.add_argument("--visibility-timeout", type=float, default=30.0, help="seconds")
    w.add_argument("--grace-period", type=float, default=10.0, help="seconds")
    w.add_argument("--no-promote", action="store_true",
                   help="leave promotion of delayed jobs to a scheduler daemon")
    w.set_defaults(func=_worker)
    s = sub.add_parser("scheduler", parents=[common],
                       help="run the scheduler daemon (delayed jobs, cron, sweeps)")
    s.add_argument("--queue", action="append", help="queue name (repeatable)")
    s.add_argument("--cron", action="append", help="module:attribute of Cron entries (repeatable)")
    s.add_argument("--poll-interval", type=float, default=30.0, help="seconds")
    s.add_argument("--visibility-timeout", type=float, default=30.0, help="seconds")
    s.set_defaults(func=_scheduler)
    e = sub.add_parser("export", parents=[common],
                       help="append new lifecycle events to Parquet (needs the spark extra)")
    e.add_argument("queue")
    e.add_argument("--to", required=True, help="output directory (keeps a checkpoint there)")
    e.add_argument("--master", default="local[*]", help="Spark master (default local[*])")
    e.add_argument("--partitions", type=int, default=8, help="parallel id ranges (default 8)")
    e.add_argument("--cluster", action="store_true", help="--url is a Redis Cluster node")
    e.set_defaults(func=_export)
    d = sub.add_parser("demo", parents=[common],
                       help="a self-contained tour (starts its own Redis without --url)")
    d.set_defaults(url=os.environ.get("STREAMQ_URL"))
    d.add_argument("--jobs", type=int, default=2000)
    d.set_defaults(func=_demo)
    from ._cli_ops import add_parsers

    add_parsers(sub, common)
    return p


def _explain(exc: BaseException, url: str) -> str:
    """One line a person can act on."""
    from redis import exceptions as rx

    from ._cli_ops import redact
    from ._errors import StreamqError

    where = redact(url)
    text = str(exc)
    if isinstance(exc, rx.AuthenticationError) or "WRONGPASS" in text or "NOAUTH" in text:
        return (f"authentication failed at {where}: wrong password or ACL user; put them in"
                " the URL: redis://user:password@host:port/db")
    if (isinstance(exc, rx.NoPermissionError) or "NOPERM" in text
            or isinstance(exc.__cause__, rx.NoPermissionError)):  # inside a ScriptError
        return f"the ACL user at {where} may not run this command or touch these keys: {text}"
    if isinstance(exc, rx.ConnectionError | rx.TimeoutError):
        return (f"cannot reach Redis at {where} ({text}); is the server running and is"
                " --url (or STREAMQ_URL) right?")
    if isinstance(exc, StreamqError | ValueError):
        return text
    if isinstance(exc, rx.ResponseError):
        return f"Redis answered with an error: {text}"
    return f"{type(exc).__name__}: {text}"


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    logging.basicConfig(level=args.log_level.upper() if args.command in ("worker", "scheduler")
                        else "ERROR", format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    try:
        if hasattr(args, "func"):
            rc: int = args.func(args)
            return rc
        from ._cli_ops import COMMANDS, Ctx

        ctx = Ctx(args)
        try:
            COMMANDS[args.command](ctx)
        finally:
            ctx.admin.close()
        return 0
    except KeyboardInterrupt:
        return 130
    except SystemExit:
        raise
    except Exception as exc:
        if args.debug:
            raise
        print(f"streamq: {_explain(exc, str(args.url or ''))}", file=sys.stderr)
        return 1
