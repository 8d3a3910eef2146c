"""Running jobs: the first steps of a batch of started jobs, eagerly (eager.py), and what
becomes of each attempt's outcome (buffered for settling, its slot freed).

A batch's jobs run their first steps one after another in ``_start_jobs``, each its attempt
coroutine (attempt.py) run directly as a carrier's task, with no job coroutine around it: a
job that ends there (a no-op or CPU-only handler) has its outcome buffered in the same loop,
and the batch's outcomes are handed over once (their slots freed, the settling loop woken,
their chart observations made in one call). A job that waits goes on in its carrier, as a
task of its own (``_job_rest``), and hands its outcome over when it ends (``_outcome``).

The Worker mixes this class in; the state it uses is the Worker's (declared below).
"""

from __future__ import annotations

import asyncio
import contextvars
import logging
import time
from collections.abc import Coroutine
from typing import TYPE_CHECKING, Any

from .attempt import Attempts
from .eager import AVAILABLE as EAGER
from .eager import Carrier, Resumed, enter_task, leave_task
from .lease import Lease, new_lease
from .state import Finish, QState

if TYPE_CHECKING:
    from .._core.config import WorkerConfig
    from .cancel import CancelWatch
    from .lease import LeaseKeeper
    from .progress import Progress
    from .settle import Settler
    from .slots import Slots

log = logging.getLogger("streamq.worker")


