"""The one key builder. No key name is assembled anywhere else (and never inside Lua).

Every key of queue ``Q`` carries the hash tag ``{Q}``, so all keys of a queue live in one
Redis Cluster slot and one script may touch them all.
"""

from __future__ import annotations

import re

import attrs

from .errors import InvalidJobId, InvalidQueueName

_QUEUE_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._:@/+=-]{0,127}")
_JOB_ID_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._:@/+=#-]{0,199}")
_PREFIX_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._:-]{0,63}")

GROUP = "streamq"
"""The consumer group every worker of every queue reads with."""


def check_queue_name(name: str) -> str:
    if not isinstance(name, str) or not _QUEUE_RE.fullmatch(name):
        raise InvalidQueueName(
            f"invalid queue name {name!r}: 1-128 characters of A-Z a-z 0-9 . _ : @ / + = -,"
            " starting with a letter or digit"
        )
    return name


def check_job_id(job_id: str) -> str:
    if not isinstance(job_id, str) or not _JOB_ID_RE.fullmatch(job_id):
        raise InvalidJobId(
            f"invalid job id {job_id!r}: 1-200 characters of A-Z a-z 0-9 . _ : @ / + = # -,"
            " starting with a letter or digit"
        )
    return job_id


def queues_key(prefix: str = "streamq") -> str:
    """SET of queue names that workers and schedulers have served (for `streamq stats`).

    It has no hash tag: it is written with a plain SADD, never inside a queue's script."""
    return f"{prefix}:queues"


@attrs.frozen
class Keys:
    """Key names of one queue."""

    queue: str = attrs.field(validator=lambda _i, _a, v: check_queue_name(v))
    prefix: str = "streamq"

    def __attrs_post_init__(self) -> None:
        if not isinstance(self.prefix, str) or not _PREFIX_RE.fullmatch(self.prefix):
            raise InvalidQueueName(f"invalid key prefix {self.prefix!r}")

    @property
    def base(self) -> str:
        return f"{self.prefix}:{{{self.queue}}}"

    @property
    def stream(self) -> str:
        return f"{self.base}:stream"

    @property
    def delayed(self) -> str:
        return f"{self.base}:delayed"

    @property
    def dead(self) -> str:
        return f"{self.base}:dead"

    @property
    def events(self) -> str:
        return f"{self.base}:events"

    @property
    def stats(self) -> str:
        return f"{self.base}:stats"

    @property
    def lease_seq(self) -> str:
        return f"{self.base}:lease_seq"

    @property
    def paused(self) -> str:
        return f"{self.base}:paused"

    @property
    def cron(self) -> str:
        """Cron state: '<name>:last' = last fired tick (ms), '<name>' = ops info (JSON)."""
        return f"{self.base}:cron"

    @property
    def workers(self) -> str:
        return f"{self.base}:workers"

    @property
    def types(self) -> str:
        """HASH: job type -> when a worker of this queue last published a handler for it."""
        return f"{self.base}:types"

    @property
    def wake_channel(self) -> str:
        """Pub/sub channel told when a delayed job becomes the earliest due."""
        return f"{self.base}:wake"

    @property
    def series_minutes(self) -> str:
        """HASH: epoch minute -> that minute's outcomes (JSON), kept 6 hours (timeseries.lua)."""
        return f"{self.base}:ts:m"

    @property
    def series_hours(self) -> str:
        """HASH: epoch hour -> that hour's outcomes (JSON), kept 30 days."""
        return f"{self.base}:ts:h"

    def worker_info(self, consumer: str) -> str:
        return f"{self.base}:worker:{consumer}"

    def job(self, job_id: str) -> str:
        return f"{self.prefix}:{{{self.queue}}}:job:{job_id}"

    def done_channel(self, job_id: str) -> str:
        """Pub/sub channel told when this job reaches a terminal state (releases before the
        shared waiter channel used one per job; their waiters still work)."""
        return f"{self.base}:done:{job_id}"

    def waiter_channel(self, tag: str) -> str:
        """Pub/sub channel of one producer object's waiters: every job it waits on names it
        as its 'notify' channel; messages are '<state> <job id>'."""
        return f"{self.base}:wait:{tag}"


def notify_allowed(keys: Keys, channel: str, job_id: str) -> bool:
    """A notify channel a producer may give a job: the job's own done channel or a waiter
    channel of its queue (nothing else: notifications stay inside the queue)."""
    if channel == keys.done_channel(job_id):
        return True
    prefix = keys.waiter_channel("")
    tag = channel[len(prefix):]
    return channel.startswith(prefix) and 0 < len(tag) <= 64 and tag.isalnum()
