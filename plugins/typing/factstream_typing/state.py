"""Who is typing where: the view every process keeps, and the writer that changes it.

There is no table. The writer holds each room's typing users in memory (:class:`TypingWriter`), with
each user's deadline; every change becomes one row, the room's whole list, at the writer's next
position (``host.kept_stream``). Every process keeps the same view (:class:`TypingView`): each
room's latest list and the position it changed at, filled by the rows (the writer's own view is its
state). What a reader asks when it catches up (the keeper) is the rooms whose lists changed after a
position: their current lists, in the order of their changes, as the reference's typing writer
answers.

When the writer restarts its state is gone and it starts a new run at a new epoch; every reader then
resets its view (``reset``): it forgets every list, and ``/sync`` treats a token from before the epoch
as knowing nothing (``factstream_typing.sync``), so no client keeps showing someone typing.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass

from factstream import HostApi, KeptStreamWriter
from factstream_typing.rows import STREAM, TypingRow


@dataclass(frozen=True)
class RoomTyping:
    """A room's typing users (sorted) and the position of their last change."""

    position: int
    users: tuple[str, ...]


class TypingView:
    """This process's view of who types where (module docstring)."""

    def __init__(self, host: HostApi) -> None:
        self.rooms: dict[str, RoomTyping] = {}
        #: The epoch of the writer's run this view is of: a token below it predates every list here.
        self.epoch = 0

    def apply(self, position: int, row: TypingRow) -> None:
        self.rooms[row.room_id] = RoomTyping(position, tuple(row.user_ids))

    def reset(self, epoch: int) -> None:
        self.rooms.clear()
        self.epoch = epoch

    def changed(self, since: int, upto: int, limit: int) -> tuple[list[tuple[int, TypingRow]], int, bool]:
        """The keeper: the rooms whose lists changed in ``(since, upto]``, their current lists, in order
        of the changes, at most ``limit``; ``(updates, upto covered, limited)``."""
        changes = sorted(
            (typing.position, room) for room, typing in self.rooms.items() if since < typing.position <= upto
        )
        if len(changes) > limit:
            changes = changes[:limit]
            upto = changes[-1][0]
            limited = True
        else:
            limited = False
        return [(pos, TypingRow(room, list(self.rooms[room].users))) for pos, room in changes], upto, limited


class TypingWriter:
    """The writer's side: each user's deadline, and the changes it writes (module docstring)."""

    def __init__(self, host: HostApi) -> None:
        self.view = host.state(TypingView)
        self.stream: KeptStreamWriter[TypingRow] = host.kept_stream(STREAM, TypingRow, self.view.changed)
        self.view.epoch = self.stream.epoch
        #: (room, user) -> when the user stops typing (time.monotonic()).
        self.deadlines: dict[tuple[str, str], float] = {}
        self._soonest = asyncio.Event()
        self.clock = time.monotonic

    def set_typing(self, room: str, user: str, typing: bool, timeout_ms: int = 0) -> int | None:
        """``user`` types in ``room`` for ``timeout_ms`` (or stopped); the new position, None if nothing changed."""
        key = (room, user)
        if typing:
            self.deadlines[key] = self.clock() + timeout_ms / 1000
            self._soonest.set()
        else:
            self.deadlines.pop(key, None)
        current = self.view.rooms.get(room)
        users = set(current.users) if current is not None else set()
        was = user in users
        if typing == was:
            return None  # still typing (a later deadline), or not typing either way
        if typing:
            users.add(user)
        else:
            users.discard(user)
        return self._write(room, users)

    def _write(self, room: str, users: set[str]) -> int:
        row = TypingRow(room, sorted(users))
        position = self.stream.current_token() + 1
        self.view.apply(position, row)  # first: the keeper answers it from the moment it is written
        written = self.stream.write([row])
        assert written == position
        return written

    def expire(self) -> float | None:
        """Stop every user whose deadline passed; returns the next deadline (None: nobody types)."""
        now = self.clock()
        for (room, user), deadline in sorted(self.deadlines.items()):
            if deadline <= now:
                self.set_typing(room, user, False)
        return min(self.deadlines.values(), default=None)

    async def run(self) -> None:
        """Expire deadlines as they pass (the host's task on the writer)."""
        while True:
            soonest = self.expire()
            self._soonest.clear()
            delay = 60.0 if soonest is None else max(0.0, soonest - self.clock())
            try:
                async with asyncio.timeout(delay):
                    await self._soonest.wait()
            except TimeoutError:
                pass
