"""A counting bound on tasks running at once whose limit can change while tasks hold it."""

from __future__ import annotations

import asyncio
from collections import deque


class Limiter:
    """At most `limit` holders at once, admitted in arrival order; a smaller limit never evicts
    a holder, it only makes new ones wait until enough have left."""

    def __init__(self, limit: int) -> None:
        self._limit = limit
        self._held = 0
        self._waiters: deque[asyncio.Future[None]] = deque()

    @property
    def limit(self) -> int:
        """The current bound."""
        return self._limit

    @property
    def held(self) -> int:
        """Holders now."""
        return self._held

    async def acquire(self) -> None:
        """Waits for a place."""
        if self._held < self._limit and not self._waiters:
            self._held += 1
            return
        waiter: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._waiters.append(waiter)
        try:
            await waiter
        except asyncio.CancelledError:
            if waiter.done() and not waiter.cancelled():
                # Granted and cancelled in the same turn: hand the place on.
                self.release()
            else:
                self._waiters.remove(waiter)
            raise

    def release(self) -> None:
        """Gives a place back."""
        self._held -= 1
        self._admit()

    def resize(self, limit: int) -> None:
        """Sets a new bound; waiters are let in at once when it grew."""
        self._limit = limit
        self._admit()

    def _admit(self) -> None:
        while self._held < self._limit and self._waiters:
            waiter = self._waiters.popleft()
            if not waiter.done():
                self._held += 1
                waiter.set_result(None)
