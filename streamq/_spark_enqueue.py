"""The executor side of ``streamq.spark.enqueue_dataframe``: one task per partition, fed Arrow
record batches by ``DataFrame.mapInArrow`` (no Row objects), enqueueing through enqueue.lua in
pipelined batches. It yields one small record batch of counts per task; the driver sums what
the successful tasks returned (exact, whatever Spark retries)."""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator
from typing import Any

import attrs
import pyarrow as pa

from . import _producer as prod
from ._config import QueueConfig
from ._errors import InvalidArgument, InvalidJobId, PayloadTooLarge, SerializationError
from ._keys import Keys
from ._scripts import SCRIPTS, Pipelined

COUNTS_SCHEMA = "outcome string, n long"
_STATUS = {"queued": "enqueued", "scheduled": "enqueued", "duplicate": "duplicates",
           "rejected": "rejected:queue_full"}


def reason(exc: Exception) -> str:
    """The ``rejected`` key for a row that prepare() refused."""
    if isinstance(exc, InvalidJobId):
        return "invalid_id"
    if isinstance(exc, PayloadTooLarge):
        return "payload_too_large"
    if isinstance(exc, SerializationError):
        return "unserialisable_payload"
    if "delay" in str(exc):
        return "invalid_delay"
    return "invalid_row"


def client_for(url: str, cluster: bool) -> Any:
    if cluster:
        from redis.cluster import RedisCluster

        return RedisCluster.from_url(url, protocol=2)
    from ._conn import sync_client

    return sync_client(url, socket_timeout_s=60.0)


@attrs.frozen
class EnqueueTask:
    """Picklable: Spark ships it to the executors. Input columns by position: the id, then
    the payload columns (``payload_names``) or the one payload column, then the delay."""

    url: str
    cluster: bool
    queue: str
    cfg: QueueConfig
    job_type: str
    payload_names: tuple[str, ...] | None
    has_delay: bool
    batch_size: int

    def __call__(self, batches: Iterable[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        keys = Keys(self.queue, self.cfg.key_prefix)
        counts: dict[str, int] = {}
        client = client_for(self.url, self.cluster)

        def tally(batch: list[prod.Prepared], reply: list[Any]) -> None:
            for r in prod.parse_enqueue(self.cfg, batch, reply, retried=True):
                key = _STATUS.get(r.status, r.status)
                counts[key] = counts.get(key, 0) + 1

        try:
            with Pipelined(SCRIPTS["enqueue"], client, tally) as pipe:
                pending: list[prod.Prepared] = []
                for rb in batches:
                    for p in self._prepare(keys, rb, counts):
                        pending.append(p)
                        if len(pending) >= self.batch_size:
                            pipe.send(pending, *prod.enqueue_call(keys, self.cfg, pending))
                            pending = []
                if pending:
                    pipe.send(pending, *prod.enqueue_call(keys, self.cfg, pending))
        finally:
            client.close()
        yield pa.RecordBatch.from_pydict({"outcome": list(counts), "n": list(counts.values())})

    def _payloads(self, rb: pa.RecordBatch) -> list[Any]:
        if self.payload_names is None:
            values: list[Any] = rb.column(1).to_pylist(maps_as_pydicts="lossy")
            return values
        names = self.payload_names
        cols = [rb.column(1 + i).to_pylist(maps_as_pydicts="lossy") for i in range(len(names))]
        return [dict(zip(names, v, strict=True)) for v in zip(*cols, strict=True)]

    def _prepare(self, keys: Keys, rb: pa.RecordBatch, counts: dict[str, int]
                 ) -> Iterator[prod.Prepared]:
        ids = rb.column(0).to_pylist()
        payloads = self._payloads(rb)
        delays = rb.column(rb.num_columns - 1).to_pylist() if self.has_delay else [None] * len(ids)
        parse_json = self.payload_names is None
        prepare, cfg, job_type = prod.prepare, self.cfg, self.job_type
        for raw_id, payload, delay in zip(ids, payloads, delays, strict=True):
            if raw_id is None:
                counts["rejected:null_id"] = counts.get("rejected:null_id", 0) + 1
                continue
            if parse_json and isinstance(payload, str):
                try:
                    payload = json.loads(payload)
                except ValueError:
                    counts["rejected:invalid_json"] = counts.get("rejected:invalid_json", 0) + 1
                    continue
            try:
                yield prepare(keys, cfg, job_type, payload, job_id=str(raw_id), delay=delay)
            except InvalidArgument as exc:
                key = "rejected:" + reason(exc)
                counts[key] = counts.get(key, 0) + 1
