"""Tracing overhead: no-op drain throughput with every telemetry hook stubbed out (baseline),
with the hooks and no SDK (the default), and with the SDK and a batch exporter.

``python -m benchmarks.otel_bench [--jobs 20000] [--reps 3]``. Each run is a fresh process
(the SDK is global), one in-process worker at concurrency 100, a no-op handler; the spans go
to a BatchSpanProcessor with an exporter that drops them, and metrics to an in-memory reader.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import subprocess
import sys
import time
from collections.abc import Sequence
from typing import Any

from streamq._core.server import RedisServer


def _stub_telemetry() -> None:
    """Replace every telemetry hook with a bare no-op: the baseline for 'what the hooks cost
    when no SDK is installed'."""
    from streamq._core import telemetry as tel
    class Nop:
        def add(self, *_a: Any, **_k: Any) -> None: ...

        def record(self, *_a: Any, **_k: Any) -> None: ...

    class NopAttempt:
        __slots__ = ("trace_id",)

        def __init__(self, *_a: Any) -> None:
            self.trace_id = ""

        def end(self, *_a: Any) -> None: ...

    for name in ("ENQUEUED", "DUPLICATES", "STARTED", "COMPLETED", "RETRIED", "FAILED",
                 "RECLAIMED", "LEASE_LOST", "QUEUE_WAIT", "DURATION", "END_TO_END"):
        setattr(tel, name, Nop())
    tel.Attempt = NopAttempt  # type: ignore[assignment,misc]


def _drain(url: str, jobs: int, sdk: bool, stubbed: bool = False) -> dict[str, float]:
    if stubbed:
        _stub_telemetry()
    if sdk:
        from opentelemetry import metrics, trace
        from opentelemetry.sdk.metrics import MeterProvider
        from opentelemetry.sdk.metrics.export import InMemoryMetricReader
        from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
        from opentelemetry.sdk.trace.export import (
            BatchSpanProcessor,
            SpanExporter,
            SpanExportResult,
        )

        class Drop(SpanExporter):
            def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
                return SpanExportResult.SUCCESS

        provider = TracerProvider()
        provider.add_span_processor(BatchSpanProcessor(Drop()))
        trace.set_tracer_provider(provider)
        metrics.set_meter_provider(MeterProvider(metric_readers=[InMemoryMetricReader()]))

    from streamq import Job, Queue, Registry, Worker, WorkerConfig

    q = Queue.from_url(url, f"otel-{'sdk' if sdk else 'none'}-{time.time_ns()}")
    q.enqueue_many([{"type": "noop"} for _ in range(jobs)])
    reg = Registry()

    @reg.handler("noop")
    async def noop(job: Job) -> None:
        return None

    async def run() -> dict[str, float]:
        worker = Worker(url, [q.name], reg, WorkerConfig(concurrency=100))
        c0, t0 = time.process_time(), time.perf_counter()
        async with worker:
            while worker.stats.completed < jobs:  # noqa: ASYNC110 - polling a counter
                await asyncio.sleep(0.005)
            wall, cpu = time.perf_counter() - t0, time.process_time() - c0
        return {"jobs_per_s": jobs / wall, "cpu_us_per_job": cpu / jobs * 1e6}

    return asyncio.run(run())


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--jobs", type=int, default=20_000)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--child", choices=["none", "sdk", "stubbed"])
    ap.add_argument("--url")
    args = ap.parse_args(argv)
    if args.child:
        print(json.dumps(_drain(args.url, args.jobs, args.child == "sdk",
                                args.child == "stubbed")))
        return 0
    results: dict[str, list[dict[str, Any]]] = {"stubbed": [], "none": [], "sdk": []}
    with RedisServer() as srv:
        for _ in range(args.reps):
            for mode in results:  # interleaved, so drift hits all alike
                out = subprocess.run([sys.executable, "-m", "benchmarks.otel_bench", "--child",
                                      mode, "--url", srv.url, "--jobs", str(args.jobs)],
                                     check=True, capture_output=True, text=True).stdout
                results[mode].append(json.loads(out))
    summary = {mode: {k: round(statistics.median(r[k] for r in runs), 1)
                      for k in ("jobs_per_s", "cpu_us_per_job")}
               for mode, runs in results.items()}
    summary["overhead_pct"] = {
        "no_sdk_hooks_vs_stubbed": round(
            100 * (1 - summary["none"]["jobs_per_s"] / summary["stubbed"]["jobs_per_s"]), 1),
        "sdk_vs_no_sdk": round(
            100 * (1 - summary["sdk"]["jobs_per_s"] / summary["none"]["jobs_per_s"]), 1)}
    print(json.dumps({"runs": results, "median": summary}, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
