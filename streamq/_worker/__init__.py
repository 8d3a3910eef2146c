"""The worker: fetching and starting (worker), one attempt of a job (attempt), settling
outcomes (settle), leases (lease), housekeeping loops (housekeeping), promotion of due jobs
(promote, shared with the scheduler), handler invocation (invoke), progress reports (progress),
the event-loop watchdog (watchdog) and the state its parts share (state)."""

from .calls import start_call
from .state import WorkerStats
from .worker import Worker

__all__ = ["Worker", "WorkerStats", "start_call"]
