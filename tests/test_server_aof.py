"""The test servers' AOF after a SIGKILL (streamq/_core/server.py): a torn script block must
not come back half applied, nor take later writes with it, on a later restart."""

from __future__ import annotations

from pathlib import Path

import redis

from streamq._core.server import RedisServer


def _client(srv: RedisServer) -> redis.Redis:
    return redis.Redis.from_url(srv.url, protocol=2)


def test_a_torn_script_block_is_cut_before_its_multi_on_restart(tmp_path: Path) -> None:
    """A script's effects are one MULTI/EXEC block in the AOF; a kill that tears the block
    (here: its EXEC cut short) loses the whole script and nothing else, across two restarts
    with writes in between (Redis 7.0 alone keeps the torn block's MULTI and first commands:
    the second restart then loses 'after' or applies half the script)."""
    (tmp_path / "r").mkdir()
    with RedisServer(aof=True, directory=str(tmp_path / "r")) as srv:
        c = _client(srv)
        c.set("before", "1")
        c.eval("redis.call('SET', 'a', '1') redis.call('SET', 'b', '2') return 1", 0)
        c.close()
        srv.kill()
        incr = next((srv.dir / "appendonlydir").glob("*.incr.aof"))
        data = incr.read_bytes()
        assert data.endswith(b"$4\r\nEXEC\r\n")
        incr.write_bytes(data[:-8])  # the EXEC torn: both SETs whole, the block incomplete
        srv.restart()
        c = _client(srv)
        assert (c.get("before"), c.get("a"), c.get("b")) == (b"1", None, None)
        c.set("after", "1")
        c.eval("redis.call('SET', 'x', '1') redis.call('SET', 'y', '2') return 1", 0)
        c.close()
        srv.restart()
        c = _client(srv)
        got = [c.get(k) for k in ("before", "a", "b", "after", "x", "y")]
        c.close()
        assert got == [b"1", None, None, b"1", b"1", b"2"]


def test_repairing_a_whole_aof_changes_nothing(tmp_path: Path) -> None:
    (tmp_path / "r").mkdir()
    with RedisServer(aof=True, directory=str(tmp_path / "r")) as srv:
        c = _client(srv)
        c.eval("redis.call('SET', 'a', '1') redis.call('SET', 'b', '2') return 1", 0)
        c.close()
        srv.kill()
        incr = next((srv.dir / "appendonlydir").glob("*.incr.aof"))
        before = incr.read_bytes()
        # no RDB preamble: Valkey 9's (VALKEY080) is one check-aof cannot read (valkey#4739)
        assert [p.name for p in (srv.dir / "appendonlydir").glob("*.base.*")] == [
            "appendonly.aof.1.base.aof"]
        assert "valid" in srv.repair_aof()
        assert incr.read_bytes() == before
