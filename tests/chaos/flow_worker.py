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
import sys
from pathlib import Path

from streamq import ALL_EVENTS, QueueConfig, Worker, WorkerConfig
from streamq._worker.relay import Relay

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run as a script
from chaos import worker as chaos_worker


def main(argv: list[str]) -> int:
    url, queues, name, config, ledger = chaos_worker.setup(argv)
    Relay.__init__.__defaults__ = (float(config["repair_every_s"]),
                                   int(config["repair_min_age_ms"]))
    qcfg = QueueConfig(**{"events_maxlen": int(config["events_maxlen"]),
                          "event_kinds": ALL_EVENTS, **config.get("queue", {})})
    w = Worker(url, queues.split(","), chaos_worker.build_registry(ledger),
               WorkerConfig(**config["worker"]), qcfg, consumer=name)
    asyncio.run(chaos_worker.serve(w, None))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
