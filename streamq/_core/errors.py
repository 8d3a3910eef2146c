"""The one exception tree of streamq.

Every error streamq raises on purpose derives from :class:`StreamqError`. Errors about bad
arguments also derive from :class:`ValueError`, and :class:`WaitTimeout` from
:class:`TimeoutError`, so callers may catch them either way. ``docs/errors.md`` lists them all.

:class:`Retry` and :class:`Fail` are not errors of streamq: handlers raise them to steer the
outcome of one attempt.
"""

from __future__ import annotations

from typing import Any


class StreamqError(Exception):
    """Base class of every error streamq raises."""


class InvalidArgument(StreamqError, ValueError):
    """An argument at the API boundary is out of range or malformed. Nothing was written."""


class InvalidJobId(InvalidArgument):
    """A job id is empty, too long, or has characters outside the allowed set."""


class InvalidQueueName(InvalidArgument):
    """A queue name is empty, too long, or has characters outside the allowed set."""


class InvalidGroup(InvalidArgument):
    """A group name is empty, too long, or has characters outside the allowed set."""


class InvalidPriority(InvalidArgument):
    """A priority outside 0..4 (or not an integer)."""


class InvalidDedup(InvalidArgument):
    """A ``Dedup`` (``enqueue(dedup=...)``) with a bad key, mode or duration, a combination the
    mode does not take (``delay=`` with debounce), or a job id outside the dedup key's shard.
    Nothing was written."""


class InvalidSearch(InvalidArgument):
    """A bad search filter (``Admin.find``, ``streamq find``): an unknown state, a payload field
    not declared indexable for the job type (``SearchConfig.fields``), a bad time range, id
    prefix or cursor. Nothing was read."""


class PayloadTooLarge(InvalidArgument):
    """The serialised job envelope is larger than the queue's ``max_payload_bytes``."""


class SerializationError(InvalidArgument):
    """A payload, result or header could not be serialised (or deserialised) by the serde."""

    def __init__(self, message: str = "", *, path: tuple[str | int, ...] | None = None) -> None:
        super().__init__(message)
        self.path = path
        """Key path of the value that could not be encoded, when known."""


class UnknownJobType(InvalidArgument):
    """With ``QueueConfig.require_handler``: no worker of the queue has a handler for this type."""


class QueueFull(StreamqError):
    """The queue holds ``max_depth`` jobs (ready + in flight + delayed); the job was rejected."""

    def __init__(self, queue: str, job_id: str) -> None:
        super().__init__(f"queue {queue!r} is full; job {job_id!r} was not accepted")
        self.queue = queue
        self.job_id = job_id


class JobNotFound(StreamqError, LookupError):
    """No record exists for this job id (never enqueued, or its record expired)."""


class UnknownQueue(StreamqError, LookupError):
    """No key of this queue exists (never used, or a typo, or the wrong key prefix)."""


class ShardCountMismatch(StreamqError):
    """``QueueConfig.shards`` disagrees with the shard count stored with the queue (and with
    every earlier count a reshard keeps). Nothing was read or written: use the stored count;
    change it with ``streamq reshard`` (docs/scaling.md#resharding)."""

    def __init__(self, queue: str, configured: int, stored: int) -> None:
        super().__init__(
            f"queue {queue!r} is stored with shards={stored}, but this object was configured"
            f" with shards={configured}: use QueueConfig(shards={stored}) (every producer,"
            " worker, scheduler and admin of a queue must agree); to change the count while it"
            f" runs: `streamq reshard {queue} <count>`")
        self.queue = queue
        self.configured = configured
        self.stored = stored


class ReshardInProgress(StreamqError):
    """A reshard of the queue to another count has begun and is not finished: finish it
    first (repeat ``streamq reshard`` with that count), then change the count again."""

    def __init__(self, queue: str, asked: int, begun: int) -> None:
        super().__init__(f"queue {queue!r} is being resharded to {begun} shards; asked for"
                         f" {asked}: repeat the reshard to {begun} first")
        self.queue = queue
        self.asked = asked
        self.begun = begun


class LayoutChanged(StreamqError):
    """A shard of the queue refused a write routed by an old shard count (the queue was
    resharded meanwhile) and wrote nothing. The producer paths re-read the layout and resend
    on their own; this reaches a caller only from a path that cannot (it names the count)."""

    def __init__(self, queue: str, shards: int) -> None:
        super().__init__(f"queue {queue!r} now has {shards} shards (resharded): nothing was"
                         " written; resend with the new layout")
        self.queue = queue
        self.shards = shards


