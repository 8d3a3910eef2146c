"""A process with the OpenTelemetry SDK installed (in-memory exporters), for the telemetry
tests: ``python otel_proc.py producer|worker URL QUEUE OUT.json``. It dumps what it recorded."""

from __future__ import annotations

import asyncio
import json
import sys
from typing import Any

from opentelemetry import metrics, trace
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

exporter = InMemorySpanExporter()
provider = TracerProvider()
provider.add_span_processor(SimpleSpanProcessor(exporter))
trace.set_tracer_provider(provider)
reader = InMemoryMetricReader()
metrics.set_meter_provider(MeterProvider(metric_readers=[reader]))

from streamq import (  # noqa: E402
    Job,
    Queue,
    Registry,
    RetryPolicy,
    Worker,
    WorkerConfig,
)


def span_dict(s: ReadableSpan) -> dict[str, Any]:
    ctx = s.get_span_context()
    assert ctx is not None
    return {
        "name": s.name, "kind": s.kind.name, "trace_id": format(ctx.trace_id, "032x"),
        "span_id": format(ctx.span_id, "016x"),
        "parent_id": format(s.parent.span_id, "016x") if s.parent else None,
        "links": [format(link.context.span_id, "016x") for link in s.links],
        "attributes": dict(s.attributes or {}), "status": s.status.status_code.name,
        "events": [e.name for e in s.events],
        "schema_url": s.instrumentation_scope.schema_url if s.instrumentation_scope else None,
    }


def metric_dict() -> dict[str, Any]:
    out: dict[str, Any] = {}
    data = reader.get_metrics_data()
    assert data is not None
    for rm in data.resource_metrics:
        for sm in rm.scope_metrics:
            for m in sm.metrics:
                points = []
                for p in m.data.data_points:
                    value = getattr(p, "value", None)
                    if value is None:
                        value = {"count": p.count, "sum": p.sum}  # type: ignore[union-attr]
                    points.append({"attributes": dict(p.attributes or {}), "value": value})
                out[m.name] = points
                out.setdefault("_schema_urls", {})[sm.scope.name] = sm.scope.schema_url
    return out


def producer(url: str, queue: str) -> dict[str, Any]:
    q = Queue.from_url(url, queue)
    with trace.get_tracer("web").start_as_current_span("POST /signup"):
        q.enqueue("flaky", {"user": 42}, job_id="traced")
        q.enqueue_many([{"type": "ok"} for _ in range(3)])
    return {"spans": [span_dict(s) for s in exporter.get_finished_spans()]}


async def worker(url: str, queue: str) -> dict[str, Any]:
    reg = Registry()

    @reg.handler("flaky", max_attempts=3, retry=RetryPolicy(base_s=0.01, cap_s=0.01))
    async def flaky(job: Job) -> str:
        if job.attempt < 3:
            raise ConnectionError(f"upstream down (attempt {job.attempt})")
        with trace.get_tracer("app").start_as_current_span("send email"):
            return "sent"

    @reg.handler("ok")
    async def ok(job: Job) -> None:
        return None

    cfg = WorkerConfig(promote_interval_s=0.02, block_ms=100, gauges_interval_s=0.05)
    async with Worker(url, [queue], reg, cfg) as w:
        while w.stats.completed < 4:  # noqa: ASYNC110 - polling a counter
            await asyncio.sleep(0.02)
        reader.get_metrics_data()  # a scrape: asks the worker to refresh its gauge cache
        await asyncio.sleep(1.5)
        result = {"spans": [span_dict(s) for s in exporter.get_finished_spans()],
                  "metrics": metric_dict()}
    return result


if __name__ == "__main__":
    mode, url, queue, out = sys.argv[1:5]
    data = producer(url, queue) if mode == "producer" else asyncio.run(worker(url, queue))
    with open(out, "w") as f:
        json.dump(data, f)
