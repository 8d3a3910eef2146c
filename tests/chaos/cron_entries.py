"""Cron entries of the chaos run's schedulers (``streamq scheduler --cron
tests.chaos.cron_entries:ENTRIES``): the queue comes from ``$STREAMQ_CHAOS_QUEUE``.

- ``chaos-minute``: a five-field expression, every minute (``* * * * *``);
- ``chaos-tick``: every ``CRON_EVERY_S`` seconds, so that a short run has many ticks.

Each tick must fire exactly once (job id ``cron:<name>:<tick in s>``), never before the tick
(server time) and soon after it; the harness checks that (``Liveness``).
"""

from __future__ import annotations

import os

from schedulers import Cron

CRON_EVERY_S = 10
MAX_ATTEMPTS = 25

_queue = os.environ.get("STREAMQ_CHAOS_QUEUE", "chaos")
ENTRIES = [
    Cron("chaos-minute", "* * * * *", job_type="chaos.cron", queue=_queue,
         job_options={"max_attempts": MAX_ATTEMPTS}),
    Cron("chaos-tick", every=CRON_EVERY_S, job_type="chaos.cron", queue=_queue,
         job_options={"max_attempts": MAX_ATTEMPTS}),
]
