"""The cluster chaos run's ``--reshard`` option (tests/chaos/cluster.py): during the fault phase
the soak's sharded queue is resharded 3 -> 6 -> 3 -> 6 ... through ``Admin.reshard`` at random
times, while primaries are killed (failover), slots migrate and workers are SIGKILLed and
SIGTERMed. Some begins are abandoned half-way (``reshard.begin`` driven a few steps by hand and
dropped, as a driver that died would leave it): a producer that meets a frozen shard, or the
next reshard call, finishes it. Afterwards (docs/reliability.md#cluster-chaos):

- every accepted job ended, its outcome written by a recorded execution (cluster.py's checks);
- no job ran twice unless a fault overlapped the two runs (a lease lapse, a stop);
- dedup by id exact: every id the producer re-sent in a later call (its own accepted ids,
  a few per batch, across reshards) answered ``duplicate``, and no id has a record in both of
  its homes (``shard_of(id, 3)`` and ``shard_of(id, 6)``);
- after a last reshard down to 3 and the drain, the old shards' dead letters purged, the
  workers' ``finish`` deletes shards 3..5 (``live`` back to ``shards``): no key of theirs left
  but job records, dedup keys and the ``stats`` HASH (its ``lay`` turns stale producers away).
"""

from __future__ import annotations

import random
import threading
import time
from collections.abc import Callable
from typing import Any

from streamq import Keys, QueueConfig, ReshardInProgress
from streamq._core import reshard
from streamq._core.cluster_server import ClusterServer
from streamq._core.conn import sync_client
from streamq._core.driver import _send, drive
from streamq._core.keys import shard_of
from streamq._core.retry import transient as engine_transient
from streamq._core.shards import Layout, read
from streamq.admin import Admin

from .common import transient

LOW, HIGH = 3, 6


def _retryable(exc: BaseException) -> bool:
    return transient(exc) or engine_transient(exc)


class Resharder(threading.Thread):
    """Reshards the queue between LOW and HIGH shards at random times (mean ``every_s``);
    with probability ``abandon_p`` a begin is driven 2-5 steps and dropped. ``lock`` is held
    around each call and by a primary kill around its replica sync and the kill: a reshard's
    writes have no WAIT (see the report's notes), so a kill must not take a write that no
    replica has yet."""

    def __init__(self, url: str, queue: str, seed: int, every_s: float, abandon_p: float,
                 lock: threading.Lock, say: Callable[[str], None], turns: int = 0) -> None:
        super().__init__(name="chaos-resharder", daemon=True)
        self.url, self.queue, self.every_s, self.abandon_p = url, queue, every_s, abandon_p
        self.rng = random.Random(f"reshard-{seed}")
        self.lock, self.say = lock, say
        self.turns = turns
        """0: reshard until stopped; else this many turns, the first one abandoned (the
        bounded run: one begin up abandoned and finished by another, one reshard down)."""
        self.stop = threading.Event()
        self.events: list[dict[str, Any]] = []
        self.pending: dict[str, Any] | None = None
        """The abandoned begin not known to be finished yet."""
        self.error: BaseException | None = None
        self.retries = 0

    # one call, repeated through faults (each call is safe to repeat)
    def _call(self, what: Callable[[Admin], Any], give_up_s: float = 180.0) -> Any:
        deadline = time.monotonic() + give_up_s
        while True:
            admin: Admin | None = None
            try:
                admin = Admin.from_url(self.url)
                with self.lock:
                    return what(admin)
            except ReshardInProgress:
                raise
            except Exception as exc:
                if not _retryable(exc) or time.monotonic() > deadline:
                    raise
                self.retries += 1
                time.sleep(0.3)
            finally:
                if admin is not None:
                    admin.close()

    def layout(self) -> Layout:
        def get(admin: Admin) -> Layout:
            return drive(admin.client, read(Keys(self.queue))) or Layout(LOW)
        lay: Layout = self._call(get)
        return lay

    def run(self) -> None:
        try:
            n = 0
            while not self.stop.wait(self.rng.uniform(0.3, 1.7) * self.every_s):
                if self.turns and n >= self.turns:
                    continue
                self.once(abandon=(n == 0) if self.turns else None)
                n += 1
        except BaseException as exc:  # noqa: BLE001 - reported by the harness
            self.error = exc

    def settle_pending(self, lay: Layout) -> Layout:
        """An abandoned begin: finished by someone else meanwhile (a producer that met a
        frozen shard), or now by this reshard call (after a call for the other count was
        refused with ReshardInProgress, when ``next`` was stored and not published)."""
        ev = self.pending
        if ev is None:
            return lay
        self.pending = None
        if lay.next is None and lay.epoch > ev["epoch"]:
            ev["finished_by"] = "a producer"
            ev["finished_t"] = time.time()
            self.say(f"abandoned begin {ev['from']} -> {ev['to']} finished by a producer")
            return lay
        other = ev["from"]
        if lay.next is not None and lay.next != lay.shards:
            try:
                self._call(lambda a: a.reshard(self.queue, other))
                ev["refused_other"] = "NOT refused"
            except ReshardInProgress:
                ev["refused_other"] = "ReshardInProgress"
        st = self._call(lambda a: a.reshard(self.queue, ev["to"]))
        ev["finished_by"] = "the next reshard call" if lay.next is not None else "nobody needed"
        ev["finished_t"] = time.time()
        ev["epoch_after"] = st.epoch
        self.say(f"abandoned begin {ev['from']} -> {ev['to']} finished by {ev['finished_by']}"
                 f" (the other count: {ev.get('refused_other', 'not asked')})")
        return self.layout()

    def once(self, target: int | None = None, abandon: bool | None = None) -> None:
        lay = self.settle_pending(self.layout())
        to = target if target is not None else (HIGH if lay.shards == LOW else LOW)
        if lay.shards == to and lay.next is None:
            return
        if abandon if abandon is not None else self.rng.random() < self.abandon_p:
            steps = self.rng.randint(2, 5)
            ev: dict[str, Any] = {"kind": "abandoned", "from": lay.shards, "to": to,
                                  "steps": steps, "epoch": lay.epoch, "t": time.time()}
            self._call(lambda a: abandon_begin(a.client, self.queue, to, steps))
            ev["t1"] = time.time()
            self.events.append(ev)
            self.pending = ev
            self.say(f"reshard {lay.shards} -> {to} begun and abandoned after {steps} steps")
            return
        ev = {"kind": "reshard", "from": lay.shards, "to": to, "t": time.time()}
        r0 = self.retries
        st = self._call(lambda a: a.reshard(self.queue, to))
        ev.update(t1=time.time(), epoch=st.epoch, live=st.live, retries=self.retries - r0)
        self.events.append(ev)
        self.say(f"reshard {lay.shards} -> {to} done (epoch {st.epoch}, live {st.live},"
                 f" {ev['retries']} retries)")

    def summary(self) -> dict[str, Any]:
        ab = [e for e in self.events if e["kind"] == "abandoned"]
        return {"reshards": sum(1 for e in self.events if e["kind"] == "reshard"),
                "up": sum(1 for e in self.events if e["kind"] == "reshard" and e["to"] == HIGH),
                "down": sum(1 for e in self.events if e["kind"] == "reshard" and e["to"] == LOW),
                "abandoned": len(ab),
                "abandoned_finished_by": {
                    w: sum(1 for e in ab if e.get("finished_by") == w)
                    for w in ("a producer", "the next reshard call", "nobody needed")},
                "other_count_refused": sum(1 for e in ab
                                           if e.get("refused_other") == "ReshardInProgress"),
                "other_count_not_refused": sum(1 for e in ab
                                               if e.get("refused_other") == "NOT refused"),
                "calls_repeated_after_a_fault": self.retries}


