"""The ``streamq`` command line (``python -m streamq`` works the same)."""

from __future__ import annotations

import argparse
import asyncio
import importlib
import json
import logging
import math
import os
import sys
import traceback
from collections.abc import Sequence
from typing import Any

from .._core.config import ALL_EVENTS, DEFAULT_EVENTS, QueueConfig, WorkerConfig
from .._core.errors import InvalidArgument
from .._worker.registry import Registry


def _where(exc: BaseException) -> str:
    """'at path/to/module.py line N' for the deepest frame outside importlib and streamq."""
    if isinstance(exc, SyntaxError) and exc.filename:
        return f" at {exc.filename} line {exc.lineno}"
    frames = [f for f in traceback.extract_tb(exc.__traceback__)
              if "importlib" not in f.filename and not f.filename.startswith("<frozen")
              and os.path.dirname(f.filename) != os.path.dirname(__file__)]
    if not frames:
        return ""
    return f" at {frames[-1].filename} line {frames[-1].lineno}"


def _import_attr(spec: str, what: str, debug: bool = False) -> Any:
    """Import ``module:attribute`` named on the command line (code comes from code, never from
    data in Redis). Errors name the module, the file and line (the traceback with --debug)."""
    from .hints import module_hint

    hint = module_hint(spec)
    if hint is not None:
        raise SystemExit(f"streamq: {what} must be given as module:attribute, not a file"
                         f" path: write {hint} (run from the directory that holds the"
                         f" package), got {spec!r}")
    module_name, _, attr = spec.partition(":")
    if not module_name or not attr:
        raise SystemExit(f"streamq: {what} must be given as module:attribute (e.g."
                         f" myapp.tasks:registry), got {spec!r}")
    sys.path.insert(0, os.getcwd())
    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as exc:
        if exc.name is not None and (module_name + ".").startswith(exc.name + "."):
            raise SystemExit(
                f"streamq: cannot load {what} {spec!r}: no module named {exc.name!r} (looked"
                f" in {os.getcwd()} and on sys.path; run from your project's directory or"
                " set PYTHONPATH)") from None
        if debug:
            traceback.print_exc()
        raise SystemExit(f"streamq: cannot load {what} {spec!r}: importing {module_name}"
                         f" failed{_where(exc)}: {type(exc).__name__}: {exc}") from None
    except Exception as exc:  # noqa: BLE001 - SyntaxError, NameError, ...: the module's own
        if debug:
            traceback.print_exc()
        hint = "" if debug else " (--debug shows the traceback)"
        raise SystemExit(f"streamq: cannot load {what} {spec!r}: importing {module_name}"
                         f" failed{_where(exc)}: {type(exc).__name__}: {exc}{hint}") from None
    try:
        return getattr(module, attr)
    except AttributeError:
        found = sorted(n for n in vars(module) if not n.startswith("_"))[:10]
        raise SystemExit(f"streamq: cannot load {what} {spec!r}: module {module_name}"
                         f" ({getattr(module, '__file__', '?')}) has no attribute {attr!r};"
                         f" it has {', '.join(found) or 'nothing public'}") from None


def load_registry(spec: str, debug: bool = False) -> Registry:
    obj = _import_attr(spec, "registry", debug)
    if not isinstance(obj, Registry):
        raise SystemExit(f"streamq: {spec!r} is a {type(obj).__name__}, not a streamq.Registry")
    return obj


def _serve_metrics(args: argparse.Namespace, service: str) -> None:
    """--metrics-port: before the user's modules load (the first MeterProvider stays)."""
    if args.metrics_interval <= 0:
        raise SystemExit("streamq: --metrics-interval must be more than 0 seconds")
    if args.metrics_port is not None:
        from .._ops.metrics import serve
        from .processes import report_metrics_port

        if not report_metrics_port(lambda port: serve("127.0.0.1", port, service)[1]):
            serve(args.metrics_host, args.metrics_port, service)


