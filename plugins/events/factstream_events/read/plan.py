"""What a read of "what is new for this user" shows of each room, decided before anything else is read.

``GET /events`` and the rooms section of ``/sync`` answer the same question from one plan, built once
per request from the user's membership (docs/plugins/events.md, Sync):

* :func:`plan_changes`: since a token, the rooms the user was joined to at its start, folded with their
  membership changes in the range, in stream order (:func:`fold`);
* :func:`plan_initial`: no token, the user's membership in each room at the range's end.

Each room gets one frozen :class:`RoomPlan`: its section (``join``, ``invite``, ``leave``), the last
stream ID its timeline may reach (a leave's, for a room the user left; none for a room they never
joined, such as an invite they rejected), whether its whole state is shown, and the membership event
that decided it. :func:`fetch_new` then reads the newest events of every planned timeline at once;
each route renders them (visibility, redactions, formats) its own way.

The fold is the reference's, room by room: a join (again) shows the whole state; a leave, kick or ban
after a join ends the timeline there, and the user's later leaves and bans in the range are shown after
it; an invite after a leave shows the room under ``invite`` too; a leave that ends no join gives no
timeline, only the leave.
"""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any, Literal

from psycopg import AsyncConnection

from factstream_events.rules.tokens import Positions, WriterRange
from factstream_events.shared.stored import COLUMNS, Row, row_of

Section = Literal["join", "invite", "leave"]

# The events of rooms that follow a gap: a prev event the room does not hold. Read from the rooms'
# backward extremities (few, usually none), not by each timeline event's edges (thousands at once).
AFTER_GAP = """
SELECT g.event_id FROM event_backward_extremities b
JOIN event_edges g ON g.prev_event_id = b.event_id AND g.room_id = b.room_id
WHERE b.room_id = ANY(%(rooms)b)
"""
# The newest events of each room up to its cap, by (topological, stream) order: initial sync. Without
# their JSON (``raw`` empty): ``Reads.format`` keeps each event's client form and reads the JSON of
# those it does not hold, in one query (an initial sync of 1,000 rooms moves 7.7 MB of JSON otherwise).
_NEWEST_IN_ROOMS = """
SELECT {columns}, ''::bytea FROM unnest(%(rooms)b::text[], %(caps)b::bigint[]) AS r(room_id, cap)
CROSS JOIN LATERAL (
    SELECT * FROM events x WHERE x.room_id = r.room_id AND NOT x.outlier AND x.stream_ordering <= r.cap AND {upto}
    ORDER BY x.topological_ordering DESC, x.stream_ordering DESC LIMIT %(limit)s
) e
"""


@dataclass(frozen=True, slots=True)
class RoomPlan:
    """One room of a read: what decides its part of the answer (module docstring)."""

    room_id: str
    section: Section
    #: The last stream ID the room's timeline may reach; -1: none (the user never joined it).
    cap: int
    full_state: bool = False
    #: The user's membership event that decided the section (None: joined before the range, still in).
    member_event: Row | None = None
    #: A ``leave`` room: the user's later leaves and bans in the range, shown after the timeline.
    later: tuple[Row, ...] = ()
    #: A ``leave`` room: an invite that followed, which shows the room under ``invite`` too.
    invited_again: Row | None = None
    #: The user never joined the room in the range (``cap`` -1): a rejected invite, a withdrawn knock.
    never_joined: bool = field(init=False)
    #: Whether the room's timeline is read (not an invite, and joined).
    has_timeline: bool = field(init=False)

    def __post_init__(self) -> None:
        # fields, not properties: read per room while a response is rendered, where a property would be a
        # call back into this module (tests/bundled/events/test_sync_walk.py)
        object.__setattr__(self, "never_joined", self.cap < 0)
        object.__setattr__(self, "has_timeline", self.section != "invite" and self.cap >= 0)


@dataclass(frozen=True, slots=True)
class ReadPlan:
    """The rooms of one read, by ID."""

    rooms: Mapping[str, RoomPlan]

    def timelines(self) -> list[RoomPlan]:
        """The rooms whose timeline is read."""
        return [room for room in self.rooms.values() if room.has_timeline]


def plan_changes(joined: Iterable[str], changes: Sequence[Row], top: int) -> ReadPlan:
    """The plan of a read since a token: ``joined`` (rooms the user may have new events in, joined at the
    range's start) up to ``top``, folded with the user's membership ``changes`` in the range."""
    rooms = {room_id: RoomPlan(room_id, "join", top) for room_id in joined}
    for change in changes:
        fold(rooms, change, top)
    return ReadPlan(MappingProxyType(rooms))


