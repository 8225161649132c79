"""``/sync`` for typing: ``rooms.join.<room>.ephemeral.events`` gets an ``m.typing`` event per room.

For each room the user is joined to now (and only those: typing is for a room's members), in the
request's range ``(since, upto]``:

* a room whose typing list changed in the range gets ``{"type": "m.typing", "content": {"user_ids":
  [...]}}`` with its current list (a list that changed again after ``upto`` waits for the next range);
* an initial sync (no ``since``) gets the rooms where someone types now;
* a ``since`` from before the writer's current run (the writer restarted since the client's token
  was made: ``since < epoch``) gets every joined room, empty lists included: the client's lists are
  of a run whose state is gone, and each ``m.typing`` replaces the room's list, so nothing the client
  shows sticks, and nothing of the new run is skipped (every position of it is above the token).

Each joined room is watched under its own key (``typing|<room>``, ``request.watch_rooms``), and a row of
the room wakes that key: exactly the room's joined members (the events plugin's key, the room ID, is
watched by invitees too).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from factstream_events import Memberships

from factstream import SyncRequest
from factstream_typing.state import TypingView


def watch_key(room: str) -> str:
    """The notifier key a typing change of ``room`` wakes (module docstring)."""
    return f"typing|{room}"


def _event(users: tuple[str, ...]) -> dict[str, Any]:
    return {"type": "m.typing", "content": {"user_ids": list(users)}}


async def sync_typing(request: SyncRequest) -> Mapping[str, Any]:
    """The ``rooms`` part of typing for one user's range (module docstring)."""
    host = request.host
    joined = await host.state(Memberships).joined_rooms(request.user)
    if request.watch_rooms is not None:
        request.watch_rooms(watch_key(room) for room in joined)
    view = host.state(TypingView)
    since = max(request.since.values(), default=0)
    upto = max(request.upto.values(), default=0)
    if since >= upto and not request.initial:
        return {}
    stale = 0 < since < view.epoch
    join: dict[str, Any] = {}
    for room in sorted(joined):
        typing = view.rooms.get(room)
        if typing is not None and typing.position > upto:
            continue  # changed after this range: the next one has it
        users = typing.users if typing is not None else ()
        changed = typing is not None and since < typing.position and (users or not request.initial)
        if stale or changed:
            join[room] = {"ephemeral": {"events": [_event(users)]}}
    return {"join": join} if join else {}
