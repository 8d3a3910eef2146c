"""``streamq dashboard``: serve the web dashboard with uvicorn (needs the dashboard extra).

Kept out of ``streamq.dashboard`` so the command line works without the extra installed."""

from __future__ import annotations

import argparse
import os
import sys
from typing import Any


def _serve(args: argparse.Namespace) -> int:
    try:
        import uvicorn

        from ..dashboard import DashboardConfig, create_app
    except ImportError as exc:
        raise SystemExit(f"streamq dashboard needs the dashboard extra: pip install"
                         f" 'streamq[dashboard]' ({exc})") from None
    from .._core.config import QueueConfig

    secret = os.environ.get("STREAMQ_DASHBOARD_SECRET")
    cfg = DashboardConfig(read_only=args.read_only, page_size=args.page_size,
                          queues=tuple(args.queue or ()),
                          secret=secret.encode() if secret else None,
                          queue_config=QueueConfig(key_prefix=args.prefix,
                                                   events_maxlen=args.events_maxlen,
                                                   shards=args.shards))
    app = create_app(args.url, config=cfg, cluster=args.cluster)
    if args.host not in ("127.0.0.1", "localhost", "::1") and not args.read_only:
        print(f"streamq dashboard: listening on {args.host}, not loopback, with actions on;"
              " put it behind authentication (docs/dashboard.md)", file=sys.stderr)
    where = f"http://{args.host}:{args.port}/"
    behind = f"; links say {args.root_path}/, for a proxy that strips it" if args.root_path else ""
    print(f"streamq dashboard on {where}{behind} (Ctrl-C stops it)", file=sys.stderr)
    uvicorn.run(app, host=args.host, port=args.port, root_path=args.root_path,
                log_level="warning", proxy_headers=False)
    return 0


def add_parser(sub: Any, common: argparse.ArgumentParser) -> None:
    p = sub.add_parser("dashboard", parents=[common],
                       help="serve the web dashboard (needs the dashboard extra)")
    p.add_argument("--host", default="127.0.0.1", help="address to bind (default loopback)")
    p.add_argument("--port", type=int, default=8080, help="default 8080")
    p.add_argument("--read-only", action="store_true", help="hide and refuse every action")
    p.add_argument("--root-path", default="",
                   help="the path a reverse proxy serves it under (and strips), e.g. /ops")
    p.add_argument("--page-size", type=int, default=50, help="rows per listing page (1-1000)")
    p.add_argument("--queue", action="append",
                   help="also show this queue (one only producers used; repeatable)")
    p.set_defaults(func=_serve)
