"""Spark (PySpark) integration: bulk enqueue from DataFrames, history and dead-letter export,
bulk re-drive. An optional extra: ``pip install 'streamq[spark]'``.

Every partition opens its own connection and uses the library's Lua scripts (dedup included),
so re-running a job, or Spark retrying a task, creates no duplicate jobs. Reads split a
stream into id ranges read in parallel; nothing scans the keyspace. All keys a partition
touches carry one queue's hash tag (``cluster=True`` uses a Redis Cluster client).
"""

from __future__ import annotations

import functools
import json
import logging
import os
import time
from collections.abc import Iterable, Iterator, Sequence
from pathlib import Path
from typing import Any

import attrs
from pyspark import AccumulatorParam
from pyspark.sql import Column, DataFrame, Observation, Row, SparkSession
from pyspark.sql import functions as F  # noqa: N812
from pyspark.sql import types as t

from .._core import shards as _shards
from .._core.config import QueueConfig
from .._core.driver import drive
from .._core.errors import InvalidArgument
from .._core.keys import Keys, shard_keys
from .._core.model import decode_record, normalize_record
from .._core.retry import call
from .._core.scripts import SCRIPTS
from .._producer import prepare as prod
from ._enqueue import COUNTS_SCHEMA, EnqueueTask, client_for
from ._read import ReadTask, plan

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


def _has_map(dt: t.DataType) -> bool:
    if isinstance(dt, t.MapType):
        return True
    if isinstance(dt, t.ArrayType):
        return _has_map(dt.elementType)
    if isinstance(dt, t.StructType):
        return any(_has_map(f.dataType) for f in dt.fields)
    return False


_AS_STRING = (t.TimestampType, t.TimestampNTZType, t.DateType, t.DecimalType)


def _as_json_value(col: Column, dt: t.DataType) -> Column:
    """Timestamps, dates and decimals have no JSON form: a top-level column of those types
    goes into the payload as Spark's string form (nested ones make the row rejected as
    'unserialisable_payload')."""
    return col.cast("string") if isinstance(dt, _AS_STRING) else col


def _client(url: str, cluster: bool) -> Any:
    return client_for(url, cluster)


def enqueue_dataframe(
    df: DataFrame, *, url: str, queue: str, job_type: str, id_col: str,
    payload_cols: Sequence[str] | None = None, payload_col: str | None = None,
    delay_col: str | None = None, batch_size: int = 1000, fail_on_reject: bool = False,
    queue_config: QueueConfig | None = None, cluster: bool = False,
) -> EnqueueCounts:
    """Enqueue one job per row: id from ``id_col``, payload from ``payload_cols`` (a dict of
    those columns) or ``payload_col`` (one column: struct, map, or a JSON string), optional
    delay in seconds from ``delay_col``. Rows reach Python as Arrow batches; each partition
    enqueues in pipelined batches of ``batch_size``. Returns the counts of the tasks that
    succeeded."""
    if (payload_cols is None) == (payload_col is None):
        raise InvalidArgument("give payload_cols or payload_col, not both")
    if not 1 <= batch_size <= prod.MAX_BATCH:
        raise InvalidArgument(f"batch_size must be 1..{prod.MAX_BATCH}")
    cols = list(payload_cols) if payload_cols is not None else [str(payload_col)]
    if payload_cols is not None and not cols:
        raise InvalidArgument("payload_cols must name at least one column")
    missing = [c for c in (id_col, *cols, *([delay_col] if delay_col else []))
               if c not in df.columns]
    if missing:
        raise InvalidArgument(f"no such column(s) {missing}; the DataFrame has {df.columns}")
    prod.check_type(job_type)
    cfg = queue_config or QueueConfig()
    keys = Keys(queue, cfg.key_prefix)  # validates the queue name on the driver
    client = _client(url, cluster)  # the stored shard count, checked once on the driver
    try:
        call(lambda _retried: drive(client, _shards.check(keys, cfg.shards)))
    finally:
        client.close()
    types = [df.schema[c].dataType for c in cols]
    delay = [df[delay_col]] if delay_col else []
    nested = (t.StructType, t.MapType, t.ArrayType)
    if prod.row_template(cfg, job_type, 0) is not None and (
            payload_cols is not None or isinstance(types[0], nested)):
        # the payload's JSON is made in the JVM (to_json), next to the data; Python only
        # wraps it in the envelope
        mode = "json"
        value = (F.struct(*(df[c] for c in cols)) if payload_cols is not None
                 else df[cols[0]])
        values = [F.to_json(value, {"ignoreNullFields": "false"})]
    else:
        mode = "cols" if payload_cols is not None else "value"
        values = [_as_json_value(df[c], dt) for c, dt in zip(cols, types, strict=True)]
    task = EnqueueTask(url, cluster, queue, cfg, job_type, mode, tuple(cols),
                       delay_col is not None, batch_size, int(time.time() * 1000),
                       not any(_has_map(dt) for dt in types), os.urandom(4).hex())
    picked = df.select(df[id_col], *values, *delay)
    total: dict[str, int] = {}
    for row in picked.mapInArrow(task, COUNTS_SCHEMA).collect():
        total[row["outcome"]] = total.get(row["outcome"], 0) + row["n"]
    rejected = {k.split(":", 1)[1]: v for k, v in total.items() if k.startswith("rejected:")}
    result = EnqueueCounts(total.get("enqueued", 0), total.get("duplicates", 0), rejected)
    if fail_on_reject and result.total_rejected:
        raise InvalidArgument(f"{result.total_rejected} rows could not become jobs: {rejected}")
    return result


