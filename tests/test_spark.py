"""The Spark pipeline on a real local Spark (local[2]) and a real redis-server: bulk enqueue
with duplicates and bad rows, workers drain it, Parquet export read back, filtered re-drive;
exact counts for repeated rows and for a task Spark retries."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any
from unittest.mock import ANY

import pytest

pytest.importorskip("pyspark", reason="the spark extra is not installed")  # CI installs it

from helpers import wait_until
from pyspark.sql import SparkSession

from streamq import ALL_EVENTS, Queue, QueueConfig
from streamq.admin import Admin
from streamq.spark import (
    enqueue_dataframe,
    export_events,
    read_dead,
    read_events,
    read_jobs,
    redrive_dataframe,
)

pytestmark = [pytest.mark.spark, pytest.mark.slow]
TESTS = Path(__file__).parent
N = 50_000


def rows() -> list[tuple[Any, ...]]:
    good = [(f"img-{i}", f"/uploads/{i}.jpg", i % 1000, None) for i in range(N)]
    dups = [(f"img-{i}", "dup", 1, None) for i in range(0, 5000, 10)]  # 500 duplicates
    nulls = [(None, "x", 1, None) for _ in range(100)]
    bad_ids = [(f"bad id {i}", "x", 1, None) for i in range(50)]
    huge = [(f"huge-{i}", "x" * 5000, 1, None) for i in range(20)]
    bad_delays = [(f"late-{i}", "x", 1, -5.0) for i in range(30)]
    return good + dups + nulls + bad_ids + huge + bad_delays


def test_bulk_enqueue_drain_export_and_redrive(spark: SparkSession, url: str, qname: str,
                                               tmp_path: Path) -> None:
    # keep all history, every kind of event the producer writes
    cfg = QueueConfig(max_payload_bytes=2000, events_maxlen=1_000_000, event_kinds=ALL_EVENTS)
    df = spark.createDataFrame(rows(), "id string, path string, size int, delay double"
                               ).repartition(4)
    counts = enqueue_dataframe(df, url=url, queue=qname, job_type="image.process", id_col="id",
                               payload_cols=["path", "size"], delay_col="delay",
                               queue_config=cfg)
    assert counts.enqueued == N and counts.duplicates == 500
    assert counts.rejected == {"null_id": 100, "invalid_id": 50, "payload_too_large": 20,
                               "invalid_delay": 30}
    again = enqueue_dataframe(df, url=url, queue=qname, job_type="image.process", id_col="id",
                              payload_cols=["path", "size"], delay_col="delay",
                              queue_config=cfg)
    assert again.enqueued == 0 and again.duplicates == N + 500  # re-running creates nothing

    workers = [subprocess.Popen([sys.executable, "-m", "streamq", "--log-level", "ERROR",
                                 "worker", "spark_jobs:registry", "--url", url, "--queue", qname,
                                 "--concurrency", "100", "--events-maxlen", "1000000"],
                                cwd=TESTS) for _ in range(2)]
    admin = Admin.from_url(url)
    dead_expected = sum(1 for i in range(N) if str(i).endswith("7"))
    try:
        wait_until(lambda: admin.stats(qname).counters.get("completed", 0)
                   + admin.stats(qname).counters.get("failed", 0) >= N, timeout_s=120,
                   what="the workers to drain the backlog")
    finally:
        for w in workers:
            w.send_signal(signal.SIGTERM)
        for w in workers:
            w.wait(30)
    stats = admin.stats(qname)
    assert stats.counters["completed"] == N - dead_expected and stats.dead == dead_expected

    out = tmp_path / "export"
    first = export_events(spark, url=url, queue=qname, to=str(out))
    assert first["gap"] is False
    events = spark.read.parquet(str(out / "events"))
    by_kind = {r["event"]: r["count"] for r in events.groupBy("event").count().collect()}
    # the workers run with the default event kinds: a completion is no event, a failure is
    assert by_kind["enqueued"] == N and "completed" not in by_kind
    assert by_kind["failed"] == dead_expected and first["exported"] == events.count()
    assert export_events(spark, url=url, queue=qname, to=str(out))["exported"] == 0

    dead = read_dead(spark, url=url, queue=qname)
    assert dead.count() == dead_expected
    chosen = dead.filter(dead.job_id.endswith("17")).localCheckpoint()  # a fixed selection
    n_chosen = chosen.count()
    assert redrive_dataframe(chosen, url=url, queue=qname) == {"redriven": n_chosen}
    assert redrive_dataframe(chosen, url=url, queue=qname) == {"gone": n_chosen}
    lazy = dead.filter(dead.job_id.endswith("17"))  # re-running the pipeline: nothing left
    assert redrive_dataframe(lazy, url=url, queue=qname) == {}
    assert admin.stats(qname).ready == n_chosen and admin.stats(qname).dead == (
        dead_expected - n_chosen)

    third = export_events(spark, url=url, queue=qname, to=str(out))
    assert third["exported"] == n_chosen  # only what is new: the re-drive events
    jobs = read_jobs(spark, url=url, queue=qname)
    states = {r["state"]: r["count"] for r in jobs.groupBy("state").count().collect()}
    assert states == {"queued": n_chosen, "failed": dead_expected - n_chosen}
    sample = jobs.filter(jobs.state == "failed").first()
    assert sample is not None and sample["error_type"] == "Fail"
    assert '"size"' in sample["payload_json"]


def test_export_warns_when_history_was_trimmed(spark: SparkSession, url: str, qname: str,
                                               tmp_path: Path) -> None:
    from streamq import Queue

    q = Queue.from_url(url, qname, QueueConfig(events_maxlen=10, event_kinds=ALL_EVENTS))
    q.enqueue_many([{"type": "t"} for _ in range(500)])
    result = export_events(spark, url=url, queue=qname, to=str(tmp_path / "x"))
    assert result["gap"] is True and 0 < result["exported"] < 500
    # trimming what was exported already is no gap; trimming what was not is one
    q.enqueue_many([{"type": "t"} for _ in range(5)])
    assert export_events(spark, url=url, queue=qname, to=str(tmp_path / "x")) == {
        "exported": 5, "gap": False, "last_event_id": ANY, "last_event_ids": {0: ANY}}
    q.enqueue_many([{"type": "t"} for _ in range(500)])
    later = export_events(spark, url=url, queue=qname, to=str(tmp_path / "x"))
    assert later["gap"] is True and 0 < later["exported"] < 500


def test_export_command_appends_incrementally(spark: SparkSession, url: str, qname: str,
                                              tmp_path: Path) -> None:
    import json

    from streamq import Queue

    q = Queue.from_url(url, qname, QueueConfig(event_kinds=ALL_EVENTS))
    q.enqueue_many([{"type": "t"} for _ in range(20)])
    cmd = [sys.executable, "-m", "streamq", "export", qname, "--to", str(tmp_path), "--url", url,
           "--json", "--master", "local[1]"]
    env = {**os.environ, "PYSPARK_PYTHON": sys.executable, "SPARK_LOCAL_IP": "127.0.0.1"}
    first = json.loads(subprocess.run(cmd, capture_output=True, text=True, env=env, check=True,
                                      timeout=180).stdout.strip().splitlines()[-1])
    q.enqueue_many([{"type": "t"} for _ in range(5)])
    second = json.loads(subprocess.run(cmd, capture_output=True, text=True, env=env, check=True,
                                       timeout=180).stdout.strip().splitlines()[-1])
    assert (first["exported"], second["exported"]) == (20, 5)
    assert spark.read.parquet(str(tmp_path / "events")).count() == 25


def test_enqueue_against_redis_cluster(spark: SparkSession, qname: str, tmp_path: Path) -> None:
    """Every key a partition touches carries the queue's hash tag: a Cluster client works."""
    import redis

    from streamq._core.server import RedisServer

    server = RedisServer(directory=str(tmp_path), extra=(
        "--cluster-enabled", "yes", "--cluster-config-file", "nodes.conf")).start()
    try:
        admin: Any = redis.Redis(port=server.port)
        admin.execute_command("CLUSTER", "ADDSLOTSRANGE", 0, 16383)
        wait_until(lambda: b"cluster_state:ok" in admin.execute_command("CLUSTER", "INFO"),
                   what="the one-node cluster")
        url = server.url
        df = spark.createDataFrame([(f"c-{i}", i) for i in range(2000)], "id string, n int")
        counts = enqueue_dataframe(df, url=url, queue=qname, job_type="t", id_col="id",
                                   payload_cols=["n"], cluster=True,
                                   queue_config=QueueConfig(event_kinds=ALL_EVENTS))
        assert counts.enqueued == 2000 and counts.rejected == {}
        assert admin.xlen(f"streamq:{{{qname}}}:stream") == 2000
        # reading and exporting go through the node that holds the queue's keys
        events = read_events(spark, url=url, queue=qname, cluster=True, partitions=3)
        assert events.filter(events.event == "enqueued").count() == 2000
        assert read_dead(spark, url=url, queue=qname, cluster=True).count() == 0
        out = export_events(spark, url=url, queue=qname, to=str(tmp_path / "x"), cluster=True)
        assert (out["exported"], out["gap"]) == (2000, False)
    finally:
        server.close()


