"""Lease renewal on its own thread and connection, so handler code cannot starve it.

An async handler that blocks the event loop, or a pool full of busy sync handlers, still
gets its lease renewed: this thread only needs the GIL now and then.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from typing import Any

import attrs
import redis

from .._core.keys import GROUP, Keys
from .._core.model import CancelFlag
from .._core.scripts import SCRIPTS
from .._core.supervise import Outage, Supervised

log = logging.getLogger("streamq.worker")
_BATCH = 1000


@attrs.define(eq=False)  # (equal only to itself, as when each lease had its own flag)
class Lease(CancelFlag):
    """One job's lease while this worker runs it. It is the job's cancel flag as well
    (``cancel``, a ``CancelFlag``: set once the worker learns that a cancel was requested):
    one object per job, not two."""

    keys: Keys
    job_id: str
    entry: str
    token: str
    started: float = attrs.field(factory=time.monotonic)
    lost: bool = False
    _set: bool = attrs.field(default=False, init=False)
    """The cancel flag's state (``CancelFlag``'s slot)."""
    task: Any = None
    """The task running the job's async handler, while it runs (cancel.py interrupts it)."""
    interrupted: bool = False
    deps: Any = None
    """The job's dependency results as the script that started it sent them (field, value,
    ...: finish.lua's hand-off), read instead of the results HASH; None: read them."""
    report: Any = None
    """The worker's ``Progress.record`` while the lease is the job's reporter (``__call__``):
    set by the attempt, one store per job instead of a bound method made per job."""

    def __call__(self, kind: str, value: Any) -> Any:
        """The job's reporter (``Job.progress`` and ``Job.log``): ``record`` with this
        lease."""
        return self.report(self, kind, value)

    @property
    def cancel(self) -> CancelFlag:
        """Set (on the event loop) once the worker learns that a cancel was requested
        (cancel.py); the handler's ``job.cancel_requested``. The lease itself."""
        return self


_new = object.__new__


def new_lease(keys: Keys, job_id: str, entry: str, token: str, started: float) -> Lease:
    """``Lease(keys, job_id, entry, token, started)`` for the fetch path (once per job): the
    same object, its slots written here, without calling the class (about 1,100 CPU
    instructions less per job). Keep it in step with Lease's fields: checked at import."""
    lease = _new(Lease)
    lease.keys = keys
    lease.job_id = job_id
    lease.entry = entry
    lease.token = token
    lease.started = started
    lease.lost = False
    lease._set = False
    lease.task = None
    lease.interrupted = False
    lease.deps = None
    lease.report = None
    return lease


def _check_new_lease() -> None:
    names = [a.name for a in attrs.fields(Lease)]
    a: Any = names
    made, built = new_lease(a[0], a[1], a[2], a[3], 0.0), Lease(a[0], a[1], a[2], a[3], 0.0)
    if [getattr(made, n, made) for n in names] != [getattr(built, n) for n in names]:
        raise ImportError("streamq: Lease's fields changed; update lease.new_lease")


_check_new_lease()


