"""The load: a producer thread that offers a seeded mix of job kinds through the proxy."""

from __future__ import annotations

import random
import threading
import time
from typing import Any

from streamq import Queue, QueueConfig

from .common import KINDS, MIX, max_attempts_of, transient


def job_spec(i: int, rng: random.Random, mix: tuple[int, ...] = MIX) -> dict[str, Any]:
    kind = rng.choices(KINDS, mix)[0]
    spec: dict[str, Any] = {"type": f"chaos.{kind}", "job_id": f"{kind}-{i:07d}",
                            "max_attempts": max_attempts_of(kind), "payload": {}}
    if kind == "once":  # max_attempts=1: at once (60 %) or running for a while
        spec["type"] = "chaos.slow"
        spec["payload"] = {"s": 0 if rng.random() < 0.6 else round(rng.uniform(0.3, 2.5), 2)}
    elif kind == "last":  # max_attempts=2, the first attempt fails by design: the 2nd is last
        spec["type"] = "chaos.retry"
        spec["payload"] = {"fails": 1, "d": round(rng.uniform(0.1, 0.5), 2)}
    elif kind == "delayed":
        spec["delay"] = round(rng.uniform(1.0, 5.0), 3)
    elif kind == "retry":
        spec["payload"] = {"fails": rng.choice((1, 2)), "d": round(rng.uniform(0.2, 1.0), 2)}
    elif kind in ("slow", "slow_sync"):
        spec["payload"] = {"s": round(rng.uniform(0.5, 3.0), 2)}
    return spec


def kind_of(job_id: str) -> str:
    return "cron" if job_id.startswith("cron:") else job_id.rsplit("-", 1)[0]


class Producer(threading.Thread):
    """Offers ``rate`` jobs per second until told to stop; a batch whose reply is lost is sent
    again with the same ids until acknowledged (a duplicate then means: ours, accepted)."""

    def __init__(self, url: str, queue: str, qcfg: QueueConfig, rate: float, seed: int,
                 mix: tuple[int, ...] = MIX) -> None:
        super().__init__(name="chaos-producer", daemon=True)
        self.mix = mix
        self.url, self.queue, self.qcfg, self.rate = url, queue, qcfg, rate
        self.rng = random.Random(seed)
        self.stop = threading.Event()
        self.accepted: dict[str, str] = {}
        self.fails: dict[str, int] = {}
        """Planned failures of each retrying job."""
        self.resent = 0
        self.error: BaseException | None = None

    def run(self) -> None:
        q = Queue.from_url(self.url, self.queue, self.qcfg)
        try:
            t0 = time.monotonic()
            i = 0
            while not self.stop.is_set():
                due = int((time.monotonic() - t0) * self.rate)
                if due <= i:
                    time.sleep(0.05)
                    continue
                n = min(due - i, 500)
                self._send(q, [job_spec(i + k, self.rng, self.mix) for k in range(n)])
                i += n
        except BaseException as exc:  # noqa: BLE001 - reported by the harness
            self.error = exc
        finally:
            q.close()

    def _send(self, q: Queue, batch: list[dict[str, Any]]) -> None:
        give_up = time.monotonic() + 180
        while True:
            try:
                results = q.enqueue_many(batch)
                break
            except Exception as exc:
                if time.monotonic() > give_up or not transient(exc):
                    raise
                self.resent += 1
                time.sleep(0.2)
        for spec, res in zip(batch, results, strict=True):
            if res.status not in ("queued", "scheduled", "duplicate"):
                raise RuntimeError(f"job {res.job_id} not accepted: {res}")
            self.accepted[spec["job_id"]] = kind = kind_of(spec["job_id"])
            if kind in ("retry", "last"):
                self.fails[spec["job_id"]] = spec["payload"]["fails"]
