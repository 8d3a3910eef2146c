"""``streamq health``: is a worker of this host alive? For container health checks.

A worker stamps a heartbeat per queue every ``heartbeat_interval_s`` (5 s) from a loop that
outlives every error, on the Redis server's clock. The check reads the consumers of each
queue's group and their heartbeats (two round trips) and passes when at least
``--min-workers`` consumers named after this host (a worker's name is
``host:pid:n:random``; in a container the host name is the container's or the pod's) have a
heartbeat younger than ``--max-age``. ``--any-host`` counts the workers of every host (a check
from outside). Exit status 0 when healthy, 1 when not (one line says why), as Docker's
HEALTHCHECK and Kubernetes' exec probes expect.
"""

from __future__ import annotations

import argparse
import json
import socket
from typing import Any

from .._core.config import QueueConfig
from ..admin import Admin


def check(admin: Admin, queues: list[str], host: str | None, max_age_s: float,
          min_workers: int) -> tuple[bool, list[dict[str, Any]]]:
    """(healthy, one row per queue: the live workers counted and the youngest heartbeat)."""
    rows = []
    for queue in queues:
        found = admin.workers(queue)
        mine = [w for w in found if host is None or w.name.startswith(f"{host}:")]
        live = [w for w in mine
                if w.heartbeat_age_s is not None and w.heartbeat_age_s <= max_age_s]
        ages = [w.heartbeat_age_s for w in mine if w.heartbeat_age_s is not None]
        rows.append({"queue": queue, "workers": len(live),
                     "heartbeat_age_s": round(min(ages), 3) if ages else None,
                     "healthy": len(live) >= min_workers})
    return all(r["healthy"] for r in rows), rows


def _health(args: argparse.Namespace) -> int:
    if args.max_age <= 0 or args.min_workers < 1:
        raise SystemExit("streamq health: --max-age must be more than 0 seconds and"
                         " --min-workers at least 1")
    host = None if args.any_host else (args.host or socket.gethostname())
    admin = Admin.from_url(args.url, QueueConfig(key_prefix=args.prefix, shards=args.shards),
                           socket_timeout_s=args.timeout)
    try:
        ok, rows = check(admin, args.queue, host, args.max_age, args.min_workers)
    finally:
        admin.close()
    if args.json:
        print(json.dumps({"healthy": ok, "host": host, "queues": rows}))
        return 0 if ok else 1
    where = "any host" if host is None else f"host {host}"
    for r in rows:
        age = "no heartbeat" if r["heartbeat_age_s"] is None else (
            f"last heartbeat {r['heartbeat_age_s']:.1f} s ago")
        state = "healthy" if r["healthy"] else "unhealthy"
        print(f"{state}: {r['workers']} live worker(s) of {r['queue']!r} on {where}"
              f" (at least {args.min_workers} wanted, heartbeat within {args.max_age:g} s;"
              f" {age})")
    return 0 if ok else 1


def add_parser(sub: Any, common: argparse.ArgumentParser) -> None:
    p = sub.add_parser("health", parents=[common],
                       help="exit 0 when a worker of this host has a recent heartbeat"
                       " (container health checks)")
    p.add_argument("--queue", action="append", required=True,
                   help="a queue the worker serves (repeatable: every one must be served)")
    p.add_argument("--max-age", type=float, default=30.0, metavar="SECONDS",
                   help="a heartbeat older than this does not count (default 30; workers"
                   " beat every 5 s)")
    p.add_argument("--min-workers", type=int, default=1, metavar="N",
                   help="live workers wanted (default 1; with --processes N, N)")
    p.add_argument("--host", help="the host name in the workers' names (default this host's)")
    p.add_argument("--any-host", action="store_true", help="count the workers of every host")
    p.add_argument("--timeout", type=float, default=5.0, metavar="SECONDS",
                   help="Redis socket timeout (default 5)")
    p.set_defaults(func=_health)