def fold(rooms: dict[str, RoomPlan], change: Row, top: int) -> None:
    """A membership change of the user (in stream order) decides its room's plan."""
    room = rooms.get(change.room_id)
    if change.membership == "join":
        rooms[change.room_id] = (
            # joined again: the room's whole state, its timeline from the range's start
            dataclasses.replace(room, full_state=True, member_event=change)
            if room is not None and room.section == "join" and room.member_event is None
            else RoomPlan(change.room_id, "join", top, full_state=True, member_event=change)
        )
    elif change.membership == "invite":
        if room is not None and room.section == "leave":  # left, then invited again: both sections
            rooms[change.room_id] = dataclasses.replace(room, invited_again=change)
        else:
            rooms[change.room_id] = RoomPlan(change.room_id, "invite", change.stream, member_event=change)
    elif change.membership in ("leave", "ban"):
        if room is not None and room.section == "leave":  # kicked then banned, a new invite rejected...
            rooms[change.room_id] = dataclasses.replace(room, later=(*room.later, change), invited_again=None)
            return
        was_in = room is not None and room.section == "join"
        joined_before = change.prev_membership == "join"
        rooms[change.room_id] = RoomPlan(
            change.room_id,
            "leave",
            # never joined: the leave alone (a rejected invite, a withdrawn knock)
            change.stream if was_in or joined_before else -1,
            full_state=room.full_state if room is not None and was_in else False,
            member_event=change,
        )


def plan_initial(memberships: Iterable[Row], top: int, *, include_leave: bool) -> ReadPlan:
    """The plan of an initial sync: the user's last membership event in each room at the range's end."""
    rooms: dict[str, RoomPlan] = {}
    for member in memberships:
        if member.membership == "join":
            rooms[member.room_id] = RoomPlan(member.room_id, "join", top, full_state=True)
        elif member.membership == "invite":
            rooms[member.room_id] = RoomPlan(member.room_id, "invite", member.stream, member_event=member)
        elif member.membership in ("leave", "ban") and include_leave:
            cap = member.stream if member.prev_membership == "join" else -1
            rooms[member.room_id] = RoomPlan(member.room_id, "leave", cap, full_state=True, member_event=member)
    return ReadPlan(MappingProxyType(rooms))


# -- fetching what is new ----------------------------------------------------------------------------

# The reads of what is new for a user, of ``GET /events`` and ``/sync``, each over a
# per-writer range (``WriterRange.sql``: an event of writer w is new iff since[w] < its ID <= upto[w]).
# Lists go in PostgreSQL's binary format (``%(...)b``): psycopg dumps a list of strings as text by
# quoting each.
_MEMBERSHIP_CHANGES = """
SELECT {columns}, j.json FROM room_memberships m
JOIN events e ON e.event_id = m.event_id JOIN event_json j ON j.event_id = m.event_id
WHERE m.user_id = %(user)s AND {range}
ORDER BY m.stream_ordering
"""
_NEW_IN_ROOMS = """
SELECT {columns}, j.json FROM unnest(%(rooms)b::text[], %(caps)b::bigint[]) AS r(room_id, cap)
CROSS JOIN LATERAL (
    SELECT * FROM events x WHERE x.room_id = r.room_id AND NOT x.outlier
    AND {range} AND x.stream_ordering <= r.cap
    ORDER BY x.stream_ordering DESC LIMIT %(limit)s
) e
JOIN event_json j ON j.event_id = e.event_id
"""
_EX_OUTLIERS = """
SELECT x.stream_id, {columns}, j.json FROM ex_outlier_stream x
JOIN events e ON e.event_id = x.event_id JOIN event_json j ON j.event_id = x.event_id
WHERE {range} AND e.room_id = ANY(%(rooms)b)
"""


def membership_changes(user: str, span: WriterRange) -> tuple[str, dict[str, Any]]:
    """The user's membership events in ``span``, in stream order (``SELECT {COLUMNS}, json``)."""
    where, params = span.sql("e.stream_ordering", "e.instance_name", "span")
    return _MEMBERSHIP_CHANGES.format(columns=COLUMNS, range=where), {**params, "user": user}


def new_in_rooms(span: WriterRange, caps: Mapping[str, int], limit: int) -> tuple[str, dict[str, Any]]:
    """The newest ``limit`` events of each room of ``caps`` in ``span`` and at or before its cap (the
    last stream ID its timeline may reach: a leave's), any order (``SELECT {COLUMNS}, json``)."""
    where, params = span.sql("x.stream_ordering", "x.instance_name", "span")
    names = list(caps)
    return _NEW_IN_ROOMS.format(columns=COLUMNS, range=where), {
        **params,
        "rooms": names,
        "caps": [caps[n] for n in names],
        "limit": limit,
    }


