"""Fault injection for a writer's reservations: its sequence calls held or slowed.

The window these open: one reservation of a writer has asked the sequence for its IDs and not been
answered yet, while a later reservation of the same writer takes the next ID, commits and completes.
The writer's own position cannot pass the first reservation's starting point then, but the watermark
and the position it announces do pass the completed ID (docs/idgen.md). On a loaded machine the
window opens by itself now and then; these helpers open it on purpose.

The generator's ``_next_ids`` is its one sequence call for ``get_next*`` reservations (the stream
writers' ``reserve`` and ``reserve_groups``); ``append`` takes its IDs inside its ``INSERT`` instead,
so a test of an appending plugin holds a ``get_next_mult`` reservation of its own beside the writes.
"""

from __future__ import annotations

import asyncio
import contextlib
import random
from collections.abc import Iterator
from typing import Any

from factstream.idgen.generator import MultiWriterIdGenerator


class HeldSequence:
    """The next sequence call of a generator waits until :meth:`release` (see :func:`held_sequence`)."""

    def __init__(self) -> None:
        #: Set once the held call has started (the reservation is in flight).
        self.entered = asyncio.Event()
        self._released = asyncio.Event()
        self._held = False

    def release(self) -> None:
        self._released.set()

    async def wait(self) -> None:
        if self._held:
            return
        self._held = True
        self.entered.set()
        await self._released.wait()


@contextlib.contextmanager
def held_sequence(gen: MultiWriterIdGenerator) -> Iterator[HeldSequence]:
    """Hold the next sequence call of ``gen`` (the first reservation made from now on) until
    ``release()``; the calls after it go through. Released and restored on exit."""
    held = HeldSequence()
    original = gen._next_ids

    async def next_ids(conn: Any, n: int, seen: int) -> list[int]:
        await held.wait()
        return await original(conn, n, seen)

    gen._next_ids = next_ids  # type: ignore[method-assign]
    try:
        yield held
    finally:
        held.release()
        del gen._next_ids


@contextlib.contextmanager
def slow_sequence(gen: MultiWriterIdGenerator, *, seed: int, most: float = 0.01) -> Iterator[None]:
    """Every sequence call of ``gen`` waits a random time up to ``most`` seconds before it is sent."""
    rng = random.Random(seed)
    original = gen._next_ids

    async def next_ids(conn: Any, n: int, seen: int) -> list[int]:
        await asyncio.sleep(rng.uniform(0, most))
        return await original(conn, n, seen)

    gen._next_ids = next_ids  # type: ignore[method-assign]
    try:
        yield
    finally:
        del gen._next_ids
