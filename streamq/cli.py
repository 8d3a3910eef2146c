"""The ``streamq`` command line (``python -m streamq`` works the same)."""

from __future__ import annotations

import argparse
import asyncio
import importlib
import logging
import os
import sys
from collections.abc import Sequence
from typing import Any

from ._config import WorkerConfig
from ._registry import Registry


def load_registry(spec: str) -> Registry:
    """Import ``module:attribute`` and check it is a Registry (code comes from code, not data)."""
    module_name, _, attr = spec.partition(":")
    if not module_name or not attr:
        raise SystemExit(f"streamq: registry must be given as module:attribute, got {spec!r}")
    sys.path.insert(0, os.getcwd())
    try:
        obj = getattr(importlib.import_module(module_name), attr)
    except (ImportError, AttributeError) as exc:
        raise SystemExit(f"streamq: cannot load registry {spec!r}: {exc}") from exc
    if not isinstance(obj, Registry):
        raise SystemExit(f"streamq: {spec!r} is a {type(obj).__name__}, not a streamq.Registry")
    return obj


def _worker(args: argparse.Namespace) -> int:
    from ._worker import Worker

    registry = load_registry(args.registry)
    cfg = WorkerConfig(concurrency=args.concurrency, visibility_timeout_s=args.visibility_timeout,
                       grace_period_s=args.grace_period, promote=not args.no_promote)
    Worker(args.url, args.queue, registry, cfg).run()
    return 0


def _load_cron(spec: str) -> list[Any]:
    from schedulers import Cron

    module_name, _, attr = spec.partition(":")
    if not module_name or not attr:
        raise SystemExit(f"streamq: --cron must be given as module:attribute, got {spec!r}")
    sys.path.insert(0, os.getcwd())
    try:
        obj = getattr(importlib.import_module(module_name), attr)
    except (ImportError, AttributeError) as exc:
        raise SystemExit(f"streamq: cannot load cron schedule {spec!r}: {exc}") from exc
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
    asyncio.run(Scheduler(args.url, args.queue or [], cron, cfg).run())
    return 0


def _demo(args: argparse.Namespace) -> int:
    from ._demo import run_demo

    return run_demo(args.url, args.jobs)


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="streamq", description="streamq job engine")
    p.add_argument("--log-level", default=os.environ.get("STREAMQ_LOG_LEVEL", "INFO"))
    sub = p.add_subparsers(dest="command", required=True)
    w = sub.add_parser("worker", help="run a worker process")
    w.add_argument("registry", help="module:attribute of a streamq.Registry")
    w.add_argument("--url", default=os.environ.get("STREAMQ_URL", "redis://localhost:6379/0"))
    w.add_argument("--queue", action="append", required=True, help="queue name (repeatable)")
    w.add_argument("--concurrency", type=int, default=64)
    w.add_argument("--visibility-timeout", type=float, default=30.0, help="seconds")
    w.add_argument("--grace-period", type=float, default=10.0, help="seconds")
    w.add_argument("--no-promote", action="store_true",
                   help="leave promotion of delayed jobs to a scheduler daemon")
    w.set_defaults(func=_worker)
    s = sub.add_parser("scheduler", help="run the scheduler daemon (delayed jobs, cron, sweeps)")
    s.add_argument("--url", default=os.environ.get("STREAMQ_URL", "redis://localhost:6379/0"))
    s.add_argument("--queue", action="append", help="queue name (repeatable)")
    s.add_argument("--cron", action="append", help="module:attribute of Cron entries (repeatable)")
    s.add_argument("--poll-interval", type=float, default=30.0, help="seconds")
    s.add_argument("--visibility-timeout", type=float, default=30.0, help="seconds")
    s.set_defaults(func=_scheduler)
    d = sub.add_parser("demo", help="a self-contained tour (starts its own Redis without --url)")
    d.add_argument("--url", default=os.environ.get("STREAMQ_URL"))
    d.add_argument("--jobs", type=int, default=2000)
    d.set_defaults(func=_demo)
    return p


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    logging.basicConfig(level=args.log_level.upper() if args.command != "demo" else "ERROR",
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    rc: int = args.func(args)
    return rc
