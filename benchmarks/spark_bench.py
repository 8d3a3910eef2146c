"""Spark figures: bulk enqueue of N rows from local[2], and event export throughput.

``python -m benchmarks.spark_bench [--rows 1000000] [--reps 3]``. Each repetition: a new
private redis-server; the DataFrame is generated in Spark (ids and a small payload) and cached,
enqueued with enqueue_dataframe; then every job's 'enqueued' event is exported to Parquet
with export_events. One Spark session for all repetitions (the first one also pays for the
Python workers' start). Reports every repetition and the median: on a small shared machine
one run can be 20% off the next.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from typing import Any

from streamq import ALL_EVENTS, QueueConfig
from streamq._core.server import RedisServer


def run(rows: int, partitions: int, reps: int) -> dict[str, Any]:
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    from pyspark.sql import SparkSession
    from pyspark.sql import functions as f

    from streamq.spark import enqueue_dataframe, export_events

    spark = (SparkSession.builder.master("local[2]").appName("streamq-bench")
             .config("spark.ui.enabled", "false").getOrCreate())
    spark.sparkContext.setLogLevel("ERROR")
    runs: list[dict[str, Any]] = []
    try:
        df = (spark.range(rows, numPartitions=partitions)
              .select(f.concat(f.lit("row-"), f.col("id").cast("string")).alias("id"),
                      (f.col("id") % 1000).alias("size"),
                      f.lit("/uploads/x.jpg").alias("path"))).cache()
        df.count()  # materialise, so the timing is the enqueue alone
        for _ in range(reps):
            with RedisServer() as srv, tempfile.TemporaryDirectory() as out:
                cfg = QueueConfig(events_maxlen=rows + 1000, event_kinds=ALL_EVENTS)
                t0 = time.perf_counter()
                counts = enqueue_dataframe(df, url=srv.url, queue="bench",
                                           job_type="image.process", id_col="id",
                                           payload_cols=["path", "size"], queue_config=cfg)
                enqueue_s = time.perf_counter() - t0
                t0 = time.perf_counter()
                exported = export_events(spark, url=srv.url, queue="bench", to=out,
                                         partitions=partitions)
                export_s = time.perf_counter() - t0
                runs.append({"enqueued": counts.enqueued, "enqueue_s": round(enqueue_s, 2),
                             "enqueue_jobs_per_s": round(counts.enqueued / enqueue_s),
                             "exported_events": exported["exported"],
                             "export_s": round(export_s, 2),
                             "export_events_per_s": round(exported["exported"] / export_s)})
                print(json.dumps(runs[-1]), file=sys.stderr)
    finally:
        spark.stop()
    return {"rows": rows, "partitions": partitions, "reps": reps,
            "enqueued_all": all(r["enqueued"] == rows for r in runs),
            "enqueue_jobs_per_s_median": statistics.median(r["enqueue_jobs_per_s"] for r in runs),
            "export_events_per_s_median": statistics.median(
                r["export_events_per_s"] for r in runs),
            "runs": runs}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rows", type=int, default=1_000_000)
    ap.add_argument("--partitions", type=int, default=4)
    ap.add_argument("--reps", type=int, default=3)
    args = ap.parse_args(argv)
    result = run(args.rows, args.partitions, args.reps)
    print(json.dumps(result, indent=2))
    return 0 if result["enqueued_all"] else 1


if __name__ == "__main__":
    raise SystemExit(main())