# ------------------------------------------------------------------ reading streams


def _bounds(url: str, stream: str, cluster: bool, after: str | None, upto: str | None
            ) -> tuple[str, str] | None:
    """The first entry after ``after`` and the last entry (or ``upto``): what a read
    covers."""
    client = _client(url, cluster)
    try:
        first = client.xrange(stream, f"({after}" if after else "-", upto or "+", count=1)
        last = upto or [e[0].decode() for e in client.xrevrange(stream, "+", "-", count=1)]
    finally:
        client.close()
    if not first or not last:
        return None
    return first[0][0].decode(), last if isinstance(last, str) else last[0]


def _stream_df(spark: SparkSession, url: str, stream: str, kind: str, schema: t.StructType,
               partitions: int, cluster: bool, after: str | None, upto: str | None = None
               ) -> tuple[DataFrame, str | None]:
    """The stream read in parallel id ranges, and the id of the last entry it covers."""
    bounds = _bounds(url, stream, cluster, after, upto)
    if bounds is None:
        return spark.createDataFrame([], schema), None
    ranges = plan(*bounds, partitions)
    task = ReadTask(url, cluster, stream, kind, tuple(ranges), after)
    df = spark.range(0, len(ranges), 1, len(ranges)).mapInArrow(task, schema)
    return df, bounds[1]


def _ts(ms: int) -> Any:
    import datetime as dt

    return dt.datetime.fromtimestamp(ms / 1000, tz=dt.UTC)


def _s(v: bytes | None) -> str:
    return v.decode(errors="replace") if v else ""


def _stored_layout(url: str, cluster: bool, keys: Keys) -> _shards.Layout:
    """The layout stored with the queue (1 shard when none is: the unsharded layout)."""
    client = _client(url, cluster)
    try:
        got = call(lambda _retried: drive(client, _shards.read(keys)))
    finally:
        client.close()
    return got or _shards.Layout(1)


def _parts(url: str, cluster: bool, queue: str, key_prefix: str,
           shard: int | None) -> list[Keys]:
    """The keys of every shard of the queue (its stored count), or of the one asked for."""
    keys = Keys(queue, key_prefix)  # validates the queue name on the driver
    # every shard that may hold work: also the old ones of a reshard down, until deleted
    n = _stored_layout(url, cluster, keys).read
    if shard is None:
        return shard_keys(queue, n, key_prefix)
    if isinstance(shard, bool) or not isinstance(shard, int) or not 0 <= shard < n:
        raise InvalidArgument(f"shard must be 0..{n - 1} for queue {queue!r} (shards={n}),"
                              f" got {shard!r}")
    return [keys.of_shard(shard)]


def _union(spark: SparkSession, dfs: list[DataFrame], schema: t.StructType) -> DataFrame:
    return functools.reduce(DataFrame.unionAll, dfs) if dfs else spark.createDataFrame([], schema)


def read_events(spark: SparkSession, *, url: str, queue: str, partitions: int = 8,
                after: str | None = None, key_prefix: str = "streamq",
                cluster: bool = False, shard: int | None = None) -> DataFrame:
    """The queue's lifecycle events (``EVENTS_SCHEMA``), read in parallel id ranges, from
    every shard of a sharded queue (``shard``: only that one); ``after``: only events with a
    larger id (incremental export of an unsharded queue or of one shard: ids are per shard)."""
    parts = _parts(url, cluster, queue, key_prefix, shard)
    if after is not None and len(parts) > 1:
        raise InvalidArgument("after= is an event id of one shard: give shard= with it, or"
                              " use export_events, which keeps one checkpoint per shard")
    return _union(spark, [_stream_df(spark, url, k.events, "events", EVENTS_SCHEMA, partitions,
                                     cluster, after)[0] for k in parts], EVENTS_SCHEMA)


