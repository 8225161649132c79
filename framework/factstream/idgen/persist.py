"""Coalesced persistence of this process's position in ``stream_positions``.

The reference upserted after every completed fact, which serialised writers on one row and took
seconds under contention. Here a completion only marks the position dirty; a background task writes
the latest value at most once per ``interval``. Nothing depends on it for crash safety: at start-up a
writer's own position comes from the rows and the other writers' positions (see
``recovery.initial_tracker``), and other processes only read ``stream_positions`` as a lower bound.
The upsert is monotonic, so a late write can never move a stored position back.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable

from factstream.db.database import Database

log = logging.getLogger(__name__)


class PositionPersister:
    """Writes ``position()`` for (stream_key, instance) to ``stream_positions``, coalescing bursts."""

    def __init__(
        self,
        db: Database,
        stream_key: str,
        instance: str,
        position: Callable[[], int],
        *,
        positive: bool,
        interval: float = 0.1,
    ) -> None:
        self.db = db
        self.stream_key = stream_key
        self.instance = instance
        self.position = position
        self.interval = interval
        self._written: int | None = None
        self._task: asyncio.Task[None] | None = None
        self._closed = False
        self._sql = upsert_position_sql(positive)
        self.writes = 0

    def mark_dirty(self) -> None:
        """Schedule a write of the current position (no-op if one is already scheduled)."""
        if self._closed or (self._task is not None and not self._task.done()):
            return
        self._task = asyncio.get_running_loop().create_task(self._delayed_flush(), name=f"persist:{self.stream_key}")

    async def _delayed_flush(self) -> None:
        await asyncio.sleep(self.interval)
        try:
            await self.flush()
            if self.position() != self._written and not self._closed:
                # Completions that landed during the write scheduled nothing: go again.
                self._task = asyncio.get_running_loop().create_task(self._delayed_flush())
        except Exception:
            # Positions are a lower bound only; the next completion schedules another attempt.
            log.warning("could not persist position of %s for stream %s", self.instance, self.stream_key, exc_info=True)

    async def flush(self) -> None:
        """Write the current position now if it changed since the last write."""
        value = self.position()
        if value == self._written:
            return
        async with self.db.autocommit() as conn:
            await conn.execute(self._sql, {"s": self.stream_key, "i": self.instance, "p": value})
        self._written = value
        self.writes += 1

    async def close(self) -> None:
        """Stop the background task and write the final position."""
        self._closed = True
        task = self._task
        if task is not None and not task.done():
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
        try:
            await self.flush()
        except Exception:
            log.warning("could not persist final position of %s for %s", self.instance, self.stream_key, exc_info=True)


def upsert_position_sql(positive: bool) -> str:
    """Monotonic upsert of one writer's position: a stored value never moves backwards."""
    cmp = "<" if positive else ">"
    return (
        "INSERT INTO stream_positions (stream_name, instance_name, stream_id) VALUES (%(s)s, %(i)s, %(p)s) "
        "ON CONFLICT (stream_name, instance_name) DO UPDATE SET stream_id = EXCLUDED.stream_id "
        f"WHERE stream_positions.stream_id {cmp} EXCLUDED.stream_id"
    )
