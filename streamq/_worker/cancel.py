"""Cancel of running jobs, on the worker's side.

``cancel(job_id)`` on an active job (cancel.lua) records the request in the job record
(``cx``) and publishes the job id on its shard's cancel channel (``Keys.cancel_channel``).
Every worker listens on the channels of the shards it serves (:class:`CancelWatch`); the one
that runs the job sets the lease's ``cancel`` event (the handler's ``job.cancel_requested``)
and cancels an async handler's task. Pub/sub can lose a message (a reconnect): on every
(re)subscription the records of the running jobs are read for ``cx``, and the lease renewal
reply says so too (renew.lua), so a request lost on the channel is still seen.

A handler that ends after the worker learned of the request (cancelled, returned, raised)
is settled with the ``cancel`` outcome (``Attempts.attempt``); finish.lua ends the job
``cancelled``. A handler that ended before that is settled as it ended (finish.lua turns
anything but a success into ``cancelled`` once ``cx`` is set).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Sequence
from typing import Any

from .._core.supervise import Outage, Supervised
from .lease import Lease, LeaseKeeper
from .state import Finish, QState

log = logging.getLogger("streamq.worker")
_RECENT_S = 30.0
"""A request for a job this worker does not run (yet) is remembered this long: a job whose
start reply is still on its way when the message arrives is stopped as soon as it launches."""
_BATCH = 1000
_POLL_S = 1.0
"""How often the running jobs' records are read for a cancel request when the client has no
pub/sub (the async cluster client of redis-py before 8.0)."""


def cancelled(lease: Lease) -> Finish:
    """The ``cancel`` outcome of a lease (finish.lua)."""
    return (lease.job_id, lease.entry, lease.token, "cancel", b"", "cancel requested", "")


def interrupt(lease: Lease) -> None:
    """Tell a running job that its cancel was requested (on the event loop): the handler's
    ``job.cancel_requested`` turns True and an async handler's task is cancelled."""
    if lease.lost or lease.cancel.is_set():
        return
    lease.cancel.set()
    log.info("job %s: cancel requested; stopping its handler", lease.job_id,
             extra={"job_id": lease.job_id, "queue": lease.keys.queue})
    if lease.task is not None:
        lease.interrupted = True
        lease.task.cancel()


def abandon(lease: Lease) -> None:
    """Stop the handler of a lease that another worker took over (the renewal found it lost:
    this worker stalled past the visibility timeout, e.g. a frozen process or a long GC
    pause). Its outcome would be refused anyway (fencing) and the job runs again elsewhere, so
    it must not go on beside the new owner, holding a second slot of the job's group: an
    async handler's task is cancelled, a sync handler sees ``job.cancel_requested``. The
    attempt is settled like a cancelled one, which finish.lua answers 'lost' (a stale token)."""
    if lease.cancel.is_set():
        return
    lease.cancel.set()
    if lease.task is not None:
        lease.interrupted = True
        lease.task.cancel()


