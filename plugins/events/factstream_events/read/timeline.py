"""A user's rooms and what is new in them: the per-user reads that feed ``/sync``.

* :meth:`Timeline.new_events`, what is new for a user: since a stream token, the user's membership changes in
  any room (invites, kicks, bans, out-of-band invites included), and the new events of every room they
  are joined to, or were joined to and left within the range (up to the leave, kick or ban that ended
  their join; a user who never joined, such as one who rejected an invite, gets no timeline of the
  room), newest ``limit`` per room with
  ``limited`` and a ``prev_batch`` token to page back from. Two stream change caches
  (:mod:`factstream_events.shared.changes`: rooms by their last event, users by their last membership change)
  answer "nothing changed" without a query; the rooms that did change are read in one query
  (``LATERAL``, the newest ``limit + 1`` of each).
* :meth:`Timeline.recent`, a user's recent rooms: the newest ``limit`` events of each of the user's ``rooms``
  most recent rooms (joined rooms by the room's last shown event, invites by the invite), in one
  query: the ranking and a ``LATERAL`` read of each room's newest events by ``(topological, stream)``.

Both filter through :meth:`Reads.for_user` (history visibility, redactions, ``unsigned.membership``).
Backfilled events have negative stream orderings and are never "new"; an outlier persisted again
as a normal event is new at its ``ex_outlier_stream`` ID.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass

from factstream import Caches, HostApi, cached
from factstream_events.read.plan import fetch_new, membership_changes, plan_changes
from factstream_events.read.reads import Reads
from factstream_events.read.roomtokens import live_positions, parse_token, token_text
from factstream_events.rules.errors import InvalidParam
from factstream_events.rules.tokens import Positions, WriterRange
from factstream_events.rules.validate import MEMBER
from factstream_events.shared.changes import ChangeCache
from factstream_events.shared.rows import EV, STREAM, EventsRow, event_data
from factstream_events.shared.stored import COLUMNS, Row, fetch_binary, row_of

#: The cache of each user's joined and invited rooms (invalidated by ``state`` rows of their member key).
ROOMS_FOR_USER = "events_rooms_for_user"
MAX_ROOMS = 1_000
MAX_TIMELINE = 100
DEFAULT_TIMELINE = 10

# Every current membership of the user (leaves and bans too: the newest of them all says how far the
# database was when the rooms were read).
_ROOMS_FOR_USER = """
SELECT c.room_id, c.membership, e.stream_ordering
FROM current_state_events c JOIN events e ON e.event_id = c.event_id
WHERE c.type = 'm.room.member' AND c.state_key = %(user)s
"""
# The rooms a user was joined to at per-writer positions (``{upto}``), from the membership history.
_JOINED_AT = """
SELECT room_id FROM (
    SELECT DISTINCT ON (m.room_id) m.room_id, m.membership FROM room_memberships m
    JOIN events e ON e.event_id = m.event_id
    WHERE m.user_id = %(user)s AND {upto} ORDER BY m.room_id, m.stream_ordering DESC
) m WHERE membership = 'join'
"""
_RECENT = f"""
WITH ranked AS (
    SELECT c.room_id, c.membership, c.event_id AS member_event,
           CASE WHEN c.membership = 'join' THEN r.last_stream_ordering
                ELSE (SELECT m.stream_ordering FROM events m WHERE m.event_id = c.event_id) END AS rank
    FROM current_state_events c
    JOIN rooms r ON r.room_id = c.room_id
    WHERE c.type = 'm.room.member' AND c.state_key = %(user)s AND c.membership IN ('join', 'invite')
    ORDER BY rank DESC NULLS LAST, c.room_id LIMIT %(rooms)s
)
SELECT ranked.room_id, ranked.membership, ranked.rank, {COLUMNS}, j.json FROM ranked
CROSS JOIN LATERAL (
    SELECT * FROM events x
    WHERE x.room_id = ranked.room_id AND NOT x.outlier AND ranked.membership = 'join'
    ORDER BY x.topological_ordering DESC, x.stream_ordering DESC LIMIT %(limit)s
) e
JOIN event_json j ON j.event_id = e.event_id
UNION ALL
SELECT ranked.room_id, ranked.membership, ranked.rank, {COLUMNS}, j.json FROM ranked
JOIN events e ON e.event_id = ranked.member_event JOIN event_json j ON j.event_id = e.event_id
WHERE ranked.membership = 'invite'
"""
_PREFILL_ROOMS = """
SELECT room_id, stream_ordering FROM events WHERE stream_ordering > 0
ORDER BY stream_ordering DESC LIMIT %(n)s
"""
_PREFILL_EX_OUTLIERS = """
SELECT e.room_id, x.stream_id FROM ex_outlier_stream x JOIN events e ON e.event_id = x.event_id
ORDER BY x.stream_id DESC LIMIT %(n)s
"""
_PREFILL_MEMBERS = """
SELECT user_id, stream_ordering FROM room_memberships WHERE stream_ordering > 0
ORDER BY stream_ordering DESC LIMIT %(n)s
"""
#: Rows read from each table to teach the change caches at start-up.
PREFILL_ROWS = 10_000


@dataclass(frozen=True, slots=True)
class MyRoom:
    """One of a user's current rooms: their membership (``join`` or ``invite``) and its event's stream
    ordering."""

    room_id: str
    membership: str
    member_stream: int


@dataclass(frozen=True, slots=True)
class MyRooms:
    """A user's current rooms (iterating gives them), as the database held them when they were read."""

    rooms: tuple[MyRoom, ...]
    #: The stream ordering of the user's newest membership event in any room (leaves and bans too;
    #: -1: none). Read from the database, which may be ahead of this process's position in the stream:
    #: when it is beyond a read's range, the rooms are not those of the range's end.
    newest_change: int

    def __iter__(self) -> Iterator[MyRoom]:
        return iter(self.rooms)