def test_payload_forms_reach_the_handler_as_json(spark: SparkSession, url: str, qname: str
                                                 ) -> None:
    """payload_cols, a struct column, a map column and a JSON-text column all become the
    payload a handler reads back; timestamps become ISO text; a retry-safe re-run adds
    nothing; with a non-JSON serde the same rows go through the per-row path."""
    from streamq import MsgpackSerde, Queue

    df = spark.sql("""
        select 'r1' as id, 'a"é' as s, cast(null as int) as n,
               timestamp'2026-11-23 01:02:03' as ts, map('k', 1) as m,
               named_struct('x', 1, 'y', array(1, 2)) as st, '{"j": [1, null]}' as js
        union all
        select 'r2', 'b', 2, null, null, null, 'not json'
    """)
    q = Queue.from_url(url, qname)

    def payloads(prefix: str) -> dict[str, Any]:
        return {jid: info.payload for jid in ("r1", "r2")
                if (info := q.get(prefix + jid)) is not None}

    cols = enqueue_dataframe(df.selectExpr("'c-' || id as id", "s", "n", "ts"), url=url,
                             queue=qname, job_type="t", id_col="id", payload_cols=["s", "n", "ts"])
    assert cols.enqueued == 2
    assert payloads("c-") == {"r1": {"s": 'a"é', "n": None, "ts": "2026-11-23T01:02:03.000Z"},
                              "r2": {"s": "b", "n": 2, "ts": None}}
    for col, expect in (("st", {"r1": {"x": 1, "y": [1, 2]}, "r2": None}),
                        ("m", {"r1": {"k": 1}, "r2": None})):
        out = enqueue_dataframe(df.selectExpr(f"'{col}-' || id as id", col), url=url,
                                queue=qname, job_type="t", id_col="id", payload_col=col)
        assert out.enqueued == 2 and payloads(f"{col}-") == expect
    js = enqueue_dataframe(df.selectExpr("'js-' || id as id", "js"), url=url, queue=qname,
                           job_type="t", id_col="id", payload_col="js")
    assert (js.enqueued, js.rejected) == (1, {"invalid_json": 1})
    assert payloads("js-") == {"r1": {"j": [1, None]}}

    mq = f"{qname}-mp"
    cfg = QueueConfig(serde=MsgpackSerde())
    mp = enqueue_dataframe(df.select("id", "s", "n"), url=url, queue=mq, job_type="t",
                           id_col="id", payload_cols=["s", "n"], queue_config=cfg)
    assert mp.enqueued == 2
    info = Queue.from_url(url, mq, cfg).get("r1")
    assert info is not None and info.payload == {"s": 'a"é', "n": None}