class Running:
    """Start, run and hand over jobs: the part of the Worker between a lease and its outcome
    buffered for settling."""

    if TYPE_CHECKING:  # the Worker's state this part reads and writes
        config: WorkerConfig
        _attempts: Attempts
        _progress: Progress | None
        _settler: Settler | None
        _leases: LeaseKeeper
        _cancels: CancelWatch | None
        _slots: Slots
        _unsettled: int
        _tasks: set[asyncio.Task[None]]
        _jobs: dict[tuple[str, str], asyncio.Task[None]]
        _to_start: list[tuple[QState, Lease, int, bytes, tuple[int, int, int]]]
        _later: int
        _carrier: Carrier | None
        _job_ctx: contextvars.Context

    def _handed_over(self, n: int = 1) -> None:
        """n handlers are done and their outcomes are buffered for settling: free their
        slots now, unless too many outcomes already wait (Redis slow or away); then they are
        freed when the backlog is settled."""
        before = self._unsettled
        self._unsettled = before + n
        free = min(n, self.config.concurrency - before)  # nothing owed (Worker._owed)
        if free > 0:
            self._slots.release(free)

    def _launch(self, qs: QState, entry: str, job_id: str, token: str, attempt: int,
                data: bytes, times: tuple[int, int, int], deps: Any = None) -> None:
        """Hold a started job's lease; its first step runs in the caller's ``_start_jobs``,
        once every lease of the batch is held (renewed even while a first step blocks)."""
        lease = new_lease(qs.keys, job_id, entry, token, time.monotonic())
        if deps is not None:  # its dependency results, sent with its start (Lease.deps)
            lease.deps = deps
        self._leases.add(lease)
        if self._cancels is not None:  # its cancel already heard: it stops at once
            self._cancels.launched(lease)
        self._to_start.append((qs, lease, attempt, data, times))

    def _hold(self, leases: list[Lease]) -> None:
        """``_launch``'s bookkeeping for a batch of leases (their jobs are in ``_to_start``
        already): held (renewed) under one lock, and checked against cancels heard."""
        self._leases.add_many(leases)
        cancels = self._cancels
        if cancels is not None and cancels.heard:
            for lease in leases:
                cancels.launched(lease)

    def _start_jobs(self, tasks: list[asyncio.Task[None]] | None = None) -> None:
        """Run the first step of each job launched since the last call, eagerly (eager.py):
        a job that ends there (a no-op handler) costs no task and no coroutine but its
        attempt's; one that waits goes on in a task of its own, added to ``tasks`` when
        given. The outcomes of the jobs that ended are handed over once for the batch."""
        todo, self._to_start = self._to_start, []
        if not todo:
            return
        # (the loop passed on: get_running_loop makes a getpid system call)
        loop = asyncio.get_running_loop()
        self._attempts.ask()  # metrics and spans: asked once for the batch
        if not EAGER:  # (an interpreter without asyncio's _enter_task: a task per job)
            for qs, lease, attempt, data, times in todo:
                self._track(qs, lease, loop.create_task(
                    self._run_job(qs, lease, attempt, data, times),
                    context=self._job_ctx.copy()), tasks)
            return
        outer = asyncio.current_task(loop)  # (a fetch or settling loop's; set back below)
        if outer is not None:
            leave_task(loop, outer)
        attempts = self._attempts
        nested = attempts.seen is not None  # (never: no first step starts a batch itself)
        if not nested:
            attempts.collect()  # the chart observations of the batch: one call
        run = attempts.attempt
        job_ctx = self._job_ctx
        progress = self._progress
        pending, lines = progress.waiting() if progress is not None else ({}, {})
        """The reports not written yet (read per job: a job's first step may add some)."""
        ended = 0
        """Jobs whose outcome their first step buffered."""
        lanes: list[QState] = []
        """Their lanes, each once (a batch's jobs are of one lane, or a few)."""
        lane: QState | None = None  # (the last one added)
        last: tuple[QState, Lease, contextvars.Context] | None = None
        carrier = self._carrier
        if carrier is None or carrier.spoilt:
            carrier = self._carrier = Carrier(loop)  # (none, or spoilt: eager.py)
        task = carrier.task
        try:
            left = len(todo)
            for qs, lease, attempt, data, times in todo:
                left -= 1
                ctx = job_ctx.copy()
                job = run(qs, lease, attempt, data, times, task)
                # the job's first step, as the carrier's task (Carrier.first_step, inline)
                enter_task(loop, task)
                try:
                    try:
                        value = ctx.run(job.send, None)
                    finally:
                        leave_task(loop, task)
                except StopIteration as stop:  # it ended there (a no-op handler)
                    item: Finish = stop.value
                except asyncio.CancelledError:  # the worker stops: the job goes back as is
                    if task.cancelling() or task.done():
                        carrier = self._carrier = Carrier(loop)
                        task = carrier.task
                    continue
                except Exception as exc:  # noqa: BLE001 - a bug of ours: a retry, not a lost slot
                    item = attempts.internal_error(lease, attempt, exc)
                else:  # it waits: it goes on in the carrier (its task now), then its outcome
                    self._track(qs, lease, task, tasks)
                    carrier.carry(self._job_rest(qs, lease, attempt, job, value, task), ctx)
                    carrier = self._carrier = Carrier(loop)
                    task = carrier.task
                    continue
                if task.cancelling():  # the job cancelled its own task (Carrier.spoilt; no
                    # task is done before the loop runs it again)
                    carrier = self._carrier = Carrier(loop)
                    task = carrier.task
                if (pending or lines) and progress is not None \
                        and progress.has_reports(qs.keys.tag, lease.job_id):
                    # its last reports go in before its outcome: handed over from a task
                    self._later = left  # (read by _outcome: jobs of the batch still to run)
                    self._carry_on(loop, carrier, qs, lease, ctx, tasks,
                                   self._outcome_of(qs, lease, item, task))
                    carrier = self._carrier
                    if carrier is None or carrier.spoilt:
                        carrier = self._carrier = Carrier(loop)
                    task = carrier.task
                    continue
                qs.buf.append(item)
                ended += 1
                if qs is not lane:
                    lanes.append(qs)
                    lane = qs
                if not left:
                    last = (qs, lease, ctx)
        finally:
            self._later = 0
            if outer is not None:
                enter_task(loop, outer)
            if not nested:
                attempts.flush_seen()
        if not ended:
            return
        self._handed_over(ended)
        settler = self._settler
        if last is not None:
            qs, lease, ctx = last
            if (len(qs.buf) == 1 and qs.settle_idle and not qs.sending and settler is not None
                    and not self._tasks):
                # the only job running, its lane's settling loop idle: its outcome goes out
                # at once, from its own task (under load the loop batches them); the
                # batch's other lanes (a claim of several priority levels) are woken as
                # below, or their outcomes would wait for their lane's next one (the job
                # 'active', its lease renewed, for as long as that lane stays quiet)
                for other in lanes:
                    if other is not qs:
                        other.flush.set()
                carrier = self._carrier
                if carrier is None or carrier.spoilt:
                    carrier = self._carrier = Carrier(loop)
                self._carry_on(loop, carrier, qs, lease, ctx, tasks,
                               self._settle_lone(qs, lease, settler, carrier.task), outer)
                return
        woken = None
        for qs in lanes:
            if qs is not woken:
                qs.flush.set()
                woken = qs

    def _carry_on(self, loop: asyncio.AbstractEventLoop, carrier: Carrier, qs: QState,
                lease: Lease, ctx: contextvars.Context, tasks: list[asyncio.Task[None]] | None,
                coro: Coroutine[Any, Any, None], outer: asyncio.Task[Any] | None = None
                ) -> None:
        """Run ``coro`` (what is left of a job whose attempt ended in its first step) as
        its first step in ``carrier``; if it waits, the carrier is its task (tracked)."""
        if outer is not None:  # (none may be current while a first step runs)
            leave_task(loop, outer)
        try:
            waits = carrier.run_first_step(loop, coro, ctx)
        except Exception:  # (a bug of ours: as a task's exception would, logged)
            log.exception("job %s: internal error", lease.job_id)
            return
        finally:
            if outer is not None:
                enter_task(loop, outer)
        if waits:
            self._carrier = None
            self._track(qs, lease, carrier.task, tasks)

    def _track(self, qs: QState, lease: Lease, task: asyncio.Task[None],
               tasks: list[asyncio.Task[None]] | None) -> None:
        """A job runs on in ``task`` (which takes itself out of both when it ends)."""
        self._tasks.add(task)
        self._jobs[(qs.keys.tag, lease.entry)] = task
        if tasks is not None:
            tasks.append(task)

    def _untrack(self, qs: QState, lease: Lease, me: Any) -> None:
        self._tasks.discard(me)
        key = (qs.keys.tag, lease.entry)
        if self._jobs.get(key) is me:
            del self._jobs[key]

    async def _run_job(self, qs: QState, lease: Lease, attempt: int, data: bytes,
                       times: tuple[int, int, int]) -> None:
        """A job in a task of its own (an interpreter without eager starts)."""
        me: Any = asyncio.current_task()
        try:
            try:
                item = await self._attempts.attempt(qs, lease, attempt, data, times, me)
            except asyncio.CancelledError:  # worker stopping: hand the job back, untouched
                return
            except Exception as exc:  # noqa: BLE001 - a bug of ours: a retry, never a lost slot
                item = self._attempts.internal_error(lease, attempt, exc)
            await self._outcome(qs, lease, item, me)
        finally:  # (a task cancelled before it ever ran never gets here: stop() sweeps it)
            self._untrack(qs, lease, me)

    async def _job_rest(self, qs: QState, lease: Lease, attempt: int,
                        coro: Coroutine[Any, Any, Finish], waiting: Any, me: Any) -> None:
        """The rest of a job whose first step waited (on ``waiting``): its attempt carried
        on to its end, then its outcome handed over."""
        try:
            try:
                item = await Resumed(coro, waiting)
            except asyncio.CancelledError:  # worker stopping: hand the job back, untouched
                return
            except Exception as exc:  # noqa: BLE001 - a bug of ours: a retry, never a lost slot
                item = self._attempts.internal_error(lease, attempt, exc)
            await self._outcome(qs, lease, item, me)
        finally:
            self._untrack(qs, lease, me)

    async def _outcome_of(self, qs: QState, lease: Lease, item: Finish, me: Any) -> None:
        """``_outcome`` for a job whose attempt ended in its first step, in a carrier."""
        try:
            await self._outcome(qs, lease, item, me)
        finally:
            self._untrack(qs, lease, me)

    async def _outcome(self, qs: QState, lease: Lease, item: Finish, me: Any) -> None:
        """An attempt's outcome, handed over for settling: its job's last progress reports
        written first; the only job running sends it itself when its lane's settling loop is
        idle, else the loop is woken."""
        progress = self._progress  # its last reports go in before its outcome
        tag = qs.keys.tag
        if progress is not None and progress.has_reports(tag, lease.job_id):
            try:
                await progress.settle_first(tag, lease.job_id)
            except asyncio.CancelledError:
                return
        qs.buf.append(item)
        self._handed_over()
        settler = self._settler
        if (len(qs.buf) == 1 and qs.settle_idle and not qs.sending and settler is not None
                and not self._later and len(self._tasks) == (me in self._tasks)):
            # the only job running, its lane's settling loop idle: send the outcome
            # from here (under load the loop batches them: never one call per job)
            try:
                await settler.settle_now(qs)
            except asyncio.CancelledError:  # stopping: the settling loop sends it
                return
        else:
            qs.flush.set()

    async def _settle_lone(self, qs: QState, lease: Lease, settler: Settler, me: Any
                           ) -> None:
        """The lone job's outcome sent at once (``_start_jobs``), from a task of its own."""
        try:
            await settler.settle_now(qs)
        except asyncio.CancelledError:  # stopping: the settling loop sends it
            return
        finally:
            self._untrack(qs, lease, me)

    def _sweep_tasks(self) -> None:
        """Forget job tasks that ended without running their own clean-up (cancelled before
        their first step)."""
        self._tasks = {t for t in self._tasks if not t.done()}
        self._jobs = {k: t for k, t in self._jobs.items() if not t.done()}
