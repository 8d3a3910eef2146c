"""A worker's free slots, shared by its fetch loops (one per shard of each queue).

A fetch loop about to claim (a backlog, or its own pending entries, or a reclaim) takes its
turn: the loops that want slots queue up first come, first served, and the loop at the head
takes every free slot it may use (``take_all``) and holds the turn until its claim is
answered (``pass_turn``; at most ``HOLD_MAX_S``): one claim in flight per worker, as with
one unsharded queue, so the slots that come free meanwhile go whole to the next claim. A
loop that just claimed queues up behind the ones waiting, so every shard's turn comes round
(no shard starves) while each claim stays as large as the free slots allow: an N-shard
queue's batches, and so its script calls per job, stay those of an unsharded queue
(docs/scaling.md#how-a-worker-shares-its-slots-over-shards). A static split (each loop
``free // loops``, claims side by side) made every batch about N times smaller. A loop whose
last round failed (its node away?) probes with one slot and no held turn (fetch.py).

A loop about to wait for work (its shard was found drained: a blocking read, which may hold
its slots for up to ``block_ms``) takes its turn in the same line (it need not wait for a
claim in flight) but only a share of the free slots (``take_share``), and passes the turn on
at once: ``free // loops`` (at least one) while every loop is idle, as many as a lone job's
read and a hand-off need; one slot while another loop has a backlog (it took a whole turn
last), so that idle shards' reads park no more than a slot each while a busy shard could use
them. One line for both kinds keeps every loop's wait bounded: with fewer slots than shards,
idle shards' reads served first would starve a shard with a backlog.
"""

from __future__ import annotations

import asyncio
from collections import deque

HOLD_MAX_S = 0.1
"""A whole turn ends at its claim's reply, or after this long (a node that does not answer)."""


class Slots:
    """Free slots and the fetch loops' turns (one event loop; not thread-safe)."""

    def __init__(self, free: int = 0, loops: int = 1) -> None:
        self.free = free
        self.loops = max(1, loops)
        """How many fetch loops share the slots (the share of a blocking read)."""
        self._turns: deque[tuple[list[asyncio.Future[None]], bool]] = deque()
        """Loops waiting for their turn, first come first served: (a box of a future, renewed
        when it was woken for slots another took first; whether it wants a whole turn)."""
        self._holder: str | None = None
        """The loop holding a whole turn (its claim in flight): the next whole turn waits."""
        self._lapse: asyncio.TimerHandle | None = None
        """Ends the held turn after HOLD_MAX_S: a claim stuck on a node that does not answer
        holds up the other shards' claims no longer than that."""
        self._busy: set[str] = set()
        """Loops whose last take was a whole turn (they had a backlog), by the caller's key."""

    def __repr__(self) -> str:
        return f"Slots(free={self.free}, waiting={len(self._turns)}, busy={len(self._busy)})"

    @property
    def waiting(self) -> int:
        """Fetch loops waiting for their turn."""
        return len(self._turns)

    def release(self, n: int) -> None:
        if n > 0:
            self.free += n
            self._wake()

    def grab(self, n: int) -> int:
        """Take up to n free slots now, outside the turns: a settling call's hand-off offer
        (finish.lua may start released jobs for this worker in them; what it did not use is
        given back with ``release`` when the call is answered)."""
        return self._take(n)

    def overdraw(self, n: int) -> None:
        """Take n slots whatever is free (a job handed over always runs)."""
        self.free -= n

    def _wake(self) -> None:
        """The loop at the head takes what is free when it runs (after the handlers that
        end in the same event-loop turn freed theirs: one claim for all of them)."""
        if self.free > 0 and self._turns:
            box, whole = self._turns[0]
            if not (whole and self._holder is not None) and not box[0].done():
                box[0].set_result(None)

    def pass_turn(self, who: str) -> None:
        """The whole turn ``who`` took with ``take_all`` is over (its claim answered, or
        HOLD_MAX_S passed): the next. A turn that lapsed already is not passed again."""
        if self._holder != who:
            return
        self._holder = None
        if self._lapse is not None:
            self._lapse.cancel()
            self._lapse = None
        self._wake()

    def rest(self, who: str) -> None:
        """The loop ``who`` fetches nothing for now (its queue paused or rate limited)."""
        self._busy.discard(who)

    async def take_all(self, want: int, who: str) -> int:
        """Wait for this loop's turn and a free slot; take every free slot up to want."""
        self._busy.add(who)
        await self._turn(True)
        self._holder = who
        self._lapse = asyncio.get_running_loop().call_later(HOLD_MAX_S, self.pass_turn, who)
        return self._take(want)

    async def take_share(self, want: int, who: str) -> int:
        """Wait for this loop's turn and a free slot; take a share of the free slots for a
        blocking read, at most want: one while another loop has a backlog, else
        ``free // loops`` (at least one)."""
        self._busy.discard(who)
        await self._turn(False)
        return self._take(min(want, 1 if self._busy else max(1, self.free // self.loops)))

    def _take(self, n: int) -> int:
        n = max(0, min(n, self.free))
        self.free -= n
        self._wake()  # what is left: the next in line
        return n

    async def _turn(self, whole: bool) -> None:
        turns = self._turns
        if self.free > 0 and not turns and not (whole and self._holder is not None):
            return
        loop = asyncio.get_running_loop()
        box = [loop.create_future()]
        me = (box, whole)
        turns.append(me)
        try:
            while not (turns[0] is me and self.free > 0
                       and not (whole and self._holder is not None)):
                if box[0].done():  # woken, but another took the slots first: wait again
                    box[0] = loop.create_future()
                await box[0]
        except BaseException:
            turns.remove(me)
            self._wake()  # the turn goes on to the next
            raise
        turns.popleft()
