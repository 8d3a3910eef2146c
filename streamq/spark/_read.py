"""The executor side of ``streamq.spark.read_events`` / ``read_dead``: a stream split into
id ranges planned on the driver, one range per Spark partition, each read with raw XRANGE
pages (no per-entry dicts) and handed to Spark as Arrow record batches by
``DataFrame.mapInArrow``: no Row objects, no pickling per entry."""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Iterator
from typing import Any

import attrs
import pyarrow as pa

from .._core.conn import is_cluster
from ._enqueue import client_for

PAGE = 2000
"""Entries per XRANGE call (and per Arrow batch)."""
MAX_SEQ = "18446744073709551615"

_STR = pa.string()
_TS = pa.timestamp("us", tz="UTC")


def id_key(entry_id: str) -> tuple[int, int]:
    """A stream id as the (ms, seq) pair it orders by."""
    ms, _, seq = entry_id.partition("-")
    return int(ms), int(seq or 0)


def plan(first_id: str, last_id: str, parts: int) -> list[tuple[str, str]]:
    """Split [first_id, last_id] into at most ``parts`` id ranges, in order, that cover every
    entry between them exactly once. The last range ends at ``last_id`` itself: entries
    added while the read runs are left for the next export."""
    first_ms, last_ms = id_key(first_id)[0], id_key(last_id)[0]
    step = max(1, math.ceil((last_ms - first_ms + 1) / max(1, parts)))
    out = []
    lo = first_ms
    while lo <= last_ms:
        hi = lo + step - 1
        out.append((f"{lo}-0", f"{hi}-{MAX_SEQ}" if hi < last_ms else last_id))
        lo = hi + 1
    return out


def _strings(values: list[bytes]) -> pa.Array:
    """bytes → Arrow UTF-8 strings, without a Python decode per value unless one is not
    valid UTF-8 (then that column is decoded with replacement characters)."""
    arr = pa.array(values, pa.binary())
    try:
        return arr.cast(_STR)
    except pa.ArrowInvalid:
        return pa.array([v.decode(errors="replace") for v in values], _STR)


def _ids_and_ts(ids: list[bytes]) -> tuple[pa.Array, pa.Array]:
    ms = [int(i[:i.index(b"-")]) * 1000 for i in ids]
    return pa.array([i.decode() for i in ids], _STR), pa.array(ms, _TS)


def events_batch(page: list[Any]) -> pa.RecordBatch:
    """Events are written by _lib.lua as ``job, ev, d`` in that order: read by position."""
    ids = [e[0] for e in page]
    job: list[bytes] = []
    ev: list[bytes] = []
    det: list[bytes] = []
    for e in page:
        f = e[1]
        if len(f) == 6 and f[0] == b"job" and f[2] == b"ev" and f[4] == b"d":
            job.append(f[1])
            ev.append(f[3])
            det.append(f[5])
        else:  # written by something else: read by name
            d = dict(zip(f[::2], f[1::2], strict=False))
            job.append(d.get(b"job", b""))
            ev.append(d.get(b"ev", b""))
            det.append(d.get(b"d", b""))
    eid, ts = _ids_and_ts(ids)
    return pa.RecordBatch.from_arrays(
        [eid, ts, _strings(job), _strings(ev), _strings(det)],
        names=["event_id", "ts", "job_id", "event", "detail"])


def dead_batch(page: list[Any]) -> pa.RecordBatch:
    rows = [dict(zip(e[1][::2], e[1][1::2], strict=False)) for e in page]
    eid, ts = _ids_and_ts([e[0] for e in page])
    cols = [_strings([r.get(name, b"") for r in rows])
            for name in (b"job", b"type", b"reason", b"etype")]
    return pa.RecordBatch.from_arrays(
        [eid, ts, *cols], names=["dead_id", "ts", "job_id", "type", "reason", "error_type"])


CONVERTERS: dict[str, Callable[[list[Any]], pa.RecordBatch]] = {
    "events": events_batch, "dead": dead_batch}


def raw_pages(client: Any, stream: str, lo: str, hi: str) -> Iterator[list[Any]]:
    """XRANGE pages as the server sent them (``[[id, [field, value, ...]], ...]``): the
    parsing into dicts that ``Redis.xrange`` does costs more than the read itself."""
    conn = client.connection_pool.get_connection()
    try:
        start = lo
        while True:
            conn.send_command("XRANGE", stream, start, hi, "COUNT", PAGE)
            page = conn.read_response()
            if page:
                yield page
            if len(page) < PAGE:
                return
            start = "(" + page[-1][0].decode()
    except BaseException:
        conn.disconnect()
        raise
    finally:
        client.connection_pool.release(conn)


@attrs.frozen
class ReadTask:
    """Picklable: reads ``ranges[i]`` for every partition index i it is fed (the partitions
    of ``spark.range(len(ranges), numPartitions=len(ranges))``)."""

    url: str
    cluster: bool
    stream: str
    kind: str
    ranges: tuple[tuple[str, str], ...]
    after: str | None

    def __call__(self, batches: Iterable[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        convert = CONVERTERS[self.kind]
        owner = client_for(self.url, self.cluster)
        client = (owner.get_redis_connection(owner.get_node_from_key(self.stream))
                  if is_cluster(owner) else owner)  # a plain client for the node holding it
        try:
            for rb in batches:
                for i in rb.column(0).to_pylist():
                    lo, hi = self.ranges[i]
                    if self.after and id_key(lo) <= id_key(self.after) < id_key(hi):
                        lo = "(" + self.after  # the range holds the checkpoint
                    for page in raw_pages(client, self.stream, lo, hi):
                        yield convert(page)
        finally:
            owner.close()