def _reloading(args: argparse.Namespace, specs: list[str], what: str) -> int | None:
    """--reload: run the command in a child process that restarts on code changes."""
    from .reload import is_child, run_reloading

    if not args.reload or is_child():
        return None
    return run_reloading(args.argv, specs, what)


def _worker(args: argparse.Namespace) -> int:
    from .._worker import Worker

    if (rc := _reloading(args, [args.registry], "worker")) is not None:
        return rc
    if args.processes is not None:
        from .processes import child_slot, run_processes

        if child_slot() is None:
            if args.metrics_interval <= 0:
                raise SystemExit("streamq: --metrics-interval must be more than 0 seconds")
            return run_processes(args.argv, args.processes, args.metrics_host,
                                 args.metrics_port)
    _serve_metrics(args, "streamq-worker")
    registry = load_registry(args.registry, args.debug)
    try:
        cfg = WorkerConfig(concurrency=args.concurrency,
                           visibility_timeout_s=args.visibility_timeout,
                           grace_period_s=args.grace_period, promote=not args.no_promote,
                           gauges_interval_s=args.metrics_interval, pool=args.pool,
                           pool_size=args.pool_size, pool_registry=args.registry,
                           max_jobs_per_child=args.max_jobs_per_child,
                           max_memory_per_child_mb=args.max_memory_per_child,
                           start_wait_s=args.start_wait)
    except InvalidArgument as exc:
        raise SystemExit(f"streamq: {exc}") from None
    qcfg = queue_config(args)
    Worker(args.url, args.queue, registry, cfg, qcfg).run()
    return 0


def event_kinds(value: str) -> frozenset[str]:
    """``--events``: 'default' (DEFAULT_EVENTS), 'all' (ALL_EVENTS) or kinds separated by
    commas (checked by QueueConfig)."""
    if value == "default":
        return DEFAULT_EVENTS
    if value == "all":
        return ALL_EVENTS
    return frozenset(k.strip() for k in value.split(",") if k.strip())


def queue_config(args: argparse.Namespace) -> QueueConfig:
    """The QueueConfig a worker or scheduler command runs with."""
    try:
        return QueueConfig(key_prefix=args.prefix, events_maxlen=args.events_maxlen,
                           shards=args.shards, event_kinds=event_kinds(args.events),
                           group_concurrency=args.group_concurrency)
    except InvalidArgument as exc:
        raise SystemExit(f"streamq: {exc}") from None


def _load_cron(spec: str, debug: bool = False) -> list[Any]:
    from schedulers import Cron

    obj = _import_attr(spec, "cron schedule", debug)
    entries = list(obj) if isinstance(obj, (list, tuple)) else [obj]
    if not all(isinstance(e, Cron) for e in entries):
        raise SystemExit(f"streamq: {spec!r} must be a schedulers.Cron or a list of them")
    return entries


def _scheduler(args: argparse.Namespace) -> int:
    from schedulers import Scheduler, SchedulerConfig

    from .._ops.metrics import run_scheduler

    if (rc := _reloading(args, list(args.cron or []), "scheduler")) is not None:
        return rc
    _serve_metrics(args, "streamq-scheduler")
    cron = [e for spec in args.cron or [] for e in _load_cron(spec, args.debug)]
    if not args.queue and not cron:
        raise SystemExit("streamq scheduler: give at least one --queue or --cron")
    cfg = SchedulerConfig(poll_interval_s=args.poll_interval,
                          visibility_timeout_s=args.visibility_timeout,
                          start_wait_s=args.start_wait)
    qcfg = queue_config(args)
    scheduler = Scheduler(args.url, args.queue or [], cron, cfg, qcfg)
    interval = args.metrics_interval if args.metrics_port is not None else None
    asyncio.run(run_scheduler(scheduler, interval))
    return 0


def _export(args: argparse.Namespace) -> int:
    try:
        from pyspark.sql import SparkSession

        from ..spark import export_events
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