class CancelWatch:
    """Listens on the cancel channels of a worker's queue shards (one subscriber connection)
    and stops the running jobs named there; the renewal thread's reports come here too."""

    def __init__(self, client: Any, queues: list[QState], leases: LeaseKeeper,
                 outage: Outage | None = None, alive: Sequence[str] = ()) -> None:
        self.client = client
        self._tags = {q.keys.cancel_channel: q.keys.shard_tag for q in queues}
        self._alive = list(alive)
        """Channels subscribed to only to be seen alive: a producer hands a job to a worker
        only while its inbox channel has a subscriber (hand-off, enqueue.lua), so a worker
        that is gone (its connection closed) is handed nothing."""
        self._leases = leases
        self._recent: dict[tuple[str, str], float] = {}
        self._checks: set[asyncio.Task[None]] = set()
        self._polling = False
        self.loop = Supervised("cancel requests", log, outage=outage, max_backoff_s=1.0)
        ev_loop = asyncio.get_running_loop()

        def from_thread(lease: Lease) -> None:
            ev_loop.call_soon_threadsafe(interrupt, lease)

        def lost_from_thread(lease: Lease) -> None:
            ev_loop.call_soon_threadsafe(abandon, lease)

        leases.on_cancel = from_thread
        leases.on_lost = lost_from_thread

    def task(self, running: Callable[[], bool]) -> asyncio.Task[None]:
        return asyncio.create_task(self.loop.run(self._listen, running))

    def add(self, qs: QState, inbox: str) -> None:
        """Listen on a shard a reshard added too (and keep its inbox seen alive); the
        subscription follows within a second."""
        self._tags[qs.keys.cancel_channel] = qs.keys.shard_tag
        if inbox not in self._alive:
            self._alive.append(inbox)

    def remove(self, qs: QState, inbox: str) -> None:
        """Stop listening on a retired shard (within a second)."""
        self._tags.pop(qs.keys.cancel_channel, None)
        if inbox in self._alive:
            self._alive.remove(inbox)

    @property
    def heard(self) -> bool:
        """Cancels of jobs not running here were heard lately (``launched`` may find one)."""
        return bool(self._recent)

    def launched(self, lease: Lease) -> None:
        """A job starts on this worker: if a cancel of its id was heard just before, ask its
        record (the message may have been for an earlier job of that id) and stop it."""
        if self._recent and self._recent.pop((lease.keys.shard_tag, lease.job_id),
                                             None) is not None:
            task = asyncio.create_task(self._confirm(lease))
            self._checks.add(task)
            task.add_done_callback(self._checks.discard)

    async def _confirm(self, lease: Lease) -> None:
        try:
            if await self.client.hget(lease.keys.job(lease.job_id), "cx") is not None:
                interrupt(lease)
        except Exception as exc:  # noqa: BLE001 - the renewal reply tells it later
            log.debug("job %s: cancel request not checked (%s)", lease.job_id, exc)

    def deliver(self, tag: str, job_id: str) -> None:
        found = False
        for lease in self._leases.snapshot():
            if lease.job_id == job_id and lease.keys.shard_tag == tag and not lease.lost:
                found = True
                interrupt(lease)
        if not found:
            now = time.monotonic()
            if len(self._recent) > _BATCH:
                self._recent = {k: t for k, t in self._recent.items() if now - t < _RECENT_S}
            self._recent[(tag, job_id)] = now

    async def check_running(self) -> None:
        """Ask the records of the running jobs whether a cancel was requested (requests
        published while this worker was not subscribed)."""
        leases = [x for x in self._leases.snapshot() if not x.lost and not x.cancel.is_set()]
        for i in range(0, len(leases), _BATCH):
            part = leases[i:i + _BATCH]
            pipe = self.client.pipeline(transaction=False)
            for x in part:
                pipe.hget(x.keys.job(x.job_id), "cx")
            for x, asked in zip(part, await pipe.execute(), strict=True):
                if asked:
                    interrupt(x)

    async def _listen(self) -> float:
        if not hasattr(self.client, "pubsub"):
            # redis-py before 8.0 has no async cluster pub/sub: ask the running jobs' records
            # every second instead (the lease renewal reply tells of a request too)
            if not self._polling:
                self._polling = True
                log.info("cancel requests: this redis-py has no cluster pub/sub; the records"
                         " of running jobs are read every %.0f s instead", _POLL_S)
            await self.check_running()
            return _POLL_S
        pubsub = self.client.pubsub(ignore_subscribe_messages=True)
        try:
            on = {*self._tags, *self._alive}
            await pubsub.subscribe(*on)
            await self.check_running()
            self.loop.ok()
            while True:  # until the worker stops (its task is cancelled)
                message = await pubsub.get_message(timeout=1.0)
                self.loop.ok()
                want = {*self._tags, *self._alive}
                if want != on:  # shards added or retired by a reshard
                    if want - on:
                        await pubsub.subscribe(*(want - on))
                    if on - want:
                        await pubsub.unsubscribe(*(on - want))
                    on = want
                if not isinstance(message, dict):
                    continue
                channel, data = message.get("channel"), message.get("data")
                if isinstance(channel, bytes):
                    channel = channel.decode(errors="replace")
                tag = self._tags.get(channel) if isinstance(channel, str) else None
                if tag is not None and isinstance(data, bytes) and data:
                    self.deliver(tag, data.decode(errors="replace"))
        finally:
            try:
                await pubsub.aclose()
            except Exception as exc:  # noqa: BLE001 - closing a broken connection
                log.debug("closing the cancel subscription: %s", exc)
