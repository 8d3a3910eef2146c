"""Spark (PySpark) integration: bulk enqueue from DataFrames, history and dead-letter export,
bulk re-drive. An optional extra: ``pip install 'streamq[spark]'``.

Every partition opens its own connection and uses the library's Lua scripts (dedup included),
so re-running a job, or Spark retrying a task, creates no duplicate jobs. Reads split a
stream into id ranges read in parallel; nothing scans the keyspace. All keys a partition
touches carry one queue's hash tag (``cluster=True`` uses a Redis Cluster client).
"""

from __future__ import annotations

import json
import logging
import math
from collections.abc import Iterable, Iterator, Sequence
from pathlib import Path
from typing import Any

import attrs
from pyspark import AccumulatorParam
from pyspark.sql import DataFrame, Row, SparkSession
from pyspark.sql import types as t

from . import _producer as prod
from ._config import QueueConfig
from ._conn import sync_client
from ._errors import InvalidArgument, InvalidJobId, PayloadTooLarge, SerializationError
from ._keys import Keys
from ._scripts import SCRIPTS

log = logging.getLogger("streamq.spark")
PAGE = 1000

EVENTS_SCHEMA = t.StructType([
    t.StructField("event_id", t.StringType(), False),
    t.StructField("ts", t.TimestampType(), False),
    t.StructField("job_id", t.StringType(), False),
    t.StructField("event", t.StringType(), False),
    t.StructField("detail", t.StringType(), True),
])
DEAD_SCHEMA = t.StructType([
    t.StructField("dead_id", t.StringType(), False),
    t.StructField("ts", t.TimestampType(), False),
    t.StructField("job_id", t.StringType(), False),
    t.StructField("type", t.StringType(), True),
    t.StructField("reason", t.StringType(), True),
    t.StructField("error_type", t.StringType(), True),
])
JOBS_SCHEMA = t.StructType([
    t.StructField("job_id", t.StringType(), False),
    t.StructField("type", t.StringType(), True),
    t.StructField("state", t.StringType(), True),
    t.StructField("attempts", t.IntegerType(), True),
    t.StructField("created", t.TimestampType(), True),
    t.StructField("finished", t.TimestampType(), True),
    t.StructField("reason", t.StringType(), True),
    t.StructField("error_type", t.StringType(), True),
    t.StructField("payload_json", t.StringType(), True),
])


class _DictSum(AccumulatorParam):  # type: ignore[type-arg]
    def zero(self, value: dict[str, int]) -> dict[str, int]:
        return {}

    def addInPlace(self, a: dict[str, int], b: dict[str, int]) -> dict[str, int]:  # noqa: N802
        for k, v in b.items():
            a[k] = a.get(k, 0) + v
        return a


@attrs.frozen
class EnqueueCounts:
    enqueued: int
    duplicates: int
    rejected: dict[str, int]
    """Rows that could not become jobs, by reason (never silently dropped)."""

    @property
    def total_rejected(self) -> int:
        return sum(self.rejected.values())


def _client(url: str, cluster: bool) -> Any:
    if cluster:
        from redis.cluster import RedisCluster

        return RedisCluster.from_url(url, protocol=2)
    return sync_client(url, socket_timeout_s=60.0)


def _reason(exc: Exception) -> str:
    if isinstance(exc, InvalidJobId):
        return "invalid_id"
    if isinstance(exc, PayloadTooLarge):
        return "payload_too_large"
    if isinstance(exc, SerializationError):
        return "unserialisable_payload"
    text = str(exc)
    if "delay" in text:
        return "invalid_delay"
    return "invalid_row"