class ReplicationTimeout(StreamqError):
    """With ``QueueConfig.min_replicas``: fewer replicas than asked confirmed an enqueue in
    time. The jobs ARE written on the primary (``results`` says how each was answered); they
    can be lost only if that primary dies before replicating them. Enqueueing them again with
    the same job ids is safe (dedup answers ``duplicate`` for those that survived). Raised
    by ``Admin.reshard`` / ``reshard_finish`` too (``job_ids`` empty, ``what`` names the
    reshard): the layout stands on the primary, and repeating the call is safe."""

    def __init__(self, job_ids: list[str], replicas: int, wanted: int, timeout_ms: int,
                 results: list[Any] | None = None, *, what: str | None = None) -> None:
        shown = ", ".join(repr(j) for j in job_ids[:5]) + (" …" if len(job_ids) > 5 else "")
        super().__init__(
            f"{len(job_ids)} job(s) ({shown}) written on the primary but confirmed by"
            f" {replicas} of {wanted} replica(s) within {timeout_ms} ms: they are lost only if"
            " the primary dies before replicating them; enqueueing them again with the same"
            " job ids is safe" if what is None else
            f"{what} written on the primary but confirmed by {replicas} of {wanted}"
            f" replica(s) within {timeout_ms} ms: repeating it is safe")
        self.job_ids = job_ids
        self.replicas = replicas
        self.wanted = wanted
        self.timeout_ms = timeout_ms
        self.results = results or []
        """The EnqueueResult of every job of the call (accepted, duplicate or rejected)."""


class PartialEnqueueError(StreamqError):
    """A multi-job enqueue (``enqueue_many``) of which some script calls failed while others
    were answered: on a Redis Cluster a sharded queue's shards live on several nodes, and one
    node can be down or stalled while the others take their jobs; on any server one shard's
    call can be refused (a damaged key) while the others' are not. Nothing is hidden: every
    job has its own outcome, in the caller's order.

    ``results`` holds one ``EnqueueResult`` per job: ``queued``, ``scheduled``, ``duplicate``
    and ``rejected`` as ``enqueue_many`` returns them, and ``error`` for a job whose own
    shard's call failed (its ``exception`` is that error; the job may or may not have been
    written, as after any failed call). ``errors`` maps each such job id to its error,
    ``job_ids`` lists them. A job that was written is never among them. With
    ``QueueConfig.min_replicas``, ``replication`` is the ReplicationTimeout of the written
    jobs whose replicas fell short (None when every written job was confirmed).

    Enqueueing the failed jobs again (or the whole list: the written ones answer
    ``duplicate``) with the same job ids is safe. A call where no job was answered at all
    raises the error itself, as before."""

    def __init__(self, queue: str, results: list[Any], errors: dict[str, BaseException],
                 replication: ReplicationTimeout | None = None) -> None:
        failed = [r.job_id for r in results if r.job_id in errors]
        shown = ", ".join(repr(j) for j in failed[:5]) + (" …" if len(failed) > 5 else "")
        first = next(iter(errors.values()), None)
        kinds = sorted({type(e).__name__ for e in errors.values()})
        super().__init__(
            f"queue {queue!r}: {len(failed)} of {len(results)} job(s) ({shown}) not enqueued:"
            f" their shard's call failed ({', '.join(kinds)}: {first}); every other job was"
            " answered (see .results); enqueueing the failed ones again with the same job ids"
            " is safe")
        self.queue = queue
        self.results = results
        """One EnqueueResult per job, in the caller's order (status 'error' for a failed one)."""
        self.errors = errors
        """Job id -> the error of its own shard's call."""
        self.job_ids = failed
        """The jobs whose call failed, in the caller's order."""
        self.replication = replication
        """With min_replicas: the written jobs not confirmed in time (or None)."""


class ConnectionSetupError(StreamqError):
    """The URL's form does not match the server: a cluster URL that reaches a standalone
    server (or the reverse), or a Sentinel primary name that no sentinel knows."""


class ServerTooOld(StreamqError):
    """The Redis server is older than 6.2 (XAUTOCLAIM and XPENDING IDLE are needed)."""


class ResultNotReady(StreamqError):
    """The job has not finished yet."""