def run_web_demo(url: str | None, host: str, port: int, prefix: str = "streamq") -> int:
    try:
        import uvicorn

        from .demo_panel import demo_app
    except ImportError as exc:
        raise SystemExit(f"streamq demo --web needs the dashboard extra: pip install"
                         f" 'streamq[dashboard]' ({exc})") from None
    from .._core.server import RedisServer
    from .demo_procs import interrupt_on_sigterm

    # uvicorn stops on SIGTERM, then raises it again under the handler it found: ours turns
    # it into KeyboardInterrupt, so the private server is closed below (the default handler
    # would end the process there and then, and leave redis-server running)
    with interrupt_on_sigterm():
        server = RedisServer().start() if url is None else None
        try:
            def ready() -> None:
                print(f"streamq web demo: open http://{host}:{port}/queue?q=demo&tab=charts"
                      f" (the demo queue's charts, its jobs in the other tabs; the demo panel:"
                      f" http://{host}:{port}/demo). Ctrl-C stops it.",
                      file=sys.stderr, flush=True)

            print("streamq web demo: seeding the demo queue and starting its workers ...",
                  file=sys.stderr, flush=True)
            app = demo_app(server.url if server else url or "", prefix, on_ready=ready)
            uvicorn.run(app, host=host, port=port, log_level="warning")
        finally:
            if server is not None:
                server.close()
    return 0


def _demo(args: argparse.Namespace) -> int:
    if args.web:
        return run_web_demo(args.url, args.host, args.port, args.prefix)
    from .demo import run_demo

    return run_demo(args.url, args.jobs)


def _common_options(parser: argparse.ArgumentParser, suppress: bool) -> None:
    """The options every command takes, before or after the command name: the main parser
    holds the defaults, each subcommand the same options with defaults suppressed (so an
    option given before the command is not reset by the subcommand)."""

    def d(value: Any) -> Any:
        return argparse.SUPPRESS if suppress else value

    parser.add_argument("--url", default=d(None),
                        help="redis://[user:password@]host:port/db, rediss:// for TLS,"
                        " unix:///path.sock, redis+cluster://host:port[,host:port...] for a"
                        " Redis Cluster; default $STREAMQ_URL, else redis://localhost:6379/0")
    parser.add_argument("--cluster", action="store_true", default=d(False),
                        help="--url is one node of a Redis Cluster (the same as writing it"
                        " redis+cluster://host:port)")
    parser.add_argument("--prefix", default=d(os.environ.get("STREAMQ_PREFIX", "streamq")),
                        help="key prefix (default streamq)")
    parser.add_argument("--json", action="store_true", default=d(False),
                        help="machine-readable output")
    parser.add_argument("--yes", "-y", action="store_true", default=d(False),
                        help="do not ask before bulk or destructive changes")
    parser.add_argument("--debug", action="store_true", default=d(False),
                        help="show tracebacks")
    parser.add_argument("--log-level", default=d(os.environ.get("STREAMQ_LOG_LEVEL", "INFO")),
                        help="DEBUG, INFO, WARNING, ERROR (worker and scheduler; default"
                        " $STREAMQ_LOG_LEVEL, else INFO)")
    parser.add_argument("--log-format", choices=("text", "json"),
                        default=d(os.environ.get("STREAMQ_LOG_FORMAT", "text")),
                        help="text, or json: one JSON object per line with the job's fields"
                        " (worker and scheduler; default $STREAMQ_LOG_FORMAT, else text)")
    parser.add_argument("--shards", type=int,
                        default=d(os.environ.get("STREAMQ_SHARDS", "1")),
                        help="the queues' shard count (QueueConfig.shards; default"
                        " $STREAMQ_SHARDS, else 1); it must equal the one stored with each"
                        " queue")
    parser.add_argument("--group-concurrency", type=int,
                        default=d(os.environ.get("STREAMQ_GROUP_CONCURRENCY", "1")),
                        help="the queues' default group limit (QueueConfig.group_concurrency;"
                        " default $STREAMQ_GROUP_CONCURRENCY, else 1): give workers the"
                        " producers' value")
    parser.add_argument("--events", default=d(os.environ.get("STREAMQ_EVENTS", "default")),
                        help="which lifecycle events workers and schedulers write:"
                        " 'default' (all but enqueued, queued, started, completed), 'all', or"
                        " kinds separated by commas (QueueConfig.event_kinds; default"
                        " $STREAMQ_EVENTS, else default)")
    parser.add_argument("--events-maxlen", type=int, default=d(QueueConfig().events_maxlen),
                        help="approximate cap of the lifecycle events stream (0 = no events);"
                        " keep it the same for producers, workers and schedulers")