def enqueue_dataframe(
    df: DataFrame, *, url: str, queue: str, job_type: str, id_col: str,
    payload_cols: Sequence[str] | None = None, payload_col: str | None = None,
    delay_col: str | None = None, batch_size: int = 1000, fail_on_reject: bool = False,
    queue_config: QueueConfig | None = None, cluster: bool = False,
) -> EnqueueCounts:
    """Enqueue one job per row: id from ``id_col``, payload from ``payload_cols`` (a dict of
    those columns) or ``payload_col`` (one column: struct, map, or a JSON string), optional
    delay in seconds from ``delay_col``. Returns counts gathered with accumulators."""
    if (payload_cols is None) == (payload_col is None):
        raise InvalidArgument("give payload_cols or payload_col, not both")
    if not 1 <= batch_size <= prod.MAX_BATCH:
        raise InvalidArgument(f"batch_size must be 1..{prod.MAX_BATCH}")
    cfg = queue_config or QueueConfig()
    Keys(queue, cfg.key_prefix)  # validates the queue name on the driver
    sc = df.sparkSession.sparkContext
    counts = sc.accumulator({}, _DictSum())
    cols = list(payload_cols) if payload_cols is not None else None

    def partition(rows: Iterable[Row]) -> None:
        keys = Keys(queue, cfg.key_prefix)
        client = _client(url, cluster)
        local: dict[str, int] = {}
        batch: list[prod.Prepared] = []

        def flush() -> None:
            if not batch:
                return
            k, a = prod.enqueue_call(keys, cfg, batch)
            reply = SCRIPTS["enqueue"](client, k, a)
            for r in prod.parse_enqueue(cfg, batch, reply, retried=True):
                status = {"queued": "enqueued", "scheduled": "enqueued",
                          "rejected": "rejected:queue_full"}.get(r.status, r.status + "s")
                local[status] = local.get(status, 0) + 1
            batch.clear()

        try:
            for row in rows:
                raw_id = row[id_col]
                if raw_id is None:
                    local["rejected:null_id"] = local.get("rejected:null_id", 0) + 1
                    continue
                if cols is not None:
                    payload = {c: row[c] for c in cols}
                else:
                    value = row[payload_col]
                    payload = value.asDict(recursive=True) if isinstance(value, Row) else value
                    if isinstance(payload, str):
                        try:
                            payload = json.loads(payload)
                        except ValueError:
                            local["rejected:invalid_json"] = local.get("rejected:invalid_json",
                                                                       0) + 1
                            continue
                options: dict[str, Any] = {"job_id": str(raw_id)}
                if delay_col is not None and row[delay_col] is not None:
                    options["delay"] = row[delay_col]
                try:
                    batch.append(prod.prepare(keys, cfg, job_type, payload, **options))
                except InvalidArgument as exc:
                    key = "rejected:" + _reason(exc)
                    local[key] = local.get(key, 0) + 1
                    continue
                if len(batch) >= batch_size:
                    flush()
            flush()
        finally:
            client.close()
        counts.add(local)

    df.foreachPartition(partition)
    total: dict[str, int] = counts.value
    rejected = {k.split(":", 1)[1]: v for k, v in total.items() if k.startswith("rejected:")}
    result = EnqueueCounts(total.get("enqueued", 0), total.get("duplicates", 0), rejected)
    if fail_on_reject and result.total_rejected:
        raise InvalidArgument(f"{result.total_rejected} rows could not become jobs: {rejected}")
    return result


# ------------------------------------------------------------------ reading streams


def _id_ms(entry_id: bytes | str) -> int:
    s = entry_id.decode() if isinstance(entry_id, bytes) else entry_id
    return int(s.split("-", 1)[0])


def _ranges(first_ms: int, last_ms: int, parts: int) -> list[tuple[str, str]]:
    """Split [first_ms, last_ms] into id ranges that cover every entry exactly once."""
    step = max(1, math.ceil((last_ms - first_ms + 1) / parts))
    out = []
    lo = first_ms
    while lo <= last_ms:
        hi = min(last_ms, lo + step - 1)
        out.append((f"{lo}-0", f"{hi}-18446744073709551615"))
        lo = hi + 1
    return out


def _bounds(url: str, stream: str, cluster: bool, after: str | None) -> tuple[int, int] | None:
    client = _client(url, cluster)
    try:
        first = client.xrange(stream, f"({after}" if after else "-", "+", count=1)
        last = client.xrevrange(stream, "+", "-", count=1)
    finally:
        client.close()
    if not first or not last:
        return None
    return _id_ms(first[0][0]), _id_ms(last[0][0])


def _id_key(entry_id: str) -> tuple[int, int]:
    ms, _, seq = entry_id.partition("-")
    return int(ms), int(seq or 0)


def _read_range(url: str, stream: str, lo: str, hi: str, cluster: bool, after: str | None
                ) -> Iterator[tuple[bytes, dict[bytes, bytes]]]:
    client = _client(url, cluster)
    try:
        start = lo
        if after and _id_key(lo) <= _id_key(after) < _id_key(hi):
            start = f"({after}"  # the range holds the checkpoint: read strictly after it
        while True:
            page = client.xrange(stream, start, hi, count=PAGE)
            yield from page
            if len(page) < PAGE:
                return
            start = f"({page[-1][0].decode()}"
    finally:
        client.close()