def test_identical_repeated_rows_count_as_duplicates(spark: SparkSession, url: str,
                                                     qname: str) -> None:
    """The same record twice in a source: the second row is a duplicate, although its job
    would be byte for byte the one the first row made."""
    distinct = [(f"d-{i}", i) for i in range(20_000)]
    repeats = [(f"d-{i}", i) for i in range(0, 20_000, 200)]  # 100 rows seen before, as they were
    df = spark.createDataFrame(distinct + repeats, "id string, n int").repartition(4)
    counts = enqueue_dataframe(df, url=url, queue=qname, job_type="t", id_col="id",
                               payload_cols=["n"])  # the JSON fast path
    assert (counts.enqueued, counts.duplicates, counts.rejected) == (20_000, 100, {})
    # the per-row path (payload_col of a plain column), repeats next to their first row, in
    # the same partition and often the same script call
    rows = [r for i in range(2000) for r in ([(f"v-{i}", i)] * (2 if i % 20 == 0 else 1))]
    df = spark.createDataFrame(rows, "id string, n int")
    counts = enqueue_dataframe(df, url=url, queue=qname, job_type="t", id_col="id",
                               payload_col="n", batch_size=50)
    assert (counts.enqueued, counts.duplicates, counts.rejected) == (2000, 100, {})


