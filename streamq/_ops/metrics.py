"""``--metrics-port``: Prometheus metrics of a ``streamq worker`` or ``streamq scheduler``
process, without code (needs the metrics extra).

The OpenTelemetry SDK's Prometheus exporter reads the instruments streamq records anyway
(``_telemetry``), so nothing is counted twice; this module only installs the SDK, serves the
text format, and, for the scheduler (which runs no worker), keeps the per-queue gauges.
"""

from __future__ import annotations

import asyncio
import inspect
import json
import logging
import os
from collections.abc import Callable, Iterable, Sequence
from typing import Any

import attrs
import redis.asyncio as aredis

from .._core import telemetry as tel
from .._core.conn import async_client
from .._core.driver import Cmd, Op, _server_ms, ok
from .._core.errors import UnknownQueue
from .._core.keys import Keys
from . import operations as _ops

log = logging.getLogger("streamq.metrics")
EXTRA = "pip install 'streamq[metrics]'"
SCOPE_LABELS_ENV = "STREAMQ_METRICS_SCOPE_LABELS"
"""Set to 1: every series also carries ``otel_scope_name``, ``otel_scope_version`` and
``otel_scope_schema_url`` (off by default: three labels repeated on every series)."""


def serve(host: str, port: int, service: str) -> tuple[str, int]:
    """Install an SDK MeterProvider with a Prometheus reader and serve ``/metrics`` on
    ``host:port`` from a daemon thread (port 0 picks a free one). Returns the bound address.

    Call it before user code runs: a process has one MeterProvider, and the first installed
    stays."""
    try:
        from opentelemetry import metrics
        from opentelemetry.exporter.prometheus import PrometheusMetricReader
        from opentelemetry.sdk.metrics import MeterProvider
        from opentelemetry.sdk.resources import SERVICE_NAME, Resource
        from prometheus_client import start_http_server
    except ImportError as exc:
        raise SystemExit(f"streamq: --metrics-port needs the metrics extra: {EXTRA}"
                         f" ({exc})") from None
    name = os.environ.get("OTEL_SERVICE_NAME") or service
    scope = os.environ.get(SCOPE_LABELS_ENV, "") not in ("", "0")  # otel_scope_* labels
    provider = MeterProvider(metric_readers=[_reader(PrometheusMetricReader, scope)],
                             resource=Resource.create({SERVICE_NAME: name}))
    metrics.set_meter_provider(provider)
    if metrics.get_meter_provider() is not provider:
        provider.shutdown()
        raise SystemExit("streamq: --metrics-port: another OpenTelemetry MeterProvider is"
                         " installed already (OTEL_PYTHON_METER_PROVIDER?); add a"
                         " PrometheusMetricReader to that one instead")
    try:
        server, _thread = start_http_server(port, addr=host)
    except OSError as exc:
        raise SystemExit(f"streamq: cannot serve metrics on {host}:{port}: {exc}") from None
    bound = server.server_address
    where = (str(bound[0]), int(bound[1]))
    shown = f"[{where[0]}]" if ":" in where[0] else where[0]
    log.info("serving Prometheus metrics on http://%s:%d/metrics", shown, where[1])
    return where


def _reader(cls: Callable[..., Any], scope: bool) -> Any:
    """The exporter's reader, with or without the ``otel_scope_*`` labels. Exporters before
    0.64b0 (opentelemetry-sdk 1.43) take no ``scope_info_enabled`` and never add them: the
    default here; asked for them there, a warning says they need a newer exporter."""
    if "scope_info_enabled" in inspect.signature(cls).parameters:
        return cls(scope_info_enabled=scope)
    if scope:
        log.warning("%s=1: this opentelemetry-exporter-prometheus adds no otel_scope_* labels"
                    " (0.64b0 and newer do)", SCOPE_LABELS_ENV)
    return cls()


@attrs.frozen
class Load:
    """What the autoscaling gauges need besides ``stats`` (of one shard)."""

    due: int
    """Delayed (scheduled or retrying) jobs whose time has come, not yet promoted."""
    slots: int
    """The concurrency of the live workers of the queue, added up."""


def load(keys: Keys, alive_within_ms: int = 30_000) -> Op[Load]:
    """Due delayed jobs and the live workers' slots of one shard: three small steps (the
    server's clock, then ZCOUNT and the live workers, then each worker's heartbeat info)."""
    (now_raw,) = yield [Cmd.of("TIME")]
    now = _server_ms(ok(now_raw))
    due, alive = yield [Cmd.of("ZCOUNT", keys.delayed, "-inf", now),
                        Cmd.of("ZRANGEBYSCORE", keys.workers, now - alive_within_ms, "+inf")]
    names = [n.decode() if isinstance(n, bytes) else str(n) for n in ok(alive)]
    infos = (yield [Cmd.of("HGET", keys.worker_info(n), "info") for n in names]) if names \
        else []
    slots = 0
    for raw in infos:  # (its info expires after three missed heartbeats: then not counted)
        if isinstance(raw, Exception) or not raw:
            continue
        try:
            conc = json.loads(raw).get("concurrency")
        except (ValueError, AttributeError):
            continue
        slots += conc if isinstance(conc, int) and not isinstance(conc, bool) else 0
    return Load(int(ok(due)), slots)


def gauges(keys: Keys) -> Op[dict[str, float]]:
    """The per-queue gauges of one shard (``stats`` and ``load``)."""
    st = yield from _ops.stats(keys)
    more = yield from load(keys)
    return gauge_fields(st, more)