def abandon_begin(client: Any, queue: str, n: int, steps: int) -> None:
    """Drive ``reshard.begin`` ``steps`` steps by hand, then drop it (a driver that died):
    2 stores ``next``, 3 freezes the shards, 4 reads the time, 5 publishes (``next`` left)."""
    op = reshard.begin(Keys(queue), n, 3600)
    step = next(op)
    for _ in range(steps):
        try:
            step = op.send(_send(client, step))
        except StopIteration:
            return


def cluster_client(cluster: ClusterServer) -> Any:
    return sync_client(cluster.url)


def two_homes(cluster: ClusterServer, queue: str, ids: list[str]) -> list[str]:
    """Ids whose record exists in both homes (3 and 6 shards): a dedup break."""
    moved = [j for j in ids if shard_of(j, LOW) != shard_of(j, HIGH)]
    client: Any = cluster_client(cluster)
    out: list[str] = []
    try:
        for i in range(0, len(moved), 500):
            chunk = moved[i:i + 500]
            pipe = client.pipeline()
            for j in chunk:
                pipe.exists(Keys(queue, shard=shard_of(j, LOW)).job(j))
                pipe.exists(Keys(queue, shard=shard_of(j, HIGH)).job(j))
            got = pipe.execute()
            out += [j for n, j in enumerate(chunk) if got[2 * n] and got[2 * n + 1]]
    finally:
        client.close()
    return out


def leftover(cluster: ClusterServer, queue: str, shard: int) -> list[str]:
    """Keys of a retired shard other than job records, dedup keys, short-lived hand-off
    inboxes and its ``stats`` HASH (as tests/test_reshard_live.py's ``leftover``)."""
    base = Keys(queue, shard=shard).base
    client: Any = cluster_client(cluster)
    try:
        found = [k.decode() for k in client.scan_iter(match=f"{base}:*", count=1000,
                                                         target_nodes=client.PRIMARIES)]
        return sorted(k for k in found if k != Keys(queue, shard=shard).stats and not (
            k.startswith((f"{base}:job:", f"{base}:dd:"))
            or (k.startswith(f"{base}:inbox:") and 0 < client.ttl(k) <= 3600)
            or (k == f"{base}:barrier" and 0 < client.ttl(k) <= 60_000)))
    finally:
        client.close()


