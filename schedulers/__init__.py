"""The scheduler daemon (promotion, cron, recovery sweeps). See issue 3; promotion logic is
shared with workers in ``streamq._promote``."""

from streamq._promote import Promoter

__all__ = ["Promoter"]