@dataclass(frozen=True, slots=True)
class RoomTimeline:
    """A room's events for a user, oldest first (each formatted for them).

    ``limited``: there were more in the range than returned; ``prev_batch``: a token to page back
    (``/messages``, ``dir=b``) from just before the first event returned.
    """

    room_id: str
    membership: str
    events: list[bytes]
    limited: bool
    prev_batch: str | None


@dataclass(frozen=True, slots=True)
class NewEvents:
    """What is new for a user since a token: ``next`` is the token to ask from next time."""

    next: str
    memberships: list[bytes]
    rooms: list[RoomTimeline]


class Timeline:
    """The per-user reads of one host process (module docstring)."""

    def __init__(self, host: HostApi, reads: Reads) -> None:
        self.host = host
        self.reads = reads
        #: Where ``@cached`` finds its caches.
        self.caches: Caches = host.caches
        self._stream = host.stream(STREAM, EventsRow)
        position = self._stream.current_token()
        #: Room -> last events stream ID of a new event in it.
        self.rooms = ChangeCache("events_rooms_changed", position)
        #: User -> last events stream ID of a membership event about them.
        self.members = ChangeCache("events_members_changed", position)
        #: ``new_events`` calls answered from the change caches alone, and those that read the database.
        self.answered_from_caches = 0
        self.read_database = 0

    # -- feeding the change caches -------------------------------------------------------------------

    def on_rows(self, token: int, rows: Sequence[EventsRow]) -> None:
        """Rows of the events stream (replicated or this process's own), in stream order."""
        for row in rows:
            if row.kind != EV:
                continue
            data = event_data(row)
            if not data.outlier:
                self.rooms.changed(data.room_id, token)
            if data.type == MEMBER and data.state_key is not None:
                self.members.changed(data.state_key, token)

    async def prefill(self) -> None:
        """Teach the change caches the latest changes stored before this process started."""
        db = self.host.database()
        params = {"n": PREFILL_ROWS}
        events = [(str(r), int(s)) for r, s in await db.fetchall(_PREFILL_ROOMS, params)]
        ex = [(str(r), int(s)) for r, s in await db.fetchall(_PREFILL_EX_OUTLIERS, params)]
        members = [(str(u), int(s)) for u, s in await db.fetchall(_PREFILL_MEMBERS, params)]
        self.rooms.prefill(events + ex, max(_floor(events), _floor(ex)))
        self.members.prefill(members, _floor(members))

    # -- the user's rooms ----------------------------------------------------------------------------

    @cached(name=ROOMS_FOR_USER, max_size=50_000)
    async def rooms_for_user(self, user: str) -> MyRooms:
        """The rooms ``user`` is joined to or invited to now, and their newest membership change."""
        rows = await self.host.database().fetchall(_ROOMS_FOR_USER, {"user": user})
        rooms = tuple(MyRoom(str(r), str(m), int(s)) for r, m, s in rows if m in ("join", "invite"))
        return MyRooms(rooms, max((int(s) for _, _, s in rows), default=-1))

    async def joined_at(self, user: str, upto: Positions) -> list[str]:
        """The rooms ``user`` was joined to at the per-writer positions ``upto`` (from the history)."""
        where, params = upto.bound("<=", "e.stream_ordering", "e.instance_name", "upto")
        rows = await self.host.database().fetchall(_JOINED_AT.format(upto=where), {**params, "user": user})
        return [str(r[0]) for r in rows]

    # -- what is new for a user since a token --------------------------------------------------------

    def positions(self) -> Positions:
        """Where each writer of the events stream is in this process now: what ``/events`` reads up to."""
        return Positions(self._stream.current_token(), self._stream.positions())

    async def new_events(self, user: str, since: str | None, *, limit: int = DEFAULT_TIMELINE) -> NewEvents:
        """What is new for ``user`` after ``since`` (a live token, ``s`` or ``m``; None: nothing, just
        the token to start from), up to every writer's position in this process: an event of writer
        ``w`` is new iff ``since[w] < stream_ordering <= now[w]``, so a stalled writer holds back
        only its own events (docs/plugins/events.md, "Tokens with several writers")."""
        if not 1 <= limit <= MAX_TIMELINE:
            raise InvalidParam(f"limit: must be from 1 to {MAX_TIMELINE}, not {limit}")
        upto = self.positions()
        token = parse_token("from", since)
        if token is not None and not token.live:
            raise InvalidParam(f"from: give a stream token (s... or m...), not the room token {since}")
        after = await live_positions(self.host, "from", token) if token is not None else upto
        span = WriterRange(after, upto)
        nothing = NewEvents(await token_text(self.host, upto), [], [])
        if span.empty:
            return nothing
        mine = await self.rooms_for_user(user)
        joined = [r.room_id for r in mine if r.membership == "join"]
        if mine.newest_change > upto.minimum:
            # the rooms were read from a database ahead of this process: those of ``upto``, not now
            joined = await self.joined_at(user, upto)
        # the change caches are asked from the slowest writer's position: conservative (a room that
        # changed only before a faster writer's position is read, and then found to have nothing)
        member_changed = self.members.has_changed_since(user, after.minimum)
        changed = self.rooms.changed_since(joined, after.minimum)
        rooms = set(joined) if changed is None else changed
        if not member_changed and not rooms:
            self.answered_from_caches += 1
            return nothing
        self.read_database += 1
        async with self.host.database().autocommit() as conn:
            changes = (
                [row_of(r) for r in await fetch_binary(conn, *membership_changes(user, span))] if member_changed else []
            )
            # A change stored as an outlier (a remote invite, its rejection) decides no timeline here: it
            # is shown in `memberships` only.
            plan = plan_changes(rooms, [c for c in changes if not c.outlier], upto.maximum)
            new = await fetch_new(conn, plan, span, limit, gaps=False)
            timelines = []
            for room_id in sorted(new):
                rows = new[room_id]
                if not rows.rows:
                    continue
                room = plan.rooms[room_id]
                # a room the user left in the range: their leave, kick or ban ended its timeline
                left = room.member_event if room.section == "leave" else None
                membership = str(left.membership) if left is not None else "join"
                events = await self.reads.for_user(conn, user, list(rows.rows), is_peeking={room_id: False})
                # page back from just before the first event shown, each writer no further than the range
                prev_batch = await token_text(self.host, span.high.capped(rows.positions[0] - 1))
                timelines.append(RoomTimeline(room_id, membership, events, rows.limited, prev_batch))
            # the user's own membership changes are theirs to see whatever the room's history
            # visibility (an invite to a `joined` room too), as the reference's sync sends them
            memberships = await self.reads.format(conn, user, [(c, c.membership) for c in changes])
        return NewEvents(nothing.next, memberships, timelines)

    # -- the newest events of a user's most recent rooms ---------------------------------------------

    async def recent(self, user: str, *, rooms: int = 20, limit: int = DEFAULT_TIMELINE) -> list[RoomTimeline]:
        """The newest ``limit`` events of each of ``user``'s ``rooms`` most recent rooms, most recent
        room first (joined rooms ranked by their last shown event, invites by the invite)."""
        if not 1 <= rooms <= MAX_ROOMS:
            raise InvalidParam(f"rooms: must be from 1 to {MAX_ROOMS}, not {rooms}")
        if not 1 <= limit <= MAX_TIMELINE:
            raise InvalidParam(f"limit: must be from 1 to {MAX_TIMELINE}, not {limit}")
        async with self.host.database().autocommit() as conn:
            fetched = await fetch_binary(conn, _RECENT, {"user": user, "rooms": rooms, "limit": limit + 1})
            order: dict[str, tuple[str, int]] = {}
            by_room: dict[str, list[Row]] = {}
            for r in fetched:
                room_id, membership, rank = str(r[0]), str(r[1]), r[2]
                order[room_id] = (membership, -1 if rank is None else int(rank))
                by_room.setdefault(room_id, []).append(row_of(r[3:]))
            ranked = sorted(order, key=lambda room: (-order[room][1], room))
            kept: dict[str, list[Row]] = {}
            limited: dict[str, bool] = {}
            for room_id in ranked:
                rows = sorted(by_room[room_id], key=lambda row: (row.topological, row.stream), reverse=True)
                limited[room_id] = len(rows) > limit
                kept[room_id] = rows[:limit][::-1]
            # Every room's rows are filtered and formatted together: a few queries in all, not per room.
            joined = [row for room_id in ranked if order[room_id][0] != "invite" for row in kept[room_id]]
            shown = await self.reads.visible(conn, user, joined, is_peeking=dict.fromkeys(ranked, False))
            # an invite room shows the invite itself, whatever the visibility
            shown += [
                (row, row.membership) for room_id in ranked if order[room_id][0] == "invite" for row in kept[room_id]
            ]
            events: dict[str, list[bytes]] = {room_id: [] for room_id in ranked}
            for (row, _), event in zip(shown, await self.reads.format(conn, user, shown), strict=True):
                events[row.room_id].append(event)
            out: list[RoomTimeline] = []
            for room_id in ranked:
                first = kept[room_id][0] if kept[room_id] else None
                prev = f"t{first.topological}-{first.stream - 1}" if first is not None and limited[room_id] else None
                out.append(RoomTimeline(room_id, order[room_id][0], events[room_id], limited[room_id], prev))
            return out


def _floor(changes: Sequence[tuple[str, int]]) -> int:
    """Below which ID a prefill query's rows may be incomplete: 0 if it read every row there is."""
    return min(s for _, s in changes) if len(changes) == PREFILL_ROWS else 0