def _metrics_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--metrics-port", type=int, metavar="PORT",
                        help="serve Prometheus metrics on http://HOST:PORT/metrics (needs the"
                        " metrics extra; 0 picks a free port, logged at start)")
    parser.add_argument("--metrics-host", default="127.0.0.1",
                        help="address the metrics endpoint binds (default loopback)")
    parser.add_argument("--metrics-interval", type=float, default=10.0, metavar="SECONDS",
                        help="re-read the queue gauges from Redis at most this often while"
                        " scraped (default 10)")


def _wait_seconds(text: str) -> float:
    """``--start-wait``: 0 or more finite seconds."""
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not math.isfinite(value) or value < 0:
        raise argparse.ArgumentTypeError(f"must be 0 or more seconds, got {text!r}")
    return value


def _start_wait_option(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--start-wait", type=_wait_seconds, metavar="SECONDS",
                        default=os.environ.get("STREAMQ_START_WAIT", "0"),
                        help="while Redis is not usable at start (not up yet, loading, a"
                        " failover), keep trying for up to this long before exiting 1"
                        " (default $STREAMQ_START_WAIT, else 0: a few retries, about 3 s)")


def _reload_option(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--reload", action="store_true",
                        help="development: restart (with a graceful stop) when a .py file under"
                        " the current directory or the app's package changes")


def build_parser() -> argparse.ArgumentParser:
    from .processes import processes_count

    common = argparse.ArgumentParser(add_help=False)
    _common_options(common, suppress=True)
    p = argparse.ArgumentParser(prog="streamq", description="streamq job engine")
    _common_options(p, suppress=False)
    sub = p.add_subparsers(dest="command", required=True)
    w = sub.add_parser("worker", parents=[common], help="run a worker process")
    w.add_argument("registry", help="module:attribute of a streamq.Registry")
    w.add_argument("--queue", action="append", required=True, help="queue name (repeatable)")
    w.add_argument("--concurrency", type=int, default=64)
    w.add_argument("--visibility-timeout", type=float, default=30.0, help="seconds")
    w.add_argument("--grace-period", type=float, default=10.0, help="seconds")
    w.add_argument("--no-promote", action="store_true",
                   help="leave promotion of delayed jobs to a scheduler daemon")
    w.add_argument("--processes", type=processes_count, metavar="N",
                   help="run N worker processes under a supervisor that restarts one that"
                   " dies (auto: one per CPU); without it, one worker in this process")
    w.add_argument("--pool", choices=("thread", "process"), default="thread",
                   help="where handlers run: thread (async ones on the event loop, sync ones"
                   " in threads; the default) or process (every handler in a pool of child"
                   " processes: hard timeouts, crash isolation; isolation='process' on a"
                   " handler does it for that one)")
    w.add_argument("--pool-size", type=int, metavar="N",
                   help="child processes of the process pool (default: one per CPU)")
    w.add_argument("--max-jobs-per-child", type=int, metavar="N",
                   help="replace a pool child after N jobs")
    w.add_argument("--max-memory-per-child", type=float, metavar="MIB",
                   help="replace a pool child whose resident memory reaches MIB after a job")
    _start_wait_option(w)
    _metrics_options(w)
    _reload_option(w)
    w.set_defaults(func=_worker)
    s = sub.add_parser("scheduler", parents=[common],
                       help="run the scheduler daemon (delayed jobs, cron, sweeps)")
    s.add_argument("--queue", action="append", help="queue name (repeatable)")
    s.add_argument("--cron", action="append", help="module:attribute of Cron entries (repeatable)")
    s.add_argument("--poll-interval", type=float, default=30.0, help="seconds")
    s.add_argument("--visibility-timeout", type=float, default=30.0, help="seconds")
    _start_wait_option(s)
    _metrics_options(s)
    _reload_option(s)
    s.set_defaults(func=_scheduler)
    e = sub.add_parser("export", parents=[common],
                       help="append new lifecycle events to Parquet (needs the spark extra)")
    e.add_argument("queue")
    e.add_argument("--to", required=True, help="output directory (keeps a checkpoint there)")
    e.add_argument("--master", default="local[*]", help="Spark master (default local[*])")
    e.add_argument("--partitions", type=int, default=8, help="parallel id ranges (default 8)")
    e.set_defaults(func=_export)
    d = sub.add_parser("demo", parents=[common],
                       help="a self-contained tour (starts its own Redis without --url)")
    d.add_argument("--jobs", type=int, default=2000)
    d.add_argument("--web", action="store_true",
                   help="the dashboard with a demo panel (needs the dashboard extra)")
    d.add_argument("--host", default="127.0.0.1", help="--web: address to bind")
    d.add_argument("--port", type=int, default=8080, help="--web: port (default 8080)")
    d.set_defaults(func=_demo)
    from .dashboard import add_parser as add_dashboard

    add_dashboard(sub, common)
    from .health import add_parser as add_health

    add_health(sub, common)
    from .ops import add_parsers

    add_parsers(sub, common)
    return p