def ex_outliers(span: WriterRange, rooms: Sequence[str]) -> tuple[str, dict[str, Any]]:
    """The events of ``rooms`` persisted again as normal events in ``span`` (at their ``ex_outlier_stream``
    ID and writer): ``SELECT stream_id, {COLUMNS}, json``."""
    where, params = span.sql("x.stream_id", "x.instance_name", "span")
    return _EX_OUTLIERS.format(columns=COLUMNS, range=where), {**params, "rooms": list(rooms)}


@dataclass(frozen=True, slots=True)
class NewRows:
    """A room's newest events in a range, oldest first, as stored (not yet filtered for the user)."""

    rows: tuple[Row, ...]
    #: The stream position of each of ``rows`` (an event persisted again after being an outlier is new at
    #: its ``ex_outlier_stream`` ID).
    positions: tuple[int, ...]
    #: More events were there, or one of these follows a gap in the stored history.
    limited: bool


async def fetch_new(
    conn: AsyncConnection[Any], plan: ReadPlan, span: WriterRange, limit: int, *, gaps: bool
) -> dict[str, NewRows]:
    """The newest ``limit`` events in ``span`` of each planned timeline, up to its cap, in stream order;
    with ``gaps``, a timeline that holds an event following a gap in the stored history is limited."""
    reading = [room for room in plan.timelines() if room.cap > span.low.minimum]
    if not reading:
        return {}
    names = [room.room_id for room in reading]
    caps = {room.room_id: room.cap for room in reading}
    queries = [new_in_rooms(span, caps, limit + 1), ex_outliers(span, names)]
    if gaps:
        queries.append((AFTER_GAP, {"rooms": names}))
    newest_rows, ex_outlier_rows, *after_gap = await together(conn, *queries)
    found: dict[str, dict[str, tuple[int, Row]]] = {}
    for row in map(row_of, newest_rows):
        found.setdefault(row.room_id, {})[row.event_id] = (row.stream, row)
    for r in ex_outlier_rows:
        row = row_of(r[1:])
        if int(r[0]) <= caps[row.room_id]:
            found.setdefault(row.room_id, {})[row.event_id] = (int(r[0]), row)
    after = {str(r[0]) for r in after_gap[0]} if after_gap else set()
    out: dict[str, NewRows] = {}
    for room in reading:
        newest = sorted(found.get(room.room_id, {}).values(), key=lambda item: item[0], reverse=True)
        out[room.room_id] = _shown(newest, limit, after)
    return out


async def fetch_initial(conn: AsyncConnection[Any], plan: ReadPlan, upto: Positions, limit: int) -> dict[str, NewRows]:
    """An initial sync's timelines: each planned room's newest ``limit`` events up to its cap and ``upto``
    (per writer), by topological order, every room's in one query; limited after a gap too."""
    reading = plan.timelines()
    if not reading:
        return {}
    names = [r.room_id for r in reading]
    where, bound = upto.bound("<=", "x.stream_ordering", "x.instance_name", "upto")
    params = {**bound, "rooms": names, "caps": [r.cap for r in reading], "limit": limit + 1}
    newest_rows, after_gap = await together(
        conn, (_NEWEST_IN_ROOMS.format(columns=COLUMNS, upto=where), params), (AFTER_GAP, {"rooms": names})
    )
    found: dict[str, list[Row]] = {}
    for row in map(row_of, newest_rows):
        found.setdefault(row.room_id, []).append(row)
    after = {str(r[0]) for r in after_gap}
    out = {}
    for room_id in names:
        rows = sorted(found.get(room_id, ()), key=lambda r: (r.topological, r.stream), reverse=True)
        out[room_id] = _shown([(row.stream, row) for row in rows], limit, after)
    return out


def _shown(newest_first: Sequence[tuple[int, Row]], limit: int, after_gap: set[str]) -> NewRows:
    """A timeline from its candidates (``(position, row)``, newest first): the newest ``limit``, oldest
    first; limited when more were there or when one of those kept follows a gap in the stored history."""
    kept = newest_first[:limit][::-1]
    limited = len(newest_first) > limit or any(row.event_id in after_gap for _, row in kept)
    return NewRows(tuple(row for _, row in kept), tuple(p for p, _ in kept), limited)


async def together(conn: AsyncConnection[Any], *queries: tuple[str, Mapping[str, Any]]) -> list[list[Any]]:
    """The rows of each query (binary format, as :func:`~factstream_events.shared.stored.fetch_binary`),
    all sent in one round trip (a pipeline): reads that do not depend on each other wait for the server
    once, not once each."""
    async with contextlib.AsyncExitStack() as stack:
        await stack.enter_async_context(conn.pipeline())
        cursors = []
        for sql, params in queries:
            cur = await stack.enter_async_context(conn.cursor(binary=True))
            await cur.execute(sql, params)
            cursors.append(cur)
        return [await cur.fetchall() for cur in cursors]