def gauge_fields(st: _ops.QueueStats, more: Load) -> dict[str, float]:
    """The per-queue gauges (``streamq.queue.*``) of one queue's (or shard's) stats.

    ``backlog``: what workers would have to run: ready and pending entries of every priority
    level, due delayed jobs and grouped jobs waiting for their group's slot. ``slots`` is
    kept for ``saturation``, computed over a whole queue (``saturation``)."""
    return {"ready": st.ready, "pending": st.pending, "delayed": st.scheduled + st.retrying,
            "dead": st.dead, "oldest_ready_age": st.oldest_ready_age_s or 0.0,
            "workers": st.workers_alive, "group_waiting": st.group_waiting,
            "waiting": st.waiting, "oldest_waiting_age": st.oldest_waiting_age_s or 0.0,
            "backlog": st.ready + st.pending + more.due + st.group_waiting,
            "slots": more.slots}


def add_saturation(g: dict[str, float]) -> dict[str, float]:
    """``saturation`` = (pending + ready) / slots of one queue's gauges, in place. With no
    live worker it divides by 1: any work to do reads as saturated (>= 1)."""
    if "slots" in g:
        g["saturation"] = (g.get("pending", 0.0) + g.get("ready", 0.0)) / max(g["slots"], 1.0)
    return g


MOST = frozenset({"oldest_ready_age", "oldest_waiting_age", "workers", "slots"})
"""Gauges of a sharded queue that are the largest of its shards' (the rest add up)."""


def merge_shards(parts: Iterable[tuple[str, dict[str, float]]]
                 ) -> list[tuple[str, dict[str, float]]]:
    """Per-shard gauges -> per-queue gauges (``MOST`` the largest, the rest summed), each
    with its ``saturation``."""
    out: dict[str, dict[str, float]] = {}
    for queue, values in parts:
        g = out.setdefault(queue, {})
        for name, v in values.items():
            g[name] = max(g.get(name, 0.0), v) if name in MOST else g.get(name, 0.0) + v
    return [(q, add_saturation(g)) for q, g in out.items()]


ZERO = ("ready", "pending", "delayed", "dead", "oldest_ready_age", "workers", "group_waiting",
        "waiting", "oldest_waiting_age", "backlog", "slots")
"""The gauges of a queue that has no key yet."""


class QueueGauges:
    """Per-queue gauges for a process that runs no worker (the scheduler): like a worker's,
    read from Redis (``stats``, about ten commands a queue) at most every ``interval_s`` and
    only while a reader collects them, so a scrape never waits for Redis."""

    def __init__(self, client: aredis.Redis, keys: Sequence[Keys], interval_s: float,
                 follow: Callable[[], Sequence[Keys]] | None = None) -> None:
        self.client = client
        self.keys = list(keys)
        self.follow = follow
        """Where the shards to read come from at each refresh (the scheduler's, which a
        reshard changes), instead of ``keys``."""
        self.interval_s = interval_s
        self._cache: dict[str, tuple[str, dict[str, float]]] = {}
        """By shard tag: (queue, gauges)."""
        self._wanted = False
        self._failing = False

    def values(self) -> Iterable[tuple[str, dict[str, float]]]:
        self._wanted = True
        return merge_shards(list(self._cache.values()))

    async def refresh(self) -> None:
        from .._core.driver import adrive

        if self.follow is not None:
            self.keys = list(self.follow())
            tags = {k.tag for k in self.keys}
            self._cache = {t: v for t, v in self._cache.items() if t in tags}
        for k in self.keys:
            try:
                self._cache[k.tag] = (k.queue, await adrive(self.client, gauges(k)))
            except UnknownQueue:  # nothing enqueued yet: every gauge at 0
                self._cache[k.tag] = (k.queue, dict.fromkeys(ZERO, 0.0))

    async def run(self) -> None:
        """Refresh at once, then while wanted, until cancelled; errors are logged and
        retried."""
        self._wanted = True  # the gauges are there from the first scrape
        while True:
            if self._wanted:
                self._wanted = False
                try:
                    await self.refresh()
                except Exception as exc:  # noqa: BLE001 - an outage: try again next round
                    log.log(logging.DEBUG if self._failing else logging.WARNING,
                            "queue gauges not refreshed: %s: %s", type(exc).__name__, exc)
                    self._failing = True
                else:
                    self._failing = False
            await asyncio.sleep(self.interval_s)


def _scheduler_counters(scheduler: Any) -> None:
    """The scheduler's own totals as counters (promoted, cron fired, handed back)."""
    from opentelemetry.metrics import CallbackOptions, Observation, get_meter

    meter = get_meter("streamq.scheduler")
    for attr, name, desc in [
        ("promoted", "promoted", "delayed and retrying jobs moved to their stream"),
        ("fired", "cron_fired", "cron ticks fired as jobs"),
        ("requeued", "requeued", "lapsed entries handed back by sweeps"),
    ]:
        def callback(_options: CallbackOptions, attr: str = attr) -> Iterable[Observation]:
            yield Observation(getattr(scheduler, attr), {"messaging.system": tel.SYSTEM})

        meter.create_observable_counter(f"streamq.scheduler.{name}", [callback], unit="{job}",
                                        description=desc)


async def run_scheduler(scheduler: Any, interval_s: float | None) -> None:
    """``scheduler.run()``, and with ``interval_s`` the queue gauges and the scheduler's
    counters for the metrics endpoint."""
    if interval_s is None:
        await scheduler.run()
        return
    client = async_client(scheduler.url)
    def shards() -> list[Keys]:  # every shard served (a reshard adds or retires some)
        return [k for ks in scheduler.shards.values() for k in ks]

    gauges = QueueGauges(client, shards(), interval_s, shards)  # (a queue's shards add up)
    _scheduler_counters(scheduler)
    tel.register_gauges(gauges, gauges.values)
    task = asyncio.create_task(gauges.run())
    try:
        await scheduler.run()
    finally:
        tel.unregister_gauges(gauges)
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        await client.aclose()