class LeaseKeeper:
    """Holds the worker's leases; renews those older than ``every_s`` every ``every_s``."""

    def __init__(self, client_factory: Callable[[], redis.Redis], consumer: str,
                 every_s: float, outage: Outage | None = None) -> None:
        self._factory = client_factory
        self._consumer = consumer
        self._every_s = every_s
        self._lock = threading.Lock()
        self._leases: dict[str, dict[str, Lease]] = {}
        """The leases held, by lane (its keys' tag), then by entry: no tuple made per job."""
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.renewed = 0
        self.lost = 0
        self.on_cancel: Callable[[Lease], None] | None = None
        """Called (from this thread) for a lease whose renewal says a cancel was requested."""
        self.on_lost: Callable[[Lease], None] | None = None
        """Called (from this thread) for a lease whose renewal found it lost (another worker
        took the job over): its handler is stopped (cancel.py's abandon)."""
        # after an error, try again soon: renewals must resume as soon as the server answers
        self.loop = Supervised("lease renewal", log, outage=outage, min_backoff_s=0.02,
                               max_backoff_s=max(0.05, every_s / 4))

    def _lane(self, tag: str) -> dict[str, Lease]:
        """The lane's leases by entry (made at its first lease; call it under the lock)."""
        held = self._leases.get(tag)
        if held is None:
            held = self._leases[tag] = {}
        return held

    def add(self, lease: Lease) -> None:
        with self._lock:
            self._lane(lease.keys.tag)[lease.entry] = lease

    def add_many(self, leases: list[Lease]) -> None:
        """``add`` for each of a batch's leases, under one lock."""
        with self._lock:
            keys: Keys | None = None
            held: dict[str, Lease] = {}
            for lease in leases:
                if lease.keys is not keys:  # (a batch's leases share their lane's keys)
                    keys = lease.keys
                    held = self._lane(keys.tag)
                held[lease.entry] = lease

    def _get(self, queue: str, entry: str) -> Lease | None:
        held = self._leases.get(queue)
        return held.get(entry) if held is not None else None

    def backdate(self, queue: str, entry: str, token: str, since: float) -> None:
        """The lease of (entry, token) may have begun as early as ``since`` (a hand-off:
        started by a producer before this worker learnt of it): it is renewed as if it had."""
        with self._lock:
            lease = self._get(queue, entry)
            if lease is not None and lease.token == token and since < lease.started:
                lease.started = since

    def remove(self, queue: str, entry: str) -> None:
        with self._lock:
            held = self._leases.get(queue)
            if held is not None:
                held.pop(entry, None)

    def remove_many(self, queue: str, settled: list[tuple[str, str]]) -> None:
        """Drop the leases of settled (entry, token) pairs; a newer lease of the same entry
        (taken over again after this one was lost) stays."""
        with self._lock:
            held = self._leases.get(queue)
            if held is None:
                return
            for entry, token in settled:
                lease = held.get(entry)
                if lease is not None and lease.token == token:
                    del held[entry]

    def remove_settled(self, queue: str, settled: Iterable[Sequence[Any]]) -> None:
        """``remove_many`` for outcomes (job id, entry, token, ...): a batch settled."""
        with self._lock:
            held = self._leases.get(queue)
            if held is None:
                return
            for item in settled:
                entry = item[1]
                lease = held.get(entry)
                if lease is not None and lease.token == item[2]:
                    del held[entry]

    def holds(self, queue: str, entry: str) -> bool:
        """True while this worker holds a live (not lost) lease of the entry."""
        with self._lock:
            lease = self._get(queue, entry)
            return lease is not None and not lease.lost

    def snapshot(self) -> list[Lease]:
        with self._lock:
            return [lease for held in self._leases.values() for lease in held.values()]

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="streamq-lease", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)

    def _run(self) -> None:
        client = self._factory()

        def step() -> float:
            self.renew_once(client)
            return self._every_s / 2

        try:
            if not self._stop.wait(self._every_s / 2):
                self.loop.run_sync(step, self._stop)
        finally:
            client.close()

    def renew_once(self, client: redis.Redis) -> None:
        cutoff = time.monotonic() - self._every_s / 2  # ticks every half period: a lease is
        # renewed at most one period (a third of the visibility timeout) after its last renewal
        by_queue: dict[str, list[Lease]] = {}
        for lease in self.snapshot():
            if lease.started <= cutoff and not lease.lost:
                by_queue.setdefault(lease.keys.tag, []).append(lease)
        for leases in by_queue.values():
            for i in range(0, len(leases), _BATCH):
                batch = leases[i:i + _BATCH]
                keys = [batch[0].keys.stream, *(x.keys.job(x.job_id) for x in batch)]
                args: list[str] = [GROUP, self._consumer]
                for x in batch:
                    args += [x.entry, x.token]
                reply = SCRIPTS["renew"](client, keys, args)
                for x, ok in zip(batch, reply, strict=True):
                    if ok == 3:  # its own outcome is in (the settle's reply not read yet):
                        x.lost = True  # nothing to renew, nothing to stop, nothing to say
                    elif ok:
                        self.renewed += 1
                        if ok == 2 and self.on_cancel is not None:  # renew.lua: cancel asked
                            self.on_cancel(x)
                    else:
                        x.lost = True
                        self.lost += 1
                        log.warning("lease lost for job %s (entry %s): another worker took it"
                                    " over; stopping its handler here", x.job_id, x.entry)
                        if self.on_lost is not None:
                            self.on_lost(x)
