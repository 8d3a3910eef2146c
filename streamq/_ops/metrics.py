"""``--metrics-port``: Prometheus metrics of a ``streamq worker`` or ``streamq scheduler``
process, without code (needs the metrics extra).

The OpenTelemetry SDK's Prometheus exporter reads the instruments streamq records anyway
(``_telemetry``), so nothing is counted twice; this module only installs the SDK, serves the
text format, and, for the scheduler (which runs no worker), keeps the per-queue gauges.
"""

from __future__ import annotations

import asyncio
import logging
import os
from collections.abc import Iterable, Sequence
from typing import Any

import redis.asyncio as aredis

from .._core import telemetry as tel
from .._core.conn import async_client
from .._core.errors import UnknownQueue
from .._core.keys import Keys
from . import operations as _ops

log = logging.getLogger("streamq.metrics")
EXTRA = "pip install 'streamq[metrics]'"


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
    provider = MeterProvider(metric_readers=[PrometheusMetricReader()],
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


def gauge_fields(st: _ops.QueueStats) -> dict[str, float]:
    """The per-queue gauges (``streamq.queue.*``) of one queue's stats."""
    return {"ready": st.ready, "pending": st.pending, "delayed": st.scheduled + st.retrying,
            "dead": st.dead, "oldest_ready_age": st.oldest_ready_age_s or 0.0,
            "workers": st.workers_alive}


class QueueGauges:
    """Per-queue gauges for a process that runs no worker (the scheduler): like a worker's,
    read from Redis (``stats``, about ten commands a queue) at most every ``interval_s`` and
    only while a reader collects them, so a scrape never waits for Redis."""

    def __init__(self, client: aredis.Redis, keys: Sequence[Keys], interval_s: float) -> None:
        self.client = client
        self.keys = list(keys)
        self.interval_s = interval_s
        self._cache: dict[str, dict[str, float]] = {}
        self._wanted = False
        self._failing = False

    def values(self) -> Iterable[tuple[str, dict[str, float]]]:
        self._wanted = True
        return list(self._cache.items())

    async def refresh(self) -> None:
        from .._core.driver import adrive

        for k in self.keys:
            try:
                st = await adrive(self.client, _ops.stats(k))
            except UnknownQueue:  # nothing enqueued yet: no gauges rather than zeros
                self._cache.pop(k.queue, None)
                continue
            self._cache[k.queue] = gauge_fields(st)

    async def run(self) -> None:
        """Refresh while wanted, until cancelled; errors are logged and retried."""
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
    gauges = QueueGauges(client, list(scheduler.queues.values()), interval_s)
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