def retire_old(cluster: ClusterServer, queue: str, say: Callable[[str], None],
               timeout_s: float = 120.0) -> dict[str, Any]:
    """After the drain (the queue back at LOW shards): purge the old shards' dead letters
    (they keep a shard: docs/scaling.md), wait for the workers' ``finish`` to delete the old
    shards, then look at what is left of them."""
    admin = Admin.from_url(cluster.url, QueueConfig(shards=LOW))
    out: dict[str, Any] = {"failures": []}
    try:
        st = admin.reshard_status(queue)
        out["before"] = {"shards": st.shards, "live": st.live, "epoch": st.epoch,
                         "old": {o.shard: o.total for o in st.old}}
        purged = 0
        for o in st.old:
            if o.dead:
                purged += admin.purge(queue, "failed", shard=o.shard)
        out["dead_purged"] = purged
        t0 = time.time()
        while not st.done and time.time() - t0 < timeout_s:
            time.sleep(0.5)
            st = admin.reshard_status(queue)
        out["deleted_by_workers_s"] = round(time.time() - t0, 1) if st.done else None
        if not st.done:
            out["failures"].append("the workers did not delete the old shards in"
                                   f" {timeout_s:.0f} s: " + "; ".join(st.lines()))
            st = admin.reshard_finish(queue)
        out["after"] = {"shards": st.shards, "live": st.live, "next": st.next,
                        "prev": list(st.prev)}
        if (st.shards, st.live, st.next) != (LOW, LOW, None):
            out["failures"].append(f"layout at the end: {st.lines()}")
        time.sleep(3)  # the workers read the layout about every second: they stop there
        left = {i: leftover(cluster, queue, i) for i in range(LOW, HIGH)}
        # a worker whose blocking read the delete cut (UNBLOCKED) reads the layout before
        # finish sets live = shards; it takes an old shard with no live-work key left for
        # retired (worker/reshard.py) and makes no group again. Should one be made anyway
        # (reported here), the next finish (workers: every minute while prev is kept)
        # deletes it: run it now
        out["made_again_then_swept"] = {i: v for i, v in left.items() if v}
        if any(left.values()):
            admin.reshard_finish(queue)
            left = {i: leftover(cluster, queue, i) for i in range(LOW, HIGH)}
        out["left_on_old_shards"] = sum(len(v) for v in left.values())
        if out["left_on_old_shards"]:
            out["failures"].append(f"keys left on the old shards: {left}")
        say(f"old shards: {out}")
    finally:
        admin.close()
    return out


def reshard_report(chaos: Any, report: dict[str, Any], producer: Any) -> None:
    """The ``--reshard`` checks (after ``check``: the records are read): dedup by id
    exact, then the old shards deleted once their dead letters are purged."""
    rs = chaos.resharder
    assert rs is not None and chaos.cluster is not None
    fails = report["failures"]
    both = two_homes(chaos.cluster, chaos.queue, list(producer.accepted))
    if both:
        fails.append(f"ids with a record in both homes: {len(both)} (e.g. {both[:5]})")
    # 'queued' for an id an earlier call wrote: only from a call retried after a lost reply
    # (a job found with its own body is taken for the call's own earlier try), so only in a
    # call that overlapped a fault
    vt = chaos.o.visibility_s
    windows = [(f["t"] - vt, f["t1"] + vt + 2) for f in chaos.faults]
    odd = [n for n in producer.not_duplicate
           if not any(a <= n[3] and b >= n[2] for a, b in windows)]
    if odd:
        fails.append(f"re-sent ids not answered duplicate outside a fault: {len(odd)}"
                     f" (e.g. {odd[:5]})")
    chaos.retired = retire_old(chaos.cluster, chaos.queue, chaos.say)
    fails += chaos.retired.pop("failures")
    summary = rs.summary()
    if not summary["reshards"] or not summary["abandoned"]:
        fails.append(f"too few reshards for the checks: {summary}")
    if summary["other_count_not_refused"]:
        fails.append("a reshard to another count was not refused while one was begun")
    report["reshard"] = {**summary, "resent_ids": producer.resent,
                         "resent_not_duplicate": len(producer.not_duplicate),
                         "resent_not_duplicate_outside_faults": len(odd),
                         "ids_in_both_homes": len(both), "end": chaos.retired,
                         "log": rs.events}


def render_reshard(r: dict[str, Any]) -> list[str]:
    """The ``--reshard`` lines of the summary."""
    return [f"- reshards {r['reshards']} (up {r['up']}, down {r['down']}; calls repeated"
            f" after a fault {r['calls_repeated_after_a_fault']}), abandoned begins"
            f" {r['abandoned']}, finished by: " + ", ".join(
                f"{w} {n}" for w, n in r["abandoned_finished_by"].items())
            + f"; the other count refused meanwhile {r['other_count_refused']}",
            f"- ids re-sent {r['resent_ids']:,}, not answered duplicate"
            f" {r['resent_not_duplicate']} ({r['resent_not_duplicate_outside_faults']} outside a"
            f" fault), in both homes {r['ids_in_both_homes']}",
            f"- end: {r['end']}"]
