"""Periodic jobs of the example app (``streamq scheduler --cron myapp.cron:CRON``)."""

from __future__ import annotations

from schedulers import Cron

CRON = [Cron("myapp.ping", every=60, job_type="ping", queue="jobs")]
