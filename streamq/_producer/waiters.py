"""One subscriber per queue object for every ``enqueue_and_wait`` it runs.

A queue object owns one pub/sub channel (``Keys.waiter_channel``) and one subscriber
connection, opened on first use. Every job it waits on names that channel as its ``notify``
channel; finish.lua, cancel.lua, the dead-lettering and progress.lua publish
``'<state> <job id>'`` there, and the subscriber wakes the waiters of that job id. So a call
costs no SUBSCRIBE/UNSUBSCRIBE round trips and no connection of its own, and thousands of
concurrent waiters share one connection.

A message is mostly a wake-up: a woken waiter reads the job's record (the truth). The one
exception is a completed job's small result (at most 1 KB), which finish.lua puts in the message
itself (``'completed <job id> =<result>'``) for channels whose tag starts with ``r`` (every
waiter channel of this release): the waiter returns it without reading the record. Messages can be
lost (a reconnect, a job whose notify channel is someone else's because it was a duplicate), so
a waiter also re-reads the record at least every ``POLL_MAX_S``. The subscriber's reader runs
supervised: any error closes its connection, and it subscribes again after a backoff.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import secrets
import threading
from typing import Any

import redis
import redis.asyncio as aredis

from .._core.keys import Keys
from .._core.supervise import Supervised

log = logging.getLogger("streamq.queue")
POLL_MAX_S = 0.5
"""A waiter re-reads the record at least this often, message or not."""
_READY_WAIT_S = 1.0


def _parse(message: Any) -> tuple[str | None, bytes | None]:
    """(job id, inline result or None) of a message: '<state> <job id>[ =<result>]'. Only a
    'completed' message carries a result."""
    data = message.get("data") if isinstance(message, dict) else None
    if not isinstance(data, bytes):
        return None, None
    state, _, rest = data.partition(b" ")
    job_id, _, inline = rest.partition(b" ")
    result = inline[1:] if state == b"completed" and inline[:1] == b"=" else None
    return job_id.decode(errors="replace") or None, result


def _channel(keys: Keys) -> str:
    """A waiter channel whose tag starts with 'r': finish.lua may inline small results."""
    return keys.waiter_channel("r" + secrets.token_hex(8))


class AsyncWaiters:
    """The shared subscriber of one AsyncQueue."""

    def __init__(self, client: aredis.Redis, keys: Keys) -> None:
        self.client = client
        self.channel = _channel(keys)
        self._events: dict[str, set[asyncio.Event]] = {}
        self.inline: dict[str, bytes] = {}
        """Results that arrived in a message, by job id (only while someone waits on it)."""
        self._subscribed = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self._sup = Supervised(f"waiter subscriber {self.channel}", log)

    async def start(self) -> None:
        """Start the reader if needed and wait (briefly) until it is subscribed; waiters poll
        meanwhile, so a slow subscription costs latency, never a result."""
        if self._task is None or self._task.done():
            self._task = asyncio.create_task(self._sup.run(self._read, lambda: True))
        if not self._subscribed.is_set():
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._subscribed.wait(), _READY_WAIT_S)

    def register(self, job_id: str) -> asyncio.Event:
        event = asyncio.Event()
        self._events.setdefault(job_id, set()).add(event)
        return event

    def unregister(self, job_id: str, event: asyncio.Event) -> None:
        events = self._events.get(job_id)
        if events is not None:
            events.discard(event)
            if not events:
                del self._events[job_id]
                self.inline.pop(job_id, None)

    async def _read(self) -> float:
        pubsub = self.client.pubsub(ignore_subscribe_messages=True)
        try:
            await pubsub.subscribe(self.channel)
            self._subscribed.set()
            self._sup.ok()
            while True:
                message = await pubsub.get_message(timeout=30.0)
                job_id, result = _parse(message)
                events = self._events.get(job_id or "", ())
                if events and result is not None and job_id is not None:
                    self.inline[job_id] = result
                for event in events:
                    event.set()
        finally:
            self._subscribed.clear()
            try:
                await pubsub.aclose()  # type: ignore[no-untyped-call]
            except Exception as exc:  # noqa: BLE001 - closing a broken connection
                log.debug("closing the waiter subscription: %s", exc)

    async def close(self) -> None:
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
            self._task = None


class Wake:
    """One waiter's wake-up for a thread: a lock held until ``set``. Cheaper to make and to
    wake on than a ``threading.Event`` (no Condition, no waiter lock per wait): one per
    ``enqueue_and_wait`` call, on its latency path."""

    __slots__ = ("_lock",)

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._lock.acquire()

    def set(self) -> None:
        with contextlib.suppress(RuntimeError):  # already set: one wake-up is enough
            self._lock.release()

    def wait(self, timeout: float) -> bool:
        """Wait until set (or ``timeout`` seconds); consumes the wake-up (``Event.wait``
        then ``clear``). True when it was set."""
        return self._lock.acquire(timeout=max(timeout, 0.0))


class SyncWaiters:
    """The shared subscriber of one (sync) Queue: a daemon thread reads the channel."""

    def __init__(self, client: redis.Redis, keys: Keys) -> None:
        self.client = client
        self.channel = _channel(keys)
        self._lock = threading.Lock()
        self._events: dict[str, set[Wake]] = {}
        self._inline: dict[str, bytes] = {}
        self._subscribed = threading.Event()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._sup = Supervised(f"waiter subscriber {self.channel}", log)

    def start(self) -> None:
        if self._subscribed.is_set():  # (the reader runs: it clears this when it ends)
            return
        with self._lock:
            if self._thread is None or not self._thread.is_alive():
                self._stop.clear()
                self._thread = threading.Thread(target=self._sup.run_sync,
                                                args=(self._read, self._stop),
                                                name="streamq-waiters", daemon=True)
                self._thread.start()
        self._subscribed.wait(_READY_WAIT_S)

    def register(self, job_id: str) -> Wake:
        event = Wake()
        with self._lock:
            self._events.setdefault(job_id, set()).add(event)
        return event

    def unregister(self, job_id: str, event: Wake) -> None:
        with self._lock:
            events = self._events.get(job_id)
            if events is not None:
                events.discard(event)
                if not events:
                    del self._events[job_id]
                    self._inline.pop(job_id, None)

    def take_inline(self, job_id: str) -> bytes | None:
        """The result that arrived in a message for ``job_id``, if one did."""
        with self._lock:
            return self._inline.get(job_id)

    def _read(self) -> float:
        pubsub = self.client.pubsub(ignore_subscribe_messages=True)  # type: ignore[no-untyped-call]
        try:
            pubsub.subscribe(self.channel)
            self._subscribed.set()
            self._sup.ok()
            while not self._stop.is_set():
                message = pubsub.get_message(timeout=1.0)
                job_id, result = _parse(message)
                if job_id is None:
                    continue
                with self._lock:
                    events = list(self._events.get(job_id, ()))
                    if events and result is not None:
                        self._inline[job_id] = result
                for event in events:
                    event.set()
            return 0.0
        finally:
            self._subscribed.clear()
            try:
                pubsub.close()
            except Exception as exc:  # noqa: BLE001 - closing a broken connection
                log.debug("closing the waiter subscription: %s", exc)

    def close(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=2)
            self._thread = None


