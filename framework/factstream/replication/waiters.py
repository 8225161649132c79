"""Waiters for stream positions: ``wait_for_stream_position`` and the wake-up after every advance."""

from __future__ import annotations

import asyncio
import bisect
import itertools
import logging
from collections import defaultdict

log = logging.getLogger("factstream.replication.handler")


class PositionWaiters:
    """Futures waiting for (stream, writer) to reach a position, kept sorted by position."""

    def __init__(self) -> None:
        self._waiters: dict[tuple[str, str], list[tuple[int, int, asyncio.Future[None]]]] = defaultdict(list)
        self._order = itertools.count()

    def wake(self, stream: str, instance: str, token: int) -> None:
        """Resolve every waiter for ``stream`` from ``instance`` at or below ``token``."""
        waiters = self._waiters.get((stream, instance))
        if not waiters:
            return
        index = bisect.bisect_right(waiters, (token, float("inf")))
        for _, _, future in waiters[:index]:
            if not future.done():
                future.set_result(None)
        del waiters[:index]

    async def wait(self, stream: str, instance: str, position: int, timeout: float) -> bool:
        """Wait for :meth:`wake` to pass ``position``; False (logged) after ``timeout`` seconds."""
        future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        bisect.insort(self._waiters[(stream, instance)], (position, next(self._order), future))
        try:
            async with asyncio.timeout(timeout):
                await asyncio.shield(future)
            return True
        except TimeoutError:
            log.warning("timed out after %.1fs waiting for %s from %s to reach %d", timeout, stream, instance, position)
            return False