class BatchClosed(StreamqError):
    """``Batch.add`` on a batch that is closed, cancelled, or whose callbacks have all fired
    or ended. Nothing was added."""


class JobFailed(StreamqError):
    """The job ended in ``failed`` (dead-lettered) or ``cancelled``; ``error`` tells why."""

    def __init__(self, job_id: str, state: str, error: dict[str, Any] | None) -> None:
        detail = ""
        if error:
            detail = f": {error.get('type', '')}: {error.get('message', '')}"
        super().__init__(f"job {job_id!r} ended {state}{detail}")
        self.job_id = job_id
        self.state = state
        self.error = error or {}


class WaitTimeout(StreamqError, TimeoutError):
    """Waiting for a result took longer than asked. The job itself goes on."""

    def __init__(self, job_id: str, timeout_s: float) -> None:
        super().__init__(f"job {job_id!r} did not finish within {timeout_s:g} s")
        self.job_id = job_id


class RegistryError(StreamqError):
    """A handler was registered twice, under an invalid name, or cannot take a Job."""


class InvalidPayload(InvalidArgument):
    """A typed task's payload does not match its parameters (a missing or unknown argument, a
    value of the wrong type): the job is dead-lettered at once with this message as its
    reason, never retried (retrying the same payload fails the same way)."""


class StartupFailed(StreamqError):
    """A startup hook (``@registry.on_startup``) raised: the worker did not start, nothing
    was fetched. ``hook`` names the hook; the hook's exception is the ``__cause__``."""

    def __init__(self, hook: str, exc: BaseException) -> None:
        super().__init__(f"startup hook {hook} failed: {type(exc).__name__}: {exc}; the"
                         " worker did not start")
        self.hook = hook


class ProcessDied(StreamqError):
    """Never raised to a caller: the attempt's error when the pool child running an isolated
    handler (``isolation="process"``, ``pool="process"``) died mid-job (a signal such as an
    OOM kill or a segfault, ``os._exit``): the message names the exit cause (``worker process
    died: signal 9 (SIGKILL)``). Retried like any failure; ``retry_on``/``fail_on`` see it."""


class ScriptError(StreamqError):
    """A streamq Lua script failed on the server (a bug or a corrupted key).

    The message names the script."""


MAX_RETRY_AFTER_S = 86400.0
"""The longest ``RateLimited.retry_after`` a worker honours (one day)."""


class RateLimited(StreamqError):
    """Raise from a handler when a downstream service says "too many requests" (an HTTP 429):
    the job goes back to the delayed set for ``retry_after`` seconds **without counting an
    attempt** (``max_attempts`` is not consumed), keeping its options. ``retry_after`` must be
    a finite number of seconds, > 0 and <= ``MAX_RETRY_AFTER_S`` (one day); any other value
    turns the attempt into an ordinary failure (retried with backoff, error
    ``InvalidArgument``), so a job is never lost to a bad value. ``group=True``: the job's
    whole group (``group=`` at enqueue) is held back as long (no job of it starts until then);
    an ungrouped job ignores it."""

    def __init__(self, retry_after: float, reason: str = "rate limited", *,
                 group: bool = False) -> None:
        super().__init__(f"{reason} (retry after {retry_after!r} s)")
        self.retry_after = retry_after
        self.reason = reason
        self.group = group


class WaitForChildren(StreamqError):
    """Raise from a handler after ``Queue.add_children(job.id, ...)``: the job waits for the
    children it added (state ``waiting``) and runs again once they have all ended, the
    attempt not counted (the next run has the same ``job.attempt``). If every child has
    already ended when the job settles, it goes back to the ready stream at once: a child that
    finished first cannot strand it (docs/workflows.md#dynamic-children)."""

    def __init__(self, reason: str = "waiting for children") -> None:
        super().__init__(reason)
        self.reason = reason


class Retry(Exception):
    """Raise from a handler to retry this job; ``delay_s=None`` uses the backoff policy."""

    def __init__(self, reason: str = "retry requested", *, delay_s: float | None = None) -> None:
        super().__init__(reason)
        self.reason = reason
        self.delay_s = delay_s


class Fail(Exception):
    """Raise from a handler to dead-letter this job now, without further attempts."""

    def __init__(self, reason: str = "failed by handler") -> None:
        super().__init__(reason)
        self.reason = reason
