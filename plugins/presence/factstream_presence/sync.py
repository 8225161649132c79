"""``/sync`` for presence: the top-level ``presence`` section, ``{"events": [m.presence, ...]}``.

A reader gets the presence of the users it may see (itself and those sharing a room with it now:
``factstream_presence.store``) whose presence changed in the request's range, each user's latest; an
initial sync gets every such user who is not offline (and itself). Each event is
``{"type": "m.presence", "sender": user, "content": {"presence", "last_active_ago"?, "currently_active",
"status_msg"?}}`` (``last_active_ago`` when the user was ever active).

Wake-ups: a user's row wakes exactly the long polls of the other readers who may see it. Each reader
watches one notifier key per other user it may see (``presence|<user>``, refreshed on every ``/sync``),
and a row wakes its user's key (``StreamSpec.wake``). A user's own change does not wake their own long
poll: their first ``/sync`` makes them online a moment later, and waking that very long poll for it
would answer every client's second ``/sync`` at once with nothing but its own presence. Their own
presence comes with the next answer that something else brings (and in every initial ``/sync`` and
``GET /presence/{user}/status``): a client knows that it syncs, and what it set.

When two users stop sharing a room, the reader's next ``/sync`` drops the other's key: later changes
neither wake it nor reach it (its client keeps the last presence it got, as with the reference).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from factstream import SyncRequest, Wake
from factstream_presence.rows import PresenceRow
from factstream_presence.store import PresenceStore
from factstream_presence.writer import now_ms


def watch_key(user: str) -> str:
    """The notifier key that a change of ``user``'s presence wakes."""
    return f"presence|{user}"


def wake(row: PresenceRow) -> Wake:
    return Wake(rooms=(watch_key(row.user_id),))


def event(row: PresenceRow, now: int) -> dict[str, Any]:
    content: dict[str, Any] = {"presence": row.state, "currently_active": row.currently_active}
    if row.last_active_ts:  # never active: no last_active_ago (as the reference)
        content["last_active_ago"] = max(0, now - row.last_active_ts)
    if row.status_msg is not None:
        content["status_msg"] = row.status_msg
    return {"type": "m.presence", "sender": row.user_id, "content": content}


async def sync_presence(request: SyncRequest) -> Mapping[str, Any]:
    """The ``presence`` section of one user's range (module docstring)."""
    store = request.host.state(PresenceStore)
    users = await store.visible_to(request.user)
    if request.watch_rooms is not None:  # not one's own: a user's client knows it is syncing
        request.watch_rooms(watch_key(u) for u in users if u != request.user)
    since = {} if request.initial else request.since
    rows = await store.changed(users, since, request.upto)
    if request.initial:
        rows = [(p, r) for p, r in rows if r.state != "offline" or r.user_id == request.user]
    if not rows:
        return {}
    now = now_ms()
    return {"events": [event(row, now) for _, row in rows]}
