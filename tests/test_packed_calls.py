"""Script calls packed from runs packed once (``scripts.pack_run``, ``Script.packed``): the
claim.lua and finish.lua calls of a worker send the same bytes as when packed whole."""

from __future__ import annotations

from typing import Any

import pytest
import redis

from streamq import Keys, QueueConfig
from streamq._core import scripts, sends
from streamq._core.config import RateLimit
from streamq._core.conn import async_client
from streamq._core.scripts import SCRIPTS, Script, _pack, pack_run, pack_strs
from streamq._worker.calls import ClaimPack, claim_call
from streamq._worker.lease import LeaseKeeper
from streamq._worker.settle import Settler
from streamq._worker.state import QState, WorkerStats


def test_a_call_packed_from_runs_is_the_call_packed_whole() -> None:
    s = SCRIPTS["finish"]
    keys = ["a", "b{x}", "\N{LATIN SMALL LETTER C WITH CEDILLA}"]
    args: list[Any] = [-3, 1.5, b"\x00\xff\r\n", "", "str", 0, 10**12]
    whole = _pack(("EVALSHA", s.sha, len(keys), *keys, *args))
    runs = (pack_run(keys[:1]), pack_run(keys[1:]), pack_run(args[:2]), pack_run([]),
            pack_run(args[2:]))
    assert s.packed(len(keys), len(keys) + len(args), runs) == whole


@pytest.mark.parametrize("values", [
    ["sq:{q}:job:0f3a", "1700000000000-0", "w1a:3e8", ""],  # a settle's keys, entries, tokens
    ["x" * 255, "y"],  # the longest value packed by join
    ["x" * 256, "y"],  # longer: hiredis packs the run
    ["caf\N{LATIN SMALL LETTER E WITH ACUTE}", "a"],  # not ASCII: its bytes are longer
    ["a", b"b\r\n"],  # not all str
    ["a", 7],
])
def test_a_run_of_strings_packs_as_hiredis_packs_it(values: list[Any]) -> None:
    whole = _pack(("X", *values))  # (the command name's run: $1 X)
    assert pack_strs(values) == pack_run(values) == whole.split(b"$1\r\nX\r\n", 1)[1]
    assert pack_strs([]) == b""


@pytest.mark.parametrize("cfg", [
    QueueConfig(),
    QueueConfig(rate_limit=RateLimit(limit=50, period_s=1.0), group_concurrency=3),
])
@pytest.mark.parametrize("levels", [[0], [4, 2, 0]])
def test_a_claim_packed_from_its_fixed_runs_is_the_claim_packed_whole(
        cfg: QueueConfig, levels: list[int]) -> None:
    k = Keys("packq")
    streams = [k.at_level(p).stream for p in levels]
    pack = ClaimPack.make(k, "host:1:0", cfg, "tok-", levels, streams)
    for first, n, shares in ((0, 75, [75] + [0] * (len(levels) - 1)),
                             (123456, 7, list(range(len(levels))))):
        keys, args = claim_call(k, "host:1:0", cfg, "tok-", first, n, streams, shares)
        whole = _pack(("EVALSHA", SCRIPTS["claim"].sha, len(keys), *keys, *args))
        assert pack.call(first, n, cfg.rate_args(k.shard), shares) == whole


async def test_a_finish_call_packed_from_its_fixed_runs_sends_the_same_bytes(
        url: str, qname: str, r: redis.Redis, monkeypatch: pytest.MonkeyPatch) -> None:
    """settle_batch packed (the lane's fixed runs once) and unpacked (keys and arguments
    packed whole) send the same bytes, for a compact (shared outcome) and a full batch."""
    sent: list[bytes] = []
    exchange = sends.exchange

    async def recorded(client: Any, packed: bytes, replies: int, kept: Any = None) -> Any:
        sent.append(packed)
        return await exchange(client, packed, replies, kept)

    r.script_load(SCRIPTS["finish"].source)  # (no NOSCRIPT round: one send per call)
    monkeypatch.setattr(scripts, "exchange", recorded)
    client = async_client(url)
    cfg = QueueConfig()
    settler = Settler(client, cfg, LeaseKeeper(lambda: None, "c", 1.0),  # type: ignore[arg-type,return-value]
                      WorkerStats(), "c", lambda n: None)
    qs = QState(Keys(qname))
    batches: list[list[Any]] = [
        [("j1", "1-0", "t1", "ok", b"1", 0, ""), ("j2", "2-0", "t2", "ok", b"2", 0, "")],
        [("j3", "3-0", "t3", "ok", b"3", 0, ""), ("j4", "4-0", "t4", "retry", b"", 1500, "E")],
    ]
    try:
        for packable in (True, False):
            if not packable:
                monkeypatch.setattr(Script, "packable", lambda self, c: False)
            for batch in batches:
                qs.buf[:] = batch
                await settler.settle_batch(qs)
                assert not qs.buf
    finally:
        await qs.settles.release(client)
        await client.aclose()
    assert len(sent) == 4 and sent[:2] == sent[2:]