def test_differing_repeated_rows_count_as_duplicates(spark: SparkSession, url: str,
                                                     qname: str) -> None:
    """Rows that share an id but differ, in the payload or only in the delay (which is not
    part of the job's envelope), are duplicates whichever of them comes first."""
    rows: list[tuple[Any, ...]] = [(f"d-{i}", i, None) for i in range(4000)]
    rows += [(f"d-{i}", -1, None) for i in range(0, 4000, 40)]  # 100: another payload
    rows += [(f"d-{i}", i, 60.0) for i in range(1, 4000, 40)]  # 100: the same one, delayed
    df = spark.createDataFrame(rows, "id string, n int, delay double").repartition(4)
    counts = enqueue_dataframe(df, url=url, queue=qname, job_type="t", id_col="id",
                               payload_cols=["n"], delay_col="delay")
    assert (counts.enqueued, counts.duplicates, counts.rejected) == (4000, 200, {})


def test_a_retried_task_counts_its_rows_once(spark: SparkSession, url: str, qname: str,
                                             tmp_path: Path) -> None:
    """The first attempt of partition 0 fails after its first 1,000 rows were enqueued; the
    retry sees the same rows again. The rows the failed attempt wrote count as enqueued, once
    (by the attempt that succeeded); repeats, inside and across partitions, as duplicates."""
    marker = tmp_path / "failed-once"
    job_key = f"streamq:{{{qname}}}:job:"
    pad = "x" * 400  # big rows: the Python workers' streams are flushed in 64 KiB blocks

    def part(k: int) -> list[tuple[str, int, str]]:
        own = [(f"p{k}-{i}", i, pad) for i in range(2000)]
        again = [(f"p{k}-{i}", i, pad) for i in range(0, 400, 16)]  # 25, within the first 1,000
        other = [(f"p{(k + 1) % 4}-{i}", i, pad) for i in range(1, 1000, 40)]  # 25
        return own[:400] + again + own[400:] + other

    rows = [r for k in range(4) for r in part(k)]  # 4 x 2,050 rows, one partition each

    def fail_once(batches: Iterable[Any]) -> Iterator[Any]:
        """Partition 0, first attempt: pass 2,000 rows on, wait until the first 1,000 are
        jobs, then fail."""
        import time as _time

        import redis as _redis
        from pyspark import TaskContext

        ctx = TaskContext.get()
        first = ctx is not None and ctx.partitionId() == 0 and ctx.attemptNumber() == 0
        ids: list[str] = []
        for i, rb in enumerate(batches):  # 500 rows each
            yield rb
            if not first:
                continue
            ids += rb.column(0).to_pylist()
            if i == 3:
                want = set(ids[:1000])
                client = _redis.Redis.from_url(url)
                end, n = _time.monotonic() + 60, 0
                while _time.monotonic() < end and n < len(want):
                    n = client.exists(*(job_key + s for s in want))
                    _time.sleep(0.05)
                client.close()
                marker.write_text(f"{n} of {len(want)}")
                raise RuntimeError("the first attempt of partition 0 fails")

    spark.conf.set("spark.sql.execution.arrow.maxRecordsPerBatch", "500")
    try:
        df = spark.sparkContext.parallelize(rows, 4).toDF("id string, n int, pad string")
        df = df.mapInArrow(fail_once, df.schema)
        counts = enqueue_dataframe(df, url=url, queue=qname, job_type="t", id_col="id",
                                   payload_cols=["n", "pad"], batch_size=100)
    finally:
        spark.conf.unset("spark.sql.execution.arrow.maxRecordsPerBatch")
    assert marker.read_text() == "975 of 975"  # the failed attempt had enqueued them
    assert (counts.enqueued, counts.duplicates, counts.rejected) == (8000, 200, {})