def read_dead(spark: SparkSession, *, url: str, queue: str, partitions: int = 8,
              key_prefix: str = "streamq", cluster: bool = False,
              shard: int | None = None) -> DataFrame:
    """The dead-letter index (``DEAD_SCHEMA``) of every shard (``shard``: only that one);
    filter it and pass it to redrive_dataframe."""
    parts = _parts(url, cluster, queue, key_prefix, shard)
    return _union(spark, [_stream_df(spark, url, k.dead, "dead", DEAD_SCHEMA, partitions,
                                     cluster, None)[0] for k in parts], DEAD_SCHEMA)


def read_jobs(spark: SparkSession, *, url: str, queue: str, partitions: int = 8,
              key_prefix: str = "streamq", cluster: bool = False,
              queue_config: QueueConfig | None = None) -> DataFrame:
    """Live job records (``JOBS_SCHEMA``): those indexed by the ready stream, the delayed set
    or the dead letters. Completed and cancelled records are not indexed (they expire by
    TTL): export them through the events instead."""
    cfg = queue_config or QueueConfig(key_prefix=key_prefix)
    parts = _parts(url, cluster, queue, key_prefix, None)
    client = _client(url, cluster)
    try:
        ids: list[tuple[int, str]] = []  # (shard, job id): a record lives in its shard
        for k in parts:
            for stream in (k.stream, k.dead):
                start = "-"
                while True:
                    page = client.xrange(stream, start, "+", count=PAGE)
                    ids += [(k.shard, _s(f.get(b"id") or f.get(b"job"))) for _e, f in page]
                    if len(page) < PAGE:
                        break
                    start = f"({page[-1][0].decode()}"
            offset = 0
            while True:
                members = client.zrange(k.delayed, offset, offset + PAGE - 1)
                ids += [(k.shard, _s(m)) for m in members]
                if len(members) < PAGE:
                    break
                offset += PAGE
    finally:
        client.close()
    ids = sorted({(sh, i) for sh, i in ids if i})
    if not ids:
        return spark.createDataFrame([], JOBS_SCHEMA)

    def read(chunk: Iterable[tuple[int, str]]) -> Iterator[tuple[Any, ...]]:
        c = _client(url, cluster)
        try:
            batch = list(chunk)
            for i in range(0, len(batch), PAGE):
                part = batch[i:i + PAGE]
                pipe = c.pipeline(transaction=False)
                for sh, jid in part:
                    pipe.hgetall(Keys(queue, key_prefix, sh).job(jid))
                for (_sh, jid), h in zip(part, pipe.execute(), strict=True):
                    if not h:
                        continue
                    info = decode_record(queue, jid, h, cfg.serde)
                    n = normalize_record(h)
                    r: list[Any] = [info.type.encode(), info.state.encode(), info.attempts,
                                    n.get(b"c"), n.get(b"f"), n.get(b"reason"), n.get(b"error")]
                    etype = ""
                    if r[6]:
                        try:
                            etype = str(cfg.serde.loads(r[6]).get("type", ""))
                        except Exception:  # noqa: BLE001 - a corrupt error blob is just unknown
                            etype = ""
                    payload = ""
                    if info.envelope is not None:
                        try:
                            payload = json.dumps(info.payload, default=str)
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

    lay = _stored_layout(url, cluster, Keys(queue, key_prefix))

    def partition(rows: Iterable[Row]) -> None:
        # a dead entry lives in its job's shard: its home, or after a reshard the home under
        # an earlier count (Layout.homes, tried in turn: an entry not found answers 'gone');
        # one without a job id (a malformed stream entry) is looked for in shard 0 and
        # answers 'gone' when it is in another
        parts = shard_keys(queue, max(lay.read, *lay.prev, 1), key_prefix)
        client = _client(url, cluster)
        local: dict[str, int] = {}

        def homes(jid: str) -> tuple[int, ...]:
            return lay.homes(jid) if jid else (0,)

        try:
            todo = [(row["dead_id"], row["job_id"] or "") for row in rows]
            depth = 0
            while todo:
                batches: dict[int, list[tuple[str, str]]] = {}
                for dead_id, jid in todo:
                    batches.setdefault(homes(jid)[depth], []).append((dead_id, jid))
                todo = []
                for sh, batch in batches.items():
                    for i in range(0, len(batch), PAGE):
                        part = batch[i:i + PAGE]
                        for (dead_id, jid), res in zip(part, _redrive(
                                client, parts[sh], cfg, part), strict=True):
                            if res == "gone" and len(homes(jid)) > depth + 1:
                                todo.append((dead_id, jid))  # in an earlier home?
                            else:
                                local[res] = local.get(res, 0) + 1
                depth += 1
        finally:
            client.close()
        counts.add(local)

    df.select("dead_id", "job_id").foreachPartition(partition)
    return dict(counts.value)


