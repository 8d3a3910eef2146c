"""The executor side of ``streamq.spark.enqueue_dataframe``: one task per partition, fed Arrow
record batches by ``DataFrame.mapInArrow`` (no Row objects), enqueueing through enqueue.lua in
pipelined batches. It yields one small record batch of counts per task; the driver sums what
the successful tasks returned. Each row carries a writer tag that names it (run, partition,
task attempt, offset), so those counts are exact whatever Spark retries and however often an
id repeats (see enqueue.lua)."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable, Iterator
from typing import Any

import attrs
import pyarrow as pa
from pyspark import TaskContext

from .._core.config import QueueConfig
from .._core.driver import drive
from .._core.errors import InvalidArgument, InvalidJobId, PayloadTooLarge, SerializationError
from .._core.keys import Keys
from .._core.retry import call, layout_changed
from .._core.scripts import SCRIPTS, Pipelined
from .._core.shards import Layout
from .._producer import prepare as prod
from .._producer import relayout

COUNTS_SCHEMA = "outcome string, n long"
_STATUS = {b"queued": "enqueued", b"scheduled": "enqueued", b"duplicate": "duplicates",
           b"full": "rejected:queue_full"}


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
    """The client an executor uses: any URL form (``redis+cluster://`` needs no flag;
    ``cluster=True`` turns one node's ``redis://`` URL into that form)."""
    from .._core.conn import as_cluster_url, sync_client

    return sync_client(as_cluster_url(url) if cluster else url, socket_timeout_s=60.0)


@attrs.frozen
class EnqueueTask:
    """Picklable: Spark ships it to the executors. Input columns by position: the id, then
    the payload, then the delay (when ``has_delay``). The payload arrives as one of
    (``payload``): "json", JSON text made by Spark's to_json (the fast path: the envelope is
    built around it, see prepare_row_json); "cols", one column per name in
    ``payload_names`` (a dict is built per row); "value", one column whose value is the
    payload (a str is parsed as JSON text)."""

    url: str
    cluster: bool
    queue: str
    cfg: QueueConfig
    job_type: str
    payload: str
    payload_names: tuple[str, ...]
    has_delay: bool
    batch_size: int
    created_ms: int
    """The envelopes' creation time: when enqueue_dataframe was called."""
    str_keys_only: bool
    """Every mapping a payload can hold has str keys (no map columns): no key walk."""
    run: str
    """Names this enqueue_dataframe call (random, made on the driver). Every row is sent
    with a writer tag '<run>:<partition>:<task attempt id>:<row offset>' that a job it
    creates keeps: enqueue.lua tells a row whose job an earlier attempt of its task wrote
    (counted as enqueued, once) from a repeat of an id (a duplicate), whether the two rows
    are equal or not."""

    def __call__(self, batches: Iterable[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        keys = Keys(self.queue, self.cfg.key_prefix)
        counts: dict[str, int] = {}
        client = client_for(self.url, self.cluster)
        try:  # the partition routes by the layout stored now (docs/scaling.md#resharding)
            lay = call(lambda _r: drive(client, relayout.opened(keys, self.cfg)))
        except BaseException:
            client.close()
            raise
        if lay.shards != self.cfg.shards:
            yield from attrs.evolve(self, cfg=attrs.evolve(self.cfg, shards=lay.shards))._run(
                batches, keys, counts, client, lay)
        else:
            yield from self._run(batches, keys, counts, client, lay)

    def _run(self, batches: Iterable[pa.RecordBatch], keys: Keys, counts: dict[str, int],
             client: Any, lay: Layout) -> Iterator[pa.RecordBatch]:
        """The partition's rows, routed by ``lay`` (``self.cfg.shards`` is its count). A row
        whose id moved in a reshard is first looked for in its old homes (found: answered as
        enqueue.lua answers it, by its writer tag). A frozen shard's refusal (a reshard
        meanwhile) fails the task with LayoutChanged: Spark's retry of the task routes by the
        new layout, and the rows the failed attempt wrote count once (writer tags)."""

        def tally(batch: list[prod.Prepared], reply: list[Any] | int) -> None:
            # a status per job, followed by 4 more elements for a duplicate (enqueue.lua);
            # or the count of the jobs, every one queued (its plain batch; < 0: scheduled)
            if isinstance(reply, int):
                counts["enqueued"] = counts.get("enqueued", 0) + abs(reply)
                return
            at, n = 0, len(reply)
            while at < n:
                status = reply[at]
                if status == b"duplicate":
                    if reply[at + 4] == 1:  # this row, from a retried call or attempt
                        status = b"queued"
                    at += 5
                else:
                    at += 1
                key = _STATUS[status]
                counts[key] = counts.get(key, 0) + 1

        def reject(why: str) -> None:
            counts["rejected:" + why] = counts.get("rejected:" + why, 0) + 1

        ctx = TaskContext.get()  # None only when called outside a Spark task
        writer = (f"{self.run}:{ctx.partitionId()}:{ctx.taskAttemptId()}:" if ctx is not None
                  else f"{self.run}:0:0:")
        def send(pipe: Pipelined, part: list[prod.Prepared], tags: list[str]) -> None:
            if lay.prev:
                found = call(lambda _r: drive(client, relayout.look(keys, self.cfg, lay, part,
                                                                    True, tags)))
                for r in found.values():
                    key = "enqueued" if r.status == "queued" else "duplicates"
                    counts[key] = counts.get(key, 0) + 1
                part = [p for i, p in enumerate(part) if i not in found]
                tags = [t for i, t in enumerate(tags) if i not in found]
                if not part:
                    return
            pipe.send(part, *prod.enqueue_call(keys, self.cfg, part, tags))

        try:
            with Pipelined(SCRIPTS["enqueue"], client, tally) as pipe:
                # one batch being filled per shard (a script call stays in one slot)
                pending: dict[int, tuple[list[prod.Prepared], list[str]]] = {}
                offset = 0  # of the row in the partition, rejected rows included
                for rb in batches:
                    for at, p in self._prepare(keys, rb, reject, offset):
                        part, tags = pending.setdefault(p.shard, ([], []))
                        part.append(p)
                        tags.append(writer + str(at))
                        if len(part) >= self.batch_size:
                            send(pipe, part, tags)
                            del pending[p.shard]
                    offset += rb.num_rows
                for part, tags in pending.values():
                    send(pipe, part, tags)
        except Exception as exc:
            lc = layout_changed(exc, self.queue)
            if lc is None:
                raise
            raise lc from exc
        finally:
            client.close()
        yield pa.RecordBatch.from_pydict({"outcome": list(counts), "n": list(counts.values())})

    def _payloads(self, rb: pa.RecordBatch) -> list[Any]:
        if self.payload != "cols":
            values: list[Any] = rb.column(1).to_pylist(maps_as_pydicts="lossy")
            return values
        names = self.payload_names
        cols = [rb.column(1 + i).to_pylist(maps_as_pydicts="lossy") for i in range(len(names))]
        return [dict(zip(names, v, strict=True)) for v in zip(*cols, strict=True)]

    def _prepare(self, keys: Keys, rb: pa.RecordBatch, reject: Callable[[str], None],
                 offset: int) -> Iterator[tuple[int, prod.Prepared]]:
        """Each row of ``rb`` that can become a job, with its offset in the partition (the
        batch starts at ``offset``)."""
        ids = rb.column(0).to_pylist()
        payloads = self._payloads(rb)
        delays = rb.column(rb.num_columns - 1).to_pylist() if self.has_delay else [None] * len(ids)
        cfg, job_type = self.cfg, self.job_type
        tpl = prod.row_template(cfg, job_type, self.created_ms) if self.payload == "json" \
            else None
        parse_json = self.payload == "value"
        for at, (raw_id, payload, delay) in enumerate(zip(ids, payloads, delays, strict=True),
                                                      offset):
            if raw_id is None:
                reject("null_id")
                continue
            try:
                if tpl is not None:
                    if payload is None:  # to_json of a null struct, map or array
                        payload = "null"
                    yield at, prod.prepare_row_json(keys, cfg, tpl, job_type, str(raw_id),
                                                    payload, delay)
                    continue
                if parse_json and isinstance(payload, str):
                    try:
                        payload = json.loads(payload)
                    except ValueError:
                        reject("invalid_json")
                        continue
                yield at, prod.prepare_row(keys, cfg, job_type, payload, str(raw_id), delay,
                                           self.created_ms, str_keys_only=self.str_keys_only)
            except InvalidArgument as exc:
                reject(reason(exc))
