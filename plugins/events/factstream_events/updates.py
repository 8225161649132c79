"""The update function of the ``events`` stream (docs/plugins/events.md, Streams): what a reader
catching up reads.

``(instance, from, to, target)``: a page reads at most :data:`PAGE_SPAN` x target IDs of the range
(limited at the window's end when the range goes further), as the core's table update function does,
so its cost is bounded whatever plan PostgreSQL picks. Half the target for ``ev`` rows (if that many
came back, the page is limited and ends at the last one's ID); then ``state`` rows up to that bound,
cut back to whole IDs (the rows of one ID are never split: when not even one whole ID fits, that one
ID's rows come without a limit); then the ex-outlier ``ev`` rows in the range; merged by ID. One ID
carrying :data:`~factstream_events.shared.rows.STATE_ALL_THRESHOLD` or more ``state`` rows of a room sends
one ``state-all`` row instead.

The three reads go in one round trip on one connection (a writer's streamer reads its own rows back
this way, as it sends them): each reads the whole window, and when the ``ev`` rows end the page
earlier the other two are cut back to their bound. Ordered by ID, the first rows of the window up to the bound
are the first rows of the range up to the bound, so the page is the one reading to the bound gives.
"""

from __future__ import annotations

from factstream import Database
from factstream_events.shared.rows import (
    STATE_ALL_THRESHOLD,
    EventRowData,
    EventsRow,
    StateRowData,
    ev_row,
    state_all_row,
    state_row,
)

#: How many IDs a page reads at most, in multiples of its target.
PAGE_SPAN = 4

_EVENTS = """
SELECT stream_ordering, event_id, room_id, type, state_key, redacts, relates_to, membership, outlier
FROM events WHERE instance_name = %(instance)s AND stream_ordering > %(low)s AND stream_ordering <= %(high)s
ORDER BY stream_ordering LIMIT %(limit)s
"""
_STATE = """
SELECT stream_id, room_id, type, state_key, event_id FROM current_state_delta_stream
WHERE instance_name = %(instance)s AND stream_id > %(low)s AND stream_id <= %(high)s
ORDER BY stream_id LIMIT %(limit)s
"""
_STATE_AT = """
SELECT stream_id, room_id, type, state_key, event_id FROM current_state_delta_stream
WHERE instance_name = %(instance)s AND stream_id = %(id)s
"""
_EX_OUTLIERS = """
SELECT x.stream_id, e.event_id, e.room_id, e.type, e.state_key, e.redacts, e.relates_to, e.membership
FROM ex_outlier_stream x JOIN events e ON e.event_id = x.event_id
WHERE x.instance_name = %(instance)s AND x.stream_id > %(low)s AND x.stream_id <= %(high)s
ORDER BY x.stream_id
"""


async def events_updates(
    db: Database, instance: str, low: int, high: int, target: int
) -> tuple[list[tuple[int, EventsRow]], int, bool]:
    """The rows of ``instance`` in ``(low, high]`` (module docstring)."""
    if low >= high:
        return [], high, False
    half = max(1, target // 2)
    window = min(high, low + PAGE_SPAN * max(1, target))
    params = {"instance": instance, "low": low, "high": window, "limit": half}
    async with db.autocommit() as conn:
        async with conn.pipeline():
            events_read = await conn.execute(_EVENTS, params)
            state_read = await conn.execute(_STATE, {**params, "limit": half + 1})
            outliers_read = await conn.execute(_EX_OUTLIERS, params)
        events = await events_read.fetchall()
        state = await state_read.fetchall()
        outliers = await outliers_read.fetchall()
    limited = len(events) >= half or window < high
    bound = int(events[-1][0]) if len(events) >= half else window
    if bound < window:  # the ev rows end the page: the others up to their last ID
        state = [r for r in state if int(r[0]) <= bound]
    if len(state) > half:
        last = int(state[-1][0])
        whole = [r for r in state if int(r[0]) < last]
        if whole:
            state = whole
            bound = int(whole[-1][0])
        else:
            state = await db.fetchall(_STATE_AT, {"instance": instance, "id": last})
            bound = last
        limited = True
        events = [r for r in events if int(r[0]) <= bound]
    if bound < window:
        outliers = [r for r in outliers if int(r[0]) <= bound]
    updates: list[tuple[int, EventsRow, int]] = []
    for r in events:
        data = EventRowData(r[1], r[2], r[3], r[4], r[5], r[6], r[7], False, bool(r[8]))
        updates.append((int(r[0]), ev_row(data), 0))
    for r in outliers:
        data = EventRowData(r[1], r[2], r[3], r[4], r[5], r[6], r[7], False, False)
        updates.append((int(r[0]), ev_row(data), 0))
    per_room: dict[tuple[int, str], list[EventsRow]] = {}
    for r in state:
        per_room.setdefault((int(r[0]), str(r[1])), []).append(state_row(StateRowData(r[1], r[2], r[3], r[4])))
    for (token, room_id), rows in per_room.items():
        if len(rows) >= STATE_ALL_THRESHOLD:
            updates.append((token, state_all_row(room_id), 1))
        else:
            updates += [(token, row, 1) for row in rows]
    updates.sort(key=lambda u: (u[0], u[2]))
    return [(token, row) for token, row, _ in updates], bound, limited