def _stream_df(spark: SparkSession, url: str, stream: str, schema: t.StructType,
               convert: Any, partitions: int, cluster: bool, after: str | None) -> DataFrame:
    bounds = _bounds(url, stream, cluster, after)
    if bounds is None:
        return spark.createDataFrame([], schema)
    ranges = _ranges(*bounds, partitions)

    def read(rng: tuple[str, str]) -> Iterator[tuple[Any, ...]]:
        for eid, fields in _read_range(url, stream, rng[0], rng[1], cluster, after):
            yield convert(eid, fields)

    rdd = spark.sparkContext.parallelize(ranges, len(ranges)).flatMap(read)
    return spark.createDataFrame(rdd, schema)


def _ts(ms: int) -> Any:
    import datetime as dt

    return dt.datetime.fromtimestamp(ms / 1000, tz=dt.UTC)


def _s(v: bytes | None) -> str:
    return v.decode(errors="replace") if v else ""


def _event_row(eid: bytes, f: dict[bytes, bytes]) -> tuple[Any, ...]:
    return (eid.decode(), _ts(_id_ms(eid)), _s(f.get(b"job")), _s(f.get(b"ev")),
            _s(f.get(b"d")))


def _dead_row(eid: bytes, f: dict[bytes, bytes]) -> tuple[Any, ...]:
    return (eid.decode(), _ts(_id_ms(eid)), _s(f.get(b"job")), _s(f.get(b"type")),
            _s(f.get(b"reason")), _s(f.get(b"etype")))


def read_events(spark: SparkSession, *, url: str, queue: str, partitions: int = 8,
                after: str | None = None, key_prefix: str = "streamq",
                cluster: bool = False) -> DataFrame:
    """The queue's lifecycle events (``EVENTS_SCHEMA``), read in parallel id ranges;
    ``after``: only events with a larger id (incremental export)."""
    k = Keys(queue, key_prefix)
    return _stream_df(spark, url, k.events, EVENTS_SCHEMA, _event_row, partitions, cluster,
                      after)


def read_dead(spark: SparkSession, *, url: str, queue: str, partitions: int = 8,
              key_prefix: str = "streamq", cluster: bool = False) -> DataFrame:
    """The dead-letter index (``DEAD_SCHEMA``); filter it and pass it to redrive_dataframe."""
    k = Keys(queue, key_prefix)
    return _stream_df(spark, url, k.dead, DEAD_SCHEMA, _dead_row, partitions, cluster, None)


