"""``streamq worker --processes N --metrics-port P``: one endpoint for every worker process.

Each child serves its own metrics on a free loopback port and writes ``<pid> <port>`` to a
file named after its slot in a directory the supervisor made (``processes.py``). A scrape of
the supervisor's ``/metrics`` reads every child's endpoint (at that moment; nothing is
cached), adds a ``process`` label (the slot, 0..N-1) to each sample, and serves the metric
families merged, plus the supervisor's own ``streamq_worker_processes`` (children running) and
``streamq_worker_process_restarts_total`` (per slot). A child that is restarting is missing
from that one scrape; a counter of a restarted child starts again at 0, which Prometheus'
``rate()`` reads as a reset.

Queue gauges (``streamq_queue_*``) are the same numbers in every process (each reads them
from Redis): aggregate them with ``max`` over ``process``, and job counters with ``sum``.
"""

from __future__ import annotations

import logging
import os
import urllib.request
from collections.abc import Callable, Iterator
from typing import Any
from wsgiref.simple_server import WSGIServer

from .._ops.metrics import EXTRA

log = logging.getLogger("streamq.metrics")
SCRAPE_TIMEOUT_S = 5.0


def child_ports(where: str) -> list[tuple[int, int, int]]:
    """(slot, pid, port) of each child that reported its metrics port."""
    out = []
    for name in sorted(os.listdir(where)):
        if not name.isdigit():
            continue
        try:
            with open(os.path.join(where, name), encoding="ascii") as f:
                pid, port = (int(x) for x in f.read().split())
        except (OSError, ValueError):
            continue
        out.append((int(name), pid, port))
    return out


class MergedCollector:
    """A prometheus_client collector: every live child's metrics with a ``process`` label."""

    def __init__(self, where: str, slots: Callable[[], list[tuple[int, int | None, int]]]
                 ) -> None:
        self.where = where
        self.slots = slots
        """(slot, pid of its running child or None, restarts) of each slot."""

    def collect(self) -> Iterator[Any]:
        from prometheus_client.metrics_core import CounterMetricFamily, GaugeMetricFamily, Metric
        from prometheus_client.parser import text_string_to_metric_families

        families: dict[str, Metric] = {}
        slots = self.slots()
        live = {pid for _, pid, _ in slots if pid is not None}
        for slot, pid, port in child_ports(self.where):
            if pid not in live:  # a file left by a child that died: its successor rewrites it
                continue
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics",
                                            timeout=SCRAPE_TIMEOUT_S) as resp:
                    text = resp.read().decode()
            except OSError as exc:
                log.debug("metrics of worker process %d not read: %s", slot, exc)
                continue
            for fam in text_string_to_metric_families(text):
                merged = families.get(fam.name)
                if merged is None:
                    merged = families[fam.name] = Metric(fam.name, fam.documentation, fam.type,
                                                         fam.unit)
                merged.samples.extend(s._replace(labels={**s.labels, "process": str(slot)})
                                      for s in fam.samples)
        up = GaugeMetricFamily("streamq_worker_processes", "worker processes running",
                               value=len(live))
        restarts = CounterMetricFamily("streamq_worker_process_restarts",
                                       "worker processes started again after they died",
                                       labels=["process"])
        for index, _, n in slots:
            restarts.add_metric([str(index)], n)
        yield from [*families.values(), up, restarts]


def serve_merged(host: str, port: int, where: str,
                 slots: Callable[[], list[tuple[int, int | None, int]]]) -> WSGIServer:
    """Serve the merged metrics on ``host:port`` from a daemon thread (port 0 picks one)."""
    try:
        from prometheus_client import CollectorRegistry, start_http_server
    except ImportError as exc:
        raise SystemExit(f"streamq: --metrics-port needs the metrics extra: {EXTRA}"
                         f" ({exc})") from None
    registry = CollectorRegistry(auto_describe=False)
    registry.register(MergedCollector(where, slots))
    try:
        server, _thread = start_http_server(port, addr=host, registry=registry)
    except OSError as exc:
        raise SystemExit(f"streamq: cannot serve metrics on {host}:{port}: {exc}") from None
    bound = server.server_address
    host_s = str(bound[0])
    shown = f"[{host_s}]" if ":" in host_s else host_s
    log.info("serving Prometheus metrics of every worker process on http://%s:%d/metrics",
             shown, int(bound[1]))
    return server