def _explain(exc: BaseException, url: str) -> str:
    """One line a person can act on."""
    from redis import exceptions as rx

    from .._core.errors import StreamqError
    from .common import redact

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


def _configure_logging(args: argparse.Namespace) -> None:
    from .._core.telemetry import JsonFormatter

    handler = logging.StreamHandler()
    handler.setFormatter(JsonFormatter() if args.log_format == "json" else logging.Formatter(
        "%(asctime)s %(levelname)s %(name)s: %(message)s"))
    logging.basicConfig(level=args.log_level.upper() if args.command in ("worker", "scheduler")
                        else "ERROR", handlers=[handler])


def main(argv: Sequence[str] | None = None) -> int:
    try:
        args = build_parser().parse_args(argv)
    except SystemExit:  # --help, a usage error: flushed here, so a closed pipe is quiet
        try:
            sys.stdout.flush()
        except BrokenPipeError:
            from .hints import quiet_broken_pipe

            quiet_broken_pipe()
        raise
    args.argv = list(sys.argv[1:] if argv is None else argv)  # --reload runs it again
    from .demo_procs import die_with_parent

    die_with_parent()  # a demo's worker or scheduler: ends with the demo
    if args.url is None:  # demo starts a private server when neither is given
        args.url = os.environ.get("STREAMQ_URL") or (
            None if args.command == "demo" else "redis://localhost:6379/0")
    _configure_logging(args)
    try:
        if args.cluster and args.url:
            from .._core.conn import as_cluster_url

            args.url = as_cluster_url(args.url)
        if hasattr(args, "func"):
            rc: int = args.func(args)
            sys.stdout.flush()  # (a closed pipe: below)
            return rc
        from .common import Ctx
        from .ops import COMMANDS

        ctx = Ctx(args)
        try:
            COMMANDS[args.command](ctx)
        finally:
            ctx.admin.close()
        sys.stdout.flush()  # a closed pipe shows here, not at the interpreter's exit
        return 0
    except BrokenPipeError:  # streamq ... | head: the reader has what it wanted
        from .hints import quiet_broken_pipe

        return quiet_broken_pipe()
    except KeyboardInterrupt:
        return 130
    except SystemExit:
        raise
    except Exception as exc:
        if args.debug:
            raise
        print(f"streamq: {_explain(exc, str(args.url or ''))}", file=sys.stderr)
        return 1