def read_jobs(spark: SparkSession, *, url: str, queue: str, partitions: int = 8,
              key_prefix: str = "streamq", cluster: bool = False,
              queue_config: QueueConfig | None = None) -> DataFrame:
    """Live job records (``JOBS_SCHEMA``): those indexed by the ready stream, the delayed set
    or the dead letters. Completed and cancelled records are not indexed (they expire by
    TTL): export them through the events instead."""
    cfg = queue_config or QueueConfig(key_prefix=key_prefix)
    k = Keys(queue, key_prefix)
    client = _client(url, cluster)
    try:
        ids: list[str] = []
        for stream in (k.stream, k.dead):
            start = "-"
            while True:
                page = client.xrange(stream, start, "+", count=PAGE)
                ids += [_s(f.get(b"id") or f.get(b"job")) for _e, f in page]
                if len(page) < PAGE:
                    break
                start = f"({page[-1][0].decode()}"
        offset = 0
        while True:
            members = client.zrange(k.delayed, offset, offset + PAGE - 1)
            ids += [_s(m) for m in members]
            if len(members) < PAGE:
                break
            offset += PAGE
    finally:
        client.close()
    ids = sorted({i for i in ids if i})
    if not ids:
        return spark.createDataFrame([], JOBS_SCHEMA)

    def read(chunk: Iterable[str]) -> Iterator[tuple[Any, ...]]:
        c = _client(url, cluster)
        try:
            batch = list(chunk)
            for i in range(0, len(batch), PAGE):
                part = batch[i:i + PAGE]
                pipe = c.pipeline(transaction=False)
                for jid in part:
                    pipe.hmget(k.job(jid), "type", "state", "attempts", "created", "finished",
                               "reason", "error", "env")
                for jid, r in zip(part, pipe.execute(), strict=True):
                    if r[1] is None:
                        continue
                    etype = ""
                    if r[6]:
                        try:
                            etype = str(cfg.serde.loads(r[6]).get("type", ""))
                        except Exception:  # noqa: BLE001 - a corrupt error blob is just unknown
                            etype = ""
                    payload = ""
                    if r[7]:
                        try:
                            payload = json.dumps(cfg.serde.loads(r[7]).get("p"), default=str)
                        except Exception:  # noqa: BLE001
                            payload = ""
                    yield (jid, _s(r[0]), _s(r[1]), int(r[2] or 0),
                           _ts(int(r[3])) if r[3] else None, _ts(int(r[4])) if r[4] else None,
                           _s(r[5]), etype, payload)
        finally:
            c.close()

    n = max(1, min(partitions, len(ids) // PAGE + 1))
    rdd = spark.sparkContext.parallelize(ids, n).mapPartitions(read)
    return spark.createDataFrame(rdd, JOBS_SCHEMA)


# ------------------------------------------------------------------ bulk re-drive


def redrive_dataframe(df: DataFrame, *, url: str, queue: str, key_prefix: str = "streamq",
                      cluster: bool = False, queue_config: QueueConfig | None = None
                      ) -> dict[str, int]:
    """Re-drive exactly the dead entries in ``df`` (columns ``dead_id`` and ``job_id``, as
    read_dead gives them). Safe to re-run: an entry already re-driven answers 'gone'."""
    cfg = queue_config or QueueConfig(key_prefix=key_prefix)
    sc = df.sparkSession.sparkContext
    counts = sc.accumulator({}, _DictSum())

    def partition(rows: Iterable[Row]) -> None:
        k = Keys(queue, key_prefix)
        client = _client(url, cluster)
        local: dict[str, int] = {}
        try:
            batch: list[tuple[str, str]] = []
            for row in rows:
                batch.append((row["dead_id"], row["job_id"]))
                if len(batch) == PAGE:
                    _redrive(client, k, cfg, batch, local)
                    batch = []
            _redrive(client, k, cfg, batch, local)
        finally:
            client.close()
        counts.add(local)

    df.select("dead_id", "job_id").foreachPartition(partition)
    return dict(counts.value)


def _redrive(client: Any, k: Keys, cfg: QueueConfig, batch: list[tuple[str, str]],
             local: dict[str, int]) -> None:
    if not batch:
        return
    args: list[Any] = [cfg.events_maxlen, "spark"]
    for dead_id, jid in batch:
        args += [dead_id, jid or ""]
    res = SCRIPTS["redrive"](client, [k.stream, k.dead, k.stats, k.events,
                                      *(k.job(j or "-") for _d, j in batch)], args)
    for x in res:
        key = x.decode()
        local[key] = local.get(key, 0) + 1


# ------------------------------------------------------------------ incremental export


def export_events(spark: SparkSession, *, url: str, queue: str, to: str, partitions: int = 8,
                  key_prefix: str = "streamq") -> dict[str, Any]:
    """Append the events not exported yet to Parquet under ``to/events``; the last exported
    event id is kept in ``to/_checkpoint.json``. Warns when events were trimmed (by
    ``QueueConfig.events_maxlen``) before they could be exported."""
    out = Path(to)
    out.mkdir(parents=True, exist_ok=True)
    ckpt = out / "_checkpoint.json"
    after = json.loads(ckpt.read_text())["last_event_id"] if ckpt.exists() else None
    k = Keys(queue, key_prefix)
    client = _client(url, False)
    try:
        first = client.xrange(k.events, "-", "+", count=1)
        info: Any = client.execute_command("XINFO", "STREAM", k.events) if first else []
    finally:
        client.close()
    fields = dict(zip(info[::2], info[1::2], strict=False))
    added, length = int(fields.get(b"entries-added", 0)), int(fields.get(b"length", 0))
    if after:  # the oldest event left is newer than the checkpoint: some were trimmed
        gap = bool(first) and _id_key(first[0][0].decode()) > _id_key(after)
    else:  # events are never deleted one by one: more added than left means trimmed
        gap = added > length
    if gap:
        log.warning("events of %s were trimmed before export (after %s); raise"
                    " QueueConfig.events_maxlen or export more often", queue, after or "start")
    df = read_events(spark, url=url, queue=queue, partitions=partitions, after=after,
                     key_prefix=key_prefix).cache()
    n = df.count()
    last = after
    if n:
        df.write.mode("append").parquet(str(out / "events"))
        last = df.selectExpr(  # stream ids order as (ms, seq) numbers, not as strings
            "max(struct(cast(split(event_id, '-')[0] as long) as ms,"
            " cast(split(event_id, '-')[1] as long) as seq, event_id)) as m"
        ).collect()[0]["m"]["event_id"]
        ckpt.write_text(json.dumps({"last_event_id": last, "queue": queue}))
    df.unpersist()
    return {"exported": n, "last_event_id": last, "gap": gap}


__all__ = ["DEAD_SCHEMA", "EVENTS_SCHEMA", "JOBS_SCHEMA", "EnqueueCounts", "enqueue_dataframe",
           "export_events", "read_dead", "read_events", "read_jobs", "redrive_dataframe"]
