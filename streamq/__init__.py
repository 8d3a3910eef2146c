"""streamq: a job engine for Python services on Redis Streams consumer groups.

Public surface only; everything else lives in private modules. Errors: see ``_core/errors.py``
(documented in ``docs/errors.md``).
"""

from ._core.config import (
    ALL_EVENTS,
    DEFAULT_EVENTS,
    GroupRate,
    QueueConfig,
    RateLimit,
    RetryPolicy,
    SearchConfig,
    WorkerConfig,
)
from ._core.context import Context
from ._core.dedup import Dedup
from ._core.errors import (
    BatchClosed,
    ConnectionSetupError,
    Fail,
    InvalidArgument,
    InvalidDedup,
    InvalidGroup,
    InvalidJobId,
    InvalidPayload,
    InvalidPriority,
    InvalidQueueName,
    InvalidSearch,
    JobFailed,
    JobNotFound,
    LayoutChanged,
    PartialEnqueueError,
    PayloadTooLarge,
    ProcessDied,
    QueueFull,
    RateLimited,
    RegistryError,
    ReplicationTimeout,
    ReshardInProgress,
    ResultNotReady,
    Retry,
    ScriptError,
    SerializationError,
    ServerTooOld,
    ShardCountMismatch,
    StartupFailed,
    StreamqError,
    UnknownJobType,
    UnknownQueue,
    WaitForChildren,
    WaitTimeout,
)
from ._core.flow import BatchSummary, DependencyResult, JobRef
from ._core.keys import Keys
from ._core.model import STATES, CancelResult, EnqueueResult, Envelope, Job, JobInfo
from ._core.reshard import ReshardStatus
from ._core.serde import JsonSerde, MsgpackSerde, Serde
from ._core.telemetry import JobContextFilter, JsonFormatter
from ._producer.batches import AsyncBatch, Batch
from ._producer.flows import Chain, Chord, FlowResult, Group, JobSpec, chain, chord, group
from ._producer.queue import AsyncQueue, Queue
from ._version import VERSION
from ._worker import Worker, WorkerStats
from ._worker.registry import HandlerSpec, Registry
from ._worker.tasks import Task

__version__ = VERSION

__all__ = [
    "ALL_EVENTS",
    "DEFAULT_EVENTS",
    "STATES",
    "AsyncBatch",
    "AsyncQueue",
    "Batch",
    "BatchClosed",
    "BatchSummary",
    "CancelResult",
    "Chain",
    "Chord",
    "DependencyResult",
    "FlowResult",
    "Group",
    "JobRef",
    "JobSpec",
    "chain",
    "chord",
    "group",
    "Context",
    "Dedup",
    "EnqueueResult",
    "Envelope",
    "Fail",
    "HandlerSpec",
    "ConnectionSetupError",
    "GroupRate",
    "InvalidArgument",
    "InvalidDedup",
    "InvalidSearch",
    "SearchConfig",
    "InvalidGroup",
    "InvalidJobId",
    "InvalidPayload",
    "InvalidPriority",
    "InvalidQueueName",
    "Job",
    "JobFailed",
    "JobInfo",
    "JobContextFilter",
    "JobNotFound",
    "JsonFormatter",
    "JsonSerde",
    "Keys",
    "MsgpackSerde",
    "PayloadTooLarge",
    "Queue",
    "QueueConfig",
    "RateLimit",
    "QueueFull",
    "RateLimited",
    "WaitForChildren",
    "Registry",
    "RegistryError",
    "PartialEnqueueError",
    "ProcessDied",
    "ReplicationTimeout",
    "ResultNotReady",
    "Retry",
    "RetryPolicy",
    "ScriptError",
    "ShardCountMismatch",
    "LayoutChanged",
    "ReshardInProgress",
    "ReshardStatus",
    "StartupFailed",
    "Serde",
    "SerializationError",
    "ServerTooOld",
    "StreamqError",
    "Task",
    "UnknownJobType",
    "UnknownQueue",
    "WaitTimeout",
    "Worker",
    "WorkerConfig",
    "WorkerStats",
    "__version__",
]
