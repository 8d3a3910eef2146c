"""Cron schedule for the scheduler process tests; the queue comes from the environment."""

from __future__ import annotations

import os

from schedulers import Cron

QUEUE = os.environ.get("STREAMQ_TEST_QUEUE", "sched-test")
schedule = [Cron("tick", every=1, job_type="tick", payload={"n": 1}, queue=QUEUE)]
