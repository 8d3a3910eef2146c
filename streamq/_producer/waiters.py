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
import os
import secrets
import threading
import time
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
    return _parse_data(data)


def _parse_data(data: Any) -> tuple[str | None, bytes | None]:
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
    ``enqueue_and_wait`` call, on its latency path. ``fired``: a message for its job came;
    a bare ``set`` (its turn to read the subscription, ``SyncWaiters``) leaves it False."""

    __slots__ = ("_lock", "fired")

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._lock.acquire()
        self.fired = False

    def set(self) -> None:
        with contextlib.suppress(RuntimeError):  # already set: one wake-up is enough
            self._lock.release()

    def fire(self) -> None:
        self.fired = True
        self.set()

    def wait(self, timeout: float) -> bool:
        """Wait until set (or ``timeout`` seconds); consumes the wake-up (``Event.wait``
        then ``clear``). True when it was set."""
        return self._lock.acquire(timeout=max(timeout, 0.0))


_CHECK_IDLE_S = 1.0
"""A subscription no one has read for this long is checked before a call enqueues."""


class SyncWaiters:
    """The shared subscriber of one (sync) Queue, read by its waiting callers themselves.

    No thread of its own: while calls wait, one of them at a time (the reader, holding
    ``_reader``) reads the subscription and wakes the others; when its own message comes it
    hands the reading over to another waiter and returns. So a lone caller reads its result
    itself, with no thread switch on its path, and thousands of waiting threads still share
    one connection. Messages that come while no one waits stay in the socket until the next
    reader (they are for jobs no one waits on any more, and are dropped). A forked child
    subscribes on a connection of its own. Any error closes the subscription; the next
    reader subscribes again after a back-off (the waiters re-read their records meanwhile).
    """

    def __init__(self, client: redis.Redis, keys: Keys) -> None:
        self.client = client
        self.channel = _channel(keys)
        self._lock = threading.Lock()  # _events, _inline
        self._events: dict[str, set[Wake]] = {}
        self._inline: dict[str, bytes] = {}
        self._reader = threading.Lock()  # held by the caller reading the subscription
        self._pubsub: Any = None
        self._pid = 0
        self._last_read = 0.0
        self._retry_at = 0.0
        self._closed = False
        self._sup = Supervised(f"waiter subscriber {self.channel}", log)

    def start(self) -> None:
        """Subscribe before the caller enqueues (its message must find the subscription).
        A subscription idle for ``_CHECK_IDLE_S`` is read once first: a closed connection
        (a server restart, a failover) shows there and is made again."""
        if (self._pubsub is not None and time.monotonic() - self._last_read < _CHECK_IDLE_S
                and self._pid == os.getpid()):
            return
        if not self._reader.acquire(timeout=_READY_WAIT_S):
            return  # another caller reads: the subscription is up, or being made again
        try:
            self._read(None, 0.0)
            if self._pubsub is None and not self._closed:  # a failed check: at once again
                self._retry_at = 0.0
                self._read(None, 0.0)
        finally:
            self._reader.release()
            self._pass_turn(None)

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

    def wait(self, wake: Wake, timeout: float) -> bool:
        """Until a message for the job of ``wake`` came (True) or ``timeout`` seconds passed
        (False), reading the subscription while no other waiter does."""
        end = time.monotonic() + timeout
        while not wake.fired:
            if time.monotonic() >= end:
                return False
            if self._reader.acquire(blocking=False):
                try:
                    self._read(wake, end)
                finally:
                    self._reader.release()
                    self._pass_turn(wake)
                if not wake.fired and self._pubsub is None:  # backing off: no spinning
                    wake.wait(min(end, self._retry_at) - time.monotonic())
            else:  # another waiter reads: its message, or its turn to read, or the timeout
                wake.wait(end - time.monotonic())
        return True

    def _read(self, wake: Wake | None, end: float) -> None:
        """With ``_reader`` held: read and deliver messages until ``wake`` fired or ``end``
        (monotonic) passed; at least one read without waiting."""
        try:
            ps = self._subscription()
            if ps is None:
                return
            conn = ps.connection  # read directly: a third of redis-py's get_message calls
            while True:
                if conn.can_read(timeout=max(end - time.monotonic(), 0.0)):
                    self._deliver(conn.read_response())
                self._last_read = now = time.monotonic()
                if (wake is not None and wake.fired) or now >= end:
                    return
        except Exception as exc:  # noqa: BLE001 - any failure: subscribe again, later
            self._drop()
            self._retry_at = time.monotonic() + self._sup.failed(exc)
        except BaseException:  # interrupted mid-read: the connection may hold half a reply
            self._drop()
            raise

    def _subscription(self) -> Any:
        """The subscription, made (and confirmed) when there is none; None while backing off
        after a failure, or once closed."""
        if self._pubsub is not None and self._pid != os.getpid():
            self._pubsub = None  # forked: the parent's connection is not this process's
        if self._pubsub is not None:
            return self._pubsub
        if self._closed or time.monotonic() < self._retry_at:
            return None
        ps = self.client.pubsub()  # type: ignore[no-untyped-call]
        try:
            ps.subscribe(self.channel)
            end = time.monotonic() + _READY_WAIT_S
            while True:  # the confirmation: the server has it before the caller enqueues
                message = ps.get_message(timeout=max(end - time.monotonic(), 0.0))
                if isinstance(message, dict) and message.get("type") == "subscribe":
                    break
                if message is None and time.monotonic() >= end:
                    raise TimeoutError("no confirmation of the waiter subscription")
        except BaseException:
            with contextlib.suppress(Exception):
                ps.close()
            raise
        self._pubsub, self._pid, self._last_read = ps, os.getpid(), time.monotonic()
        self._sup.ok()
        return ps

    def _deliver(self, reply: Any) -> None:
        """A reply read from the subscription: [b'message', channel, data] is one; a
        subscription's confirmation or a PING's answer is not."""
        if not isinstance(reply, list) or len(reply) != 3 or reply[0] != b"message":
            return
        job_id, result = _parse_data(reply[2])
        if job_id is None:
            return
        with self._lock:
            events = self._events.get(job_id)
            if not events:
                return
            if result is not None:
                self._inline[job_id] = result
            woken = list(events)
        for event in woken:
            event.fire()

    def _pass_turn(self, me: Wake | None) -> None:
        """After reading: wake one other waiter to read next (it finds the reader lock free,
        or taken by a newer caller; either way someone reads for the waiters)."""
        with self._lock:
            for events in self._events.values():
                for event in events:
                    if event is not me and not event.fired:
                        event.set()
                        return

    def _drop(self) -> None:
        ps, self._pubsub = self._pubsub, None
        if ps is not None and self._pid == os.getpid():
            with contextlib.suppress(Exception):
                ps.close()

    def close(self) -> None:
        """Unsubscribe; waiters still waiting go on re-reading their records."""
        self._closed = True
        self._drop()