def _redrive(client: Any, k: Keys, cfg: QueueConfig, batch: list[tuple[str, str]]
             ) -> list[str]:
    """Each entry's outcome, in order."""
    if not batch:
        return []
    args: list[Any] = [cfg.events_arg, "spark", cfg.group_arg]
    for dead_id, jid in batch:
        args += [dead_id, jid or ""]
    res = SCRIPTS["redrive"](client, [k.stream, k.dead, k.stats, k.events,
                                      *(k.job(j or "-") for _d, j in batch), *k.group_keys,
                                      k.levels, *k.level_streams], args)
    return [x.decode() for x in res]


# ------------------------------------------------------------------ incremental export


def export_events(spark: SparkSession, *, url: str, queue: str, to: str, partitions: int = 8,
                  key_prefix: str = "streamq", cluster: bool = False) -> dict[str, Any]:
    """Append the events not exported yet to Parquet under ``to/events``, from every shard of
    a sharded queue; the last exported event id of each shard is kept in
    ``to/_checkpoint.json``. Warns when events were trimmed (by ``QueueConfig.events_maxlen``)
    before they could be exported."""
    out = Path(to)
    out.mkdir(parents=True, exist_ok=True)
    ckpt = out / "_checkpoint.json"
    done = json.loads(ckpt.read_text()) if ckpt.exists() else {}
    # one checkpoint per shard ("shards": {"<i>": ...}); the unsharded form (the only one of
    # earlier releases) is shard 0's
    marks: dict[str, dict[str, Any]] = done.get("shards") or {"0": done}
    parts = _parts(url, cluster, queue, key_prefix, None)
    dfs: list[DataFrame] = []
    plans: dict[str, dict[str, Any]] = {}
    gap = False
    for k in parts:
        mark = marks.get(str(k.shard), {})
        after: str | None = mark.get("last_event_id")
        client = _client(url, cluster)
        try:
            info: dict[str, Any] = (client.xinfo_stream(k.events) if client.exists(k.events)
                                    else {})
        finally:
            client.close()
        added, length = int(info.get("entries-added", 0)), int(info.get("length", 0))
        last_entry = info.get("last-entry")
        upto = last_entry[0].decode() if last_entry else None
        # events are trimmed from the front (MAXLEN), never deleted one by one, so the
        # first ``added - length`` events ever added are gone; ``added`` at the checkpoint
        # counts the events up to it: more gone than that means some were never exported
        if added - length > int(mark.get("events_added", 0)):
            gap = True
            log.warning("events of %s (shard %d) were trimmed before export (after %s); raise"
                        " QueueConfig.events_maxlen or export more often", queue, k.shard,
                        after or "start")
        df, last = _stream_df(spark, url, k.events, "events", EVENTS_SCHEMA, partitions,
                              cluster, after, upto)
        if last is not None:
            dfs.append(df)
            plans[str(k.shard)] = {"last_event_id": last, "events_added": added}
        else:
            plans[str(k.shard)] = {"last_event_id": after,
                                   "events_added": int(mark.get("events_added", 0))}
    n = 0
    if dfs:  # one pass: read, count (exact: observed in the write's own tasks)
        seen = Observation("export")
        _union(spark, dfs, EVENTS_SCHEMA).observe(seen, F.count(F.lit(1)).alias("n")).write.mode(
            "append").parquet(str(out / "events"))
        n = int(seen.get["n"])
        if len(parts) == 1:
            ckpt.write_text(json.dumps({**plans["0"], "queue": queue}))
        else:
            ckpt.write_text(json.dumps({"queue": queue, "shards": plans}))
    lasts = {int(i): p["last_event_id"] for i, p in plans.items()}
    return {"exported": n, "last_event_id": lasts.get(0), "last_event_ids": lasts, "gap": gap}


__all__ = ["DEAD_SCHEMA", "EVENTS_SCHEMA", "JOBS_SCHEMA", "EnqueueCounts", "enqueue_dataframe",
           "export_events", "read_dead", "read_events", "read_jobs", "redrive_dataframe"]