def test_writer_tags_tell_a_retried_row_from_a_repeat(r: Any, qname: str) -> None:
    """enqueue.lua's writer-tag rules call by call, including orders a local Spark rarely
    produces: a retry that reads its rows in another order (rows after a shuffle), a
    repeated call after a lost reply, a speculative copy running alongside."""
    from streamq._core.keys import Keys
    from streamq._core.scripts import SCRIPTS
    from streamq._producer import prepare as prod

    keys, cfg = Keys(qname), QueueConfig()

    def send(*rows: tuple[str, str]) -> list[str]:
        """(job id, writer tag) rows in one call -> 'ok' (created, or this very row's) or
        'dup' for each."""
        batch = [prod.prepare_row(keys, cfg, "t", {"n": 1}, jid, None, 1) for jid, _ in rows]
        reply = SCRIPTS["enqueue"](r, *prod.enqueue_call(keys, cfg, batch,
                                                         [tag for _, tag in rows]))
        return ["dup" if x.status == "duplicate" else "ok"
                for x in prod.parse_enqueue(cfg, batch, reply, retried=True)]

    # run R, partition 0, task attempt 7: a, b, a again
    assert send(("a", "R:0:7:0"), ("b", "R:0:7:1"), ("a", "R:0:7:2")) == ["ok", "ok", "dup"]
    assert send(("a", "R:0:7:0"), ("b", "R:0:7:1"), ("a", "R:0:7:2")) == ["ok", "ok", "dup"]
    # its retry (attempt 9) reads the rows in another order: each id is its own once
    assert send(("b", "R:0:9:0"), ("a", "R:0:9:1"), ("a", "R:0:9:2")) == ["ok", "ok", "dup"]
    assert r.hget(keys.job("a"), "w") == b"R:0:9:1"
    # another partition, another run: someone else's job, however equal the rows
    assert send(("a", "R:1:9:1"), ("a", "S:0:9:1")) == ["dup", "dup"]
    # a speculative copy (attempt 11) alongside attempt 10, rows in the same order
    assert send(("c", "R:2:10:0")) == ["ok"]
    assert send(("c", "R:2:11:0"), ("d", "R:2:11:1"), ("c", "R:2:11:3")) == ["ok", "ok", "dup"]
    assert send(("d", "R:2:10:1"), ("c", "R:2:10:3")) == ["ok", "dup"]
    # one short field, only for tagged jobs
    prod_q = prod.prepare(keys, cfg, "t", {"n": 1}, job_id="plain")
    SCRIPTS["enqueue"](r, *prod.enqueue_call(keys, cfg, [prod_q]))
    assert r.hexists(keys.job("plain"), "w") is False
    assert r.hexists(keys.job("d"), "w") is True


def test_reads_export_and_redrive_cover_every_shard(spark: SparkSession, url: str, qname: str,
                                                     tmp_path: Path) -> None:
    """On a 3-shard queue the events, the job records and the dead letters of every shard
    are read (or of one, with shard=); the incremental export keeps one checkpoint per shard;
    a bulk re-drive sends each dead job back into its own shard."""
    import json as _json

    from streamq import Fail, Job, Registry, Worker
    from streamq._core.keys import Keys, shard_keys, shard_of
    from streamq.testing import run_until_idle, test_config

    cfg = QueueConfig(shards=3, event_kinds=ALL_EVENTS)
    ids = [f"s-{i}" for i in range(90)]
    q = Queue.from_url(url, qname, cfg)
    try:
        q.enqueue_many([{"type": "t", "payload": {"n": i}, "job_id": j}
                        for i, j in enumerate(ids)])
        assert {shard_of(j, 3) for j in ids} == {0, 1, 2}
        events = read_events(spark, url=url, queue=qname, partitions=2)
        assert sorted(r["job_id"] for r in events.collect()) == sorted(ids)
        one = read_events(spark, url=url, queue=qname, partitions=2, shard=1).collect()
        assert sorted(r["job_id"] for r in one) == sorted(j for j in ids if shard_of(j, 3) == 1)
        jobs = read_jobs(spark, url=url, queue=qname)
        assert {(r["job_id"], r["state"]) for r in jobs.collect()} == {(j, "queued") for j in ids}

        first = export_events(spark, url=url, queue=qname, to=str(tmp_path / "out"))
        assert first["exported"] == 90 and set(first["last_event_ids"]) == {0, 1, 2}
        ckpt = _json.loads((tmp_path / "out" / "_checkpoint.json").read_text())
        assert set(ckpt["shards"]) == {"0", "1", "2"}
        q.enqueue_many([{"type": "t", "payload": {}, "job_id": f"late-{i}"} for i in range(9)])
        assert export_events(spark, url=url, queue=qname, to=str(tmp_path / "out"))[
            "exported"] == 9
        assert spark.read.parquet(str(tmp_path / "out" / "events")).count() == 99

        reg = Registry()

        @reg.handler("t")
        def refuse(job: Job) -> None:
            raise Fail("no")

        run_until_idle(Worker(url, [qname], reg, test_config(), cfg))
        dead = read_dead(spark, url=url, queue=qname, partitions=2)
        assert dead.count() == 99
        assert redrive_dataframe(dead, url=url, queue=qname) == {"redriven": 99}
        client: Any = q.client
        for k in shard_keys(qname, 3):
            assert client.xlen(k.stream) == sum(
                1 for j in [*ids, *(f"late-{i}" for i in range(9))] if shard_of(j, 3) == k.shard)
        assert client.hget(Keys(qname).meta, "shards") == b"3"
    finally:
        q.close()
