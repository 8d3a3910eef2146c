"""A worker process of the flow chaos run (``flows.py``): ``worker.py``'s ledger and handlers on
a ``Worker`` that serves several queues (comma-separated) and is their workflow relay.

Usage: ``python flow_worker.py URL QUEUES LEDGER NAME CONFIG_JSON`` where CONFIG_JSON is
``{"worker": {WorkerConfig kwargs}, "queue": {QueueConfig kwargs}, "events_maxlen": N,
"repair_every_s": S, "repair_min_age_ms": MS}``. The last two shorten the repair sweep's
interval and minimum age (``streamq/_worker/relay.py``: 30 s and 60 s in production) so that a
bounded run sees it at work; the harness checks "no parent left waiting" against them.
"""

from __future__ import annotations

import asyncio
import inspect
import sys
from pathlib import Path

from streamq import ALL_EVENTS, QueueConfig, Worker, WorkerConfig
from streamq._worker.relay import Relay

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run as a script
from chaos import worker as chaos_worker


def shorten(repair_every_s: float, repair_min_age_ms: int) -> None:
    """The repair sweep's interval and minimum age for every ``Relay`` this process makes
    (their defaults, set by name: the worker passes only its other arguments)."""
    init = Relay.__init__
    params = inspect.signature(init).parameters
    new = {"repair_every_s": repair_every_s, "repair_min_age_ms": repair_min_age_ms}
    if not set(new) <= set(params):
        raise RuntimeError(f"Relay takes {list(params)}: the chaos run cannot shorten it")
    init.__defaults__ = tuple(new.get(n, p.default) for n, p in params.items()
                              if p.default is not inspect.Parameter.empty)


def main(argv: list[str]) -> int:
    url, queues, name, config, ledger = chaos_worker.setup(argv)
    shorten(float(config["repair_every_s"]), int(config["repair_min_age_ms"]))
    qcfg = QueueConfig(**{"events_maxlen": int(config["events_maxlen"]),
                          "event_kinds": ALL_EVENTS, **config.get("queue", {})})
    w = Worker(url, queues.split(","), chaos_worker.build_registry(ledger),
               WorkerConfig(**config["worker"]), qcfg, consumer=name)
    asyncio.run(chaos_worker.serve(w, None))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
