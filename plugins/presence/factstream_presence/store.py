"""Reading presence: a user's latest row (cached), and the rows ``/sync`` shows a reader.

Whose presence a user may see: their own, and that of every user who shares a room with them now
(``Memberships.users_sharing_a_room`` of the events plugin). Nobody else's, through any route.
"""

from __future__ import annotations

from typing import Any

from factstream_events import Memberships

from factstream import Caches, HostApi, cached
from factstream_presence.rows import TABLE, USER_CACHE, PresenceRow

_COLUMNS = "user_id, state, last_active_ts, last_federation_update_ts, last_user_sync_ts, status_msg, currently_active"
_LATEST = f"SELECT {_COLUMNS} FROM {TABLE} WHERE user_id = %(user)s"
_CHANGED = f"""
SELECT p.stream_id, {", ".join("p." + c.strip() for c in _COLUMNS.split(","))}
FROM {TABLE} p
JOIN unnest(%(writers)s::text[], %(low)s::bigint[], %(high)s::bigint[]) AS r(writer, low, high)
  ON p.instance_name = r.writer AND p.stream_id > r.low AND p.stream_id <= r.high
WHERE p.user_id = ANY(%(users)s)
ORDER BY p.stream_id
"""


class PresenceStore:
    """Presence reads for one host (module docstring)."""

    def __init__(self, host: HostApi) -> None:
        self.host = host
        self.caches: Caches = host.caches

    @cached(name=USER_CACHE, max_size=100_000)
    async def latest(self, user: str) -> PresenceRow | None:
        """``user``'s latest presence (None: never set); every row of the user invalidates it."""
        rows = await self.host.database().fetchall(_LATEST, {"user": user})
        return PresenceRow(*rows[0]) if rows else None

    async def visible_to(self, reader: str) -> frozenset[str]:
        """The users whose presence ``reader`` may see: itself and those sharing a room with it now."""
        return (await self.host.state(Memberships).users_sharing_a_room(reader)) | {reader}

    async def changed(
        self, users: frozenset[str], low: dict[str, int], high: dict[str, int]
    ) -> list[tuple[int, PresenceRow]]:
        """The latest rows of ``users`` whose positions are in ``(low[w], high[w]]`` per writer ``w``."""
        writers = [w for w in high if high[w] > low.get(w, 0)]
        if not writers or not users:
            return []
        params: dict[str, Any] = {
            "writers": writers,
            "low": [low.get(w, 0) for w in writers],
            "high": [high[w] for w in writers],
            "users": sorted(users),
        }
        rows = await self.host.database().fetchall(_CHANGED, params)
        return [(int(r[0]), PresenceRow(*r[1:])) for r in rows]
