"""Whose long polls an ``events`` row wakes (docs/sync.md, "When a long poll returns").

The rule is the stream's ``StreamSpec.wake``: the core calls it for each row it applies and wakes the
users and the members of the rooms it names.
"""

from __future__ import annotations

from factstream import Wake
from factstream_events.rules.validate import MEMBER
from factstream_events.shared.rows import EV, EventsRow, event_data


def wake(row: EventsRow) -> Wake:
    """Whose long polls an ``events`` row wakes: the members of its room, and a member event's target
    (an invite, kick or ban reaches a user who is not in the room; a join reaches the joiner before
    their rooms are indexed)."""
    if row.kind != EV:
        return Wake()
    data = event_data(row)
    if data.type == MEMBER and data.state_key is not None:
        return Wake(users=(data.state_key,), rooms=(data.room_id,))
    return Wake(rooms=(data.room_id,))
