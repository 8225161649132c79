"""A room as its writer holds it: the room's lock, its row locked in a transaction, and the writer's view.

A writer keeps its view of each room it writes (:class:`RoomView`: forward extremities, current state
group, history visibility values) in memory, valid while the room's ``writes`` count is the one it
last wrote; a batch written by anyone else (a previous owner of the room's shard) makes it reload.

A room's batches queue on the room's asyncio lock in this process (:class:`RoomLocks`), rather than on
its row lock in PostgreSQL; each write then locks the row too (``FOR UPDATE``), which orders it with
writes of other processes. :class:`RoomWrite` is the room during one such write: the value proves the
row is locked in its transaction.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections import OrderedDict
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

from psycopg import AsyncConnection

from factstream import Transaction
from factstream_events.rules.errors import InvalidEvent
from factstream_events.rules.prune import KNOWN_ROOM_VERSIONS
from factstream_events.rules.visibility import HistoryVisibility
from factstream_events.shared.clock import now_ms
from factstream_events.shared.statestore import Group

#: ``event_id -> (depth, stream ordering, state group)`` of a room's forward extremities.
Extremities = dict[str, tuple[int, int, int | None]]


@dataclass
class RoomView:
    """A writer's view of one room (module docstring)."""

    room_id: str
    room_version: str
    writes: int
    extremities: Extremities
    current: int | None
    visibilities: dict[str, HistoryVisibility] = field(default_factory=dict)


LOCK_ROOM = "SELECT room_version, writes, current_state_group FROM rooms WHERE room_id = %(room_id)s FOR UPDATE"
_NEW_ROOM = """
INSERT INTO rooms (room_id, room_version, creator, is_local, created_ts)
VALUES (%(room_id)s, %(room_version)s, %(creator)s, %(is_local)s, %(ts)s)
ON CONFLICT (room_id) DO NOTHING
"""
_EXTREMITIES = """
SELECT e.event_id, e.topological_ordering, e.stream_ordering, e.state_group
FROM event_forward_extremities f JOIN events e ON e.event_id = f.event_id
WHERE f.room_id = %(room_id)s
"""

#: The room's row as :data:`LOCK_ROOM` reads it: ``(room_version, writes, current_state_group)``.
RoomRow = tuple[Any, ...]


@dataclass(slots=True)
class RoomWrite:
    """One write of a room: its transaction, in which the room's row is locked, and the writer's view."""

    txn: Transaction
    view: RoomView
    #: Whether the room was held before this write (False: the write creates it).
    held_before: bool
    #: The room's current state when the write began (read for local writes, which build on it).
    current: Group | None = None

    @property
    def conn(self) -> AsyncConnection[Any]:
        return self.txn.conn

    @property
    def room_id(self) -> str:
        return self.view.room_id


class RoomLocks:
    """The rooms' asyncio locks: ``room -> [its lock, the writes using or waiting for it]``, an entry
    dropped when no write holds or awaits it (so the table is bounded by the writes under way)."""

    def __init__(self) -> None:
        self._locks: dict[str, list[Any]] = {}

    def __len__(self) -> int:
        return len(self._locks)

    @contextlib.asynccontextmanager
    async def hold(self, room_id: str) -> AsyncIterator[None]:
        entry = self._locks.get(room_id)
        if entry is None:
            entry = self._locks[room_id] = [asyncio.Lock(), 0]
        entry[1] += 1
        try:
            async with entry[0]:
                yield
        finally:
            entry[1] -= 1
            if entry[1] == 0:
                del self._locks[room_id]


class RoomViews:
    """The views of the rooms written last, least recently written first (at most ``max_views``)."""

    def __init__(self, max_views: int) -> None:
        self._views: OrderedDict[str, RoomView] = OrderedDict()
        self.max_views = max_views

    def __len__(self) -> int:
        return len(self._views)

    def drop(self, room_id: str) -> None:
        self._views.pop(room_id, None)

    async def of(self, conn: AsyncConnection[Any], room_id: str, row: RoomRow) -> RoomView:
        """The view of the room whose locked row is ``row``: the one kept if no one else wrote the room
        since, else read again (one query)."""
        version, writes, current = str(row[0]), int(row[1]), row[2]
        view = self._views.get(room_id)
        if view is not None and view.writes == writes:
            self._views.move_to_end(room_id)
            return view
        cur = await conn.execute(_EXTREMITIES, {"room_id": room_id})
        extremities = {str(r[0]): (int(r[1]), int(r[2]), r[3]) for r in await cur.fetchall()}
        view = RoomView(room_id, version, writes, extremities, current)
        self._views[room_id] = view
        self._views.move_to_end(room_id)
        while len(self._views) > self.max_views:
            self._views.popitem(last=False)
        return view


async def lock_room(conn: AsyncConnection[Any], room_id: str) -> RoomRow | None:
    """The room's row, locked until the transaction ends (None: not held)."""
    async with conn.pipeline():  # with the transaction's BEGIN: one round trip
        cur = await conn.execute(LOCK_ROOM, {"room_id": room_id})
    return await cur.fetchone()


async def create_room_row(
    conn: AsyncConnection[Any], room_id: str, version: str, creator: str | None, *, local: bool
) -> RoomRow:
    """Insert the row of a room not held yet, and lock it (a concurrent creation of the same room is
    one row: the second insert does nothing and locks the first's)."""
    if version not in KNOWN_ROOM_VERSIONS:
        raise InvalidEvent(f"room_version: unsupported room version {version!r}")
    params = {"room_id": room_id, "room_version": version, "creator": creator, "is_local": local, "ts": now_ms()}
    await conn.execute(_NEW_ROOM, params)
    row = await lock_room(conn, room_id)
    assert row is not None
    return row
