"""The oracle of the ``/sync`` soak (test_sync_soak.py): which timeline events each user must receive,
which they may receive, computed from the stored events alone.

It does not use the events plugin's visibility code (``Reads.visible``, ``factstream_events.rules.visibility``):
it replays each room's membership and history visibility itself, event by event in stream order, from
the rules of the events semantics (§7), and so checks them instead of repeating them.

**The rule** (what ``/sync`` promises, factstream_events/read/sync.py), for user U and an event E stored after
U's client made its initial sync:

* U's membership *at* E is their membership in the state after E; for U's own member event it is the
  "more joined" of the new and the previous membership (join > invite > knock > leave > ban).
* **Must receive, exactly once**: every E at which U is joined. That covers the messages and state of
  the rooms U is in, U's own join, and U's own leave, kick or ban that ends a join (the more joined of
  ``leave`` and ``join`` is ``join``); and also U's own leave or ban that ends an invite (a rejected
  or withdrawn invite: rule 4 makes it always visible to U, and it is how a client learns the invite
  is gone).
* **May receive, at most once**: an E at which U is not joined but which the visibility rules show U
  when U is not peeking (``world_readable``, ``shared``, or ``invited`` while U is invited; a
  history-visibility event judged by the less restrictive of its old and new value), provided U joins
  the room after E (a room joined within a sync range comes with the events of that range that U may
  see; which of them depends on where the client's ranges fall, so they are allowed, not required);
  and U's own other member events (a ban or unban of a user who was not in the room: ``/sync`` shows a
  user their own membership changes).
* **Never**: anything else. A redaction whose target is not an event of its room is never shown.

Order: per room, the events received are in stream order (incremental sync reads by stream order).
The replay assumes a linear room history (one writer, one driver): :func:`replay` checks that each
room's events have increasing depth in stream order.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

MEMBER = "m.room.member"
HISTORY_VISIBILITY = "m.room.history_visibility"
REDACTION = "m.room.redaction"
NEVER_SHOWN = frozenset({"m.room.dummy", "m.room.aliases"})
#: From the least to the most restrictive.
VISIBILITIES = ("world_readable", "shared", "invited", "joined")
#: From the "most joined" to the least.
MEMBERSHIPS = ("join", "invite", "knock", "leave", "ban")


@dataclass(frozen=True, slots=True)
class StoredEvent:
    """One stored, non-outlier event as the oracle reads it from the database."""

    event_id: str
    room_id: str
    stream: int
    depth: int
    type: str
    state_key: str | None
    sender: str
    content: Mapping[str, object]
    redacts: str | None = None


@dataclass(slots=True)
class Expectation:
    """What one user's client must and may receive, and the membership the oracle ends with."""

    required: dict[str, list[str]] = field(default_factory=dict)  # room -> event IDs in stream order
    optional: dict[str, set[str]] = field(default_factory=dict)
    final: dict[str, str] = field(default_factory=dict)  # room -> membership after the last event


def _more_joined(a: str | None, b: str | None) -> str:
    ranked = [m if m in MEMBERSHIPS else "leave" for m in (a, b)]
    return min(ranked, key=MEMBERSHIPS.index)


def _visibility_of(content: Mapping[str, object]) -> str:
    value = content.get("history_visibility")
    return value if isinstance(value, str) and value in VISIBILITIES else "shared"


def _less_restrictive(a: str, b: str) -> str:
    return min(a, b, key=VISIBILITIES.index)


def _shown_when_not_peeking(visibility: str, membership: str) -> bool:
    if membership == "join" or visibility in ("world_readable", "shared"):
        return True
    return visibility == "invited" and membership == "invite"


def replay(events: Sequence[StoredEvent], users: Iterable[str], since: Mapping[str, int]) -> dict[str, Expectation]:
    """Each user's :class:`Expectation` over ``events`` (every stored event, in stream order);
    ``since[user]``: the events position of the user's initial sync (events at or before it are the
    initial sync's business, not counted)."""
    users = list(users)
    out = {u: Expectation() for u in users}
    held = {(e.event_id, e.room_id) for e in events}
    members: dict[str, dict[str, str]] = {}
    visibility: dict[str, str] = {}
    depth: dict[str, int] = {}
    # per user and room: the events they may see if they join later, waiting for that join
    waiting: dict[tuple[str, str], list[str]] = {}
    for e in events:
        room = members.setdefault(e.room_id, {})
        assert e.depth > depth.get(e.room_id, -1), f"{e.event_id}: the room's history is not linear"
        depth[e.room_id] = e.depth
        before = room.get(e.state_key) if e.type == MEMBER and e.state_key is not None else None
        effective = visibility.get(e.room_id, "shared")
        if e.type == MEMBER and e.state_key is not None:
            membership = e.content.get("membership")
            room[e.state_key] = membership if isinstance(membership, str) else "leave"
        elif e.type == HISTORY_VISIBILITY and e.state_key == "":
            new = _visibility_of(e.content)
            effective = _less_restrictive(effective, new)
            visibility[e.room_id] = new
        hidden = e.type in NEVER_SHOWN or (e.type == REDACTION and (e.redacts, e.room_id) not in held)
        for user in users:
            own = e.type == MEMBER and e.state_key == user
            at = _more_joined(room.get(user), before) if own else room.get(user, "leave")
            if e.stream <= since[user] or hidden:
                continue
            expect = out[user]
            key = (user, e.room_id)
            if at == "join" or (own and room[user] in ("leave", "ban") and before == "invite"):
                if own and room[user] == "join":  # a join: what U may see before it becomes allowed
                    expect.optional.setdefault(e.room_id, set()).update(waiting.pop(key, ()))
                expect.required.setdefault(e.room_id, []).append(e.event_id)
            elif own and room[user] != "invite":
                expect.optional.setdefault(e.room_id, set()).add(e.event_id)
            elif _shown_when_not_peeking(effective, at):
                waiting.setdefault(key, []).append(e.event_id)
    for room_id, room in members.items():
        for user in users:
            if user in room:
                out[user].final[room_id] = room[user]
    return out


def stored_events(rows: Iterable[tuple[Any, ...]]) -> list[StoredEvent]:
    """:class:`StoredEvent` values from rows of :data:`EVENTS_SQL`."""
    out = []
    for event_id, room_id, stream, depth, event_type, state_key, sender, redacts, raw in rows:
        body = json.loads(bytes(raw))
        content = body.get("content")
        out.append(
            StoredEvent(
                str(event_id),
                str(room_id),
                int(stream),
                int(depth),
                str(event_type),
                None if state_key is None else str(state_key),
                str(sender),
                content if isinstance(content, dict) else {},
                None if redacts is None else str(redacts),
            )
        )
    return out


#: Every stored event that a client could be shown, in stream order (outliers and backfilled events are
#: not part of a live timeline; there are none in the soak).
EVENTS_SQL = """
SELECT e.event_id, e.room_id, e.stream_ordering, e.topological_ordering, e.type, e.state_key, e.sender,
       e.redacts, j.json
FROM events e JOIN event_json j ON j.event_id = e.event_id
WHERE NOT e.outlier AND NOT e.backfilled
ORDER BY e.stream_ordering
"""
