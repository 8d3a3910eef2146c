"""The scheduler daemon: promotion of delayed and retry jobs, cron, recovery sweeps.

``await Scheduler.from_url(url, queues=[...], cron=[Cron(...), ...]).run()`` or
``streamq scheduler --url ... --queue ... --cron module:attribute``.
"""

from ._cron import CronExpr
from ._entries import Cron
from ._scheduler import Scheduler, SchedulerConfig

__all__ = ["Cron", "CronExpr", "Scheduler", "SchedulerConfig"]
