"""Spark after a reshard down (docs/scaling.md#resharding): read_dead reads the old shards
still draining, and redrive_dataframe sends each dead job back into the shard it died in
(its home under the earlier count), so the old shard drains and is deleted."""

from __future__ import annotations

import uuid
from typing import Any

import pytest

pytest.importorskip("pyspark", reason="the spark extra is not installed")  # CI installs it

from helpers import eventually, fast
from pyspark.sql import SparkSession

from streamq import Fail, Job, Queue, QueueConfig, Registry, Worker
from streamq._core.keys import shard_of
from streamq.admin import Admin
from streamq.spark import read_dead, redrive_dataframe

pytestmark = [pytest.mark.spark, pytest.mark.slow]


async def test_dead_letters_of_an_old_shard_are_read_and_redriven(spark: SparkSession,
                                                                  url: str) -> None:
    name = f"rsp-{uuid.uuid4().hex[:8]}"
    cfg = QueueConfig(shards=3)
    ids = [j for j in (f"s-{i}" for i in range(60)) if shard_of(j, 3) == 2][:4]
    fail = [True]
    ran: list[str] = []
    reg = Registry()

    @reg.handler("job")
    async def job(j: Job) -> None:
        if fail[0]:
            raise Fail("no")
        ran.append(j.id)

    admin = Admin.from_url(url, cfg)
    try:
        with Queue.from_url(url, name, cfg) as q:
            for jid in ids:
                q.enqueue("job", job_id=jid)
        assert admin.reshard(name, 2).live == 3
        async with Worker(url, [name], reg, fast(promote=False), cfg):
            await eventually(lambda: admin.reshard_status(name).old[0].dead == len(ids), 30,
                             "dead letters in old shard 2")
            dead: Any = read_dead(spark, url=url, queue=name)
            assert sorted(r["job_id"] for r in dead.collect()) == sorted(ids)
            fail[0] = False
            assert redrive_dataframe(dead, url=url, queue=name) == {"redriven": len(ids)}
            await eventually(lambda: sorted(ran) == sorted(ids), 30, "re-driven jobs ran")
            await eventually(lambda: admin.reshard_finish(name).done, 30, "old shard deleted")
    finally:
        admin.close()
