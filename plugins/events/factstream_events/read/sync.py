"""Rooms in ``/sync``: the ``rooms`` section (``join``, ``invite``, ``leave``) of the core's long poll.

The events stream is a synced stream (``sync_key`` ``room_key``, a room token) whose ``sync_rows`` is
:func:`sync_rooms`; the core calls it with the client's range and puts what it returns under
``rooms`` (``StreamSpec.sync_section``). Two reads (docs/plugins/events.md, Sync):

* **incremental** (the client sent ``since``), in stream order: the user's membership changes in the
  range decide each room's section; a joined room that changed gets its newest ``limit`` events after
  ``since`` (``limited`` when more were there, or when one of them follows a gap in the stored
  history), the state changes the timeline skipped, and a ``prev_batch`` to page back with
  ``/messages``. A room the user joined in the range gets its whole state; a room they left, were
  kicked or banned from gets its timeline up to that event (then their later leaves and bans of the
  range), and also shows under ``invite`` when they were invited again before the range's end. The
  rooms read are those the user was in at the range's end, which the process may already have
  passed.
* **initial** (no ``since``), in topological order: every room the user is in at the token, with the
  state at the end of its timeline and its newest ``limit`` events; invites with their stripped state;
  rooms left, with ``include_leave``. Every room's events, state and formatting are read together, in
  a few queries whatever the number of rooms (the reference reads rooms 20 at a time, #12971).

Timelines go through :meth:`Reads.visible`, so history visibility and redactions apply exactly as in
``/messages``: an initial timeline never shows state events from before the user's join that
``/messages`` would hide (the reference's #9923); they are in ``state``, which a member may read.
A redaction of an event delivered earlier arrives as the redaction event itself.

The change caches (:class:`~factstream_events.shared.changes.ChangeCache`) answer "nothing new" without a
query; every request also tells the notifier the user's joined rooms (``watch_rooms``), so a new event
of any of them wakes the user's long poll, and a member event wakes its target.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import msgspec
from psycopg import AsyncConnection

from factstream import HostApi, SyncRequest
from factstream_events.read.filters import RoomFilter
from factstream_events.read.plan import (
    ReadPlan,
    RoomPlan,
    fetch_initial,
    fetch_new,
    membership_changes,
    plan_changes,
    plan_initial,
)
from factstream_events.read.reads import Reads
from factstream_events.read.roomtokens import token_text
from factstream_events.read.timeline import Timeline
from factstream_events.rules.canonical import parse_event_json
from factstream_events.rules.tokens import Positions, WriterRange
from factstream_events.rules.validate import MEMBER
from factstream_events.shared.stored import COLUMNS, Row, fetch_binary, row_of

#: The state types an invite shows of its room (the stripped state), besides the invite itself.
STRIPPED_TYPES = frozenset(
    {
        "m.room.create",
        "m.room.join_rules",
        "m.room.name",
        "m.room.avatar",
        "m.room.canonical_alias",
        "m.room.encryption",
        "m.room.topic",
    }
)

# The reads. Lists go in PostgreSQL's binary format (``%(...)b``) in every one: psycopg dumps a list of
# strings as text by quoting each (a regular expression per item, 55 ms for 10,000 event IDs); in
# binary it copies them.
# Positions are per writer (``{upto}``: ``Positions.bound``, an event of writer w is at or before the
# range's end iff its ID is at most w's position there).
_MEMBERSHIPS_AT = """
SELECT DISTINCT ON (m.room_id) {columns}, j.json FROM room_memberships m
JOIN events e ON e.event_id = m.event_id JOIN event_json j ON j.event_id = m.event_id
WHERE m.user_id = %(user)s AND {upto}
ORDER BY m.room_id, m.stream_ordering DESC
"""
# The state changes of rooms in the range (``{span}``, per writer) before each room's ``high`` (its
# timeline's first event): the last of each key in each room's range.
_STATE_CHANGES = """
SELECT DISTINCT ON (d.room_id, d.type, d.state_key) d.room_id, d.type, d.state_key, d.event_id
FROM unnest(%(rooms)b::text[], %(highs)b::bigint[]) AS r(room_id, high)
JOIN current_state_delta_stream d ON d.room_id = r.room_id AND d.stream_id < r.high AND {span}
ORDER BY d.room_id, d.type, d.state_key, d.stream_id DESC
"""
# The state events of a state section, without their JSON (as an initial sync's timelines: ``plan.fetch_initial``).
_STATE_BY_ID = f"SELECT {COLUMNS}, ''::bytea FROM events e WHERE e.event_id = ANY(%(ids)b)"


# -- the reads ---------------------------------------------------------------------------------------


class RoomSync:
    """The ``rooms`` section of one host process's ``/sync`` (module docstring)."""

    def __init__(self, host: HostApi, reads: Reads, timeline: Timeline) -> None:
        self.host = host
        self.reads = reads
        self.timeline = timeline

    async def __call__(self, request: SyncRequest) -> dict[str, Any]:
        """``sync_rows`` of the events stream: the ``rooms`` section for ``request``'s range."""
        room_filter = RoomFilter.parse(request.filter)
        mine = await self.timeline.rooms_for_user(request.user)
        if request.watch_rooms is not None:
            request.watch_rooms(r.room_id for r in mine if r.membership == "join")
        # Per writer: an event of writer w is in the range iff since[w] < its ID <= upto[w], so a writer
        # that is behind holds back its own events only (a writer absent is at the token's minimum).
        span = WriterRange(Positions.of_writers(request.since), Positions.of_writers(request.upto))
        if span.empty:
            return {}
        if request.initial:
            return await self.initial(request.user, span.high, room_filter)
        joined = [r.room_id for r in mine if r.membership == "join"]
        # The change caches are asked from the slowest writer's position of each end: conservative.
        if mine.newest_change > span.high.minimum or self.timeline.members.has_changed_since(
            request.user, span.high.minimum
        ):
            # the user's rooms as read may already hold a membership change beyond the range: one this
            # process holds (a leave or join written while the request ran), or one the database holds
            # that has not reached this process yet (the rooms were read from the database, which may be
            # ahead of it): the rooms they were in at its end, not now
            joined = await self.timeline.joined_at(request.user, span.high)
        member_changed = self.timeline.members.has_changed_since(request.user, span.low.minimum)
        changed = self.timeline.rooms.changed_since(joined, span.low.minimum)
        rooms = set(joined) if changed is None else changed
        if not member_changed and not rooms:
            return {}
        return await self.incremental(request.user, span, room_filter, rooms, member_changed)

    # -- incremental -------------------------------------------------------------------------------

    async def incremental(
        self, user: str, span: WriterRange, room_filter: RoomFilter, rooms: Iterable[str], member_changed: bool
    ) -> dict[str, Any]:
        """What is new for ``user`` in ``span`` (per writer): ``rooms`` are joined rooms that may have changed."""
        async with self.host.database().autocommit() as conn:
            changes = (
                [row_of(r) for r in await fetch_binary(conn, *membership_changes(user, span))] if member_changed else []
            )
            plan = plan_changes(rooms, changes, span.high.maximum)
            new = await fetch_new(conn, plan, span, room_filter.limit, gaps=True)
            timelines = {}
            for room_id, rows in new.items():
                # page back from just before the first event shown, each writer no further than the range
                prev = await token_text(self.host, span.high.capped(rows.positions[0] - 1)) if rows.rows else None
                timelines[room_id] = _Timeline(rows.rows, rows.limited, prev)
            return await self._render(conn, user, plan, timelines, span, room_filter)

    # -- initial -----------------------------------------------------------------------------------

    async def initial(self, user: str, upto: Positions, room_filter: RoomFilter) -> dict[str, Any]:
        """Every room ``user`` is in at ``upto`` (per writer; and rooms left, with ``include_leave``),
        newest events first by topological order."""
        async with self.host.database().autocommit() as conn:
            where, bound = upto.bound("<=", "e.stream_ordering", "e.instance_name", "upto")
            memberships = _MEMBERSHIPS_AT.format(columns=COLUMNS, upto=where)
            members = map(row_of, await fetch_binary(conn, memberships, {**bound, "user": user}))
            plan = plan_initial(members, upto.maximum, include_leave=room_filter.include_leave)
            new = await fetch_initial(conn, plan, upto, room_filter.limit)
            timelines = {}
            for room_id, rows in new.items():
                first = rows.rows[0] if rows.rows else None  # page back from just before it
                prev = f"t{first.topological}-{first.stream - 1}" if first is not None else None
                timelines[room_id] = _Timeline(rows.rows, rows.limited, prev)
            return await self._render(conn, user, plan, timelines, None, room_filter)

    # -- the response ------------------------------------------------------------------------------

    async def _render(
        self,
        conn: AsyncConnection[Any],
        user: str,
        plan: ReadPlan,
        timelines: Mapping[str, _Timeline],
        span: WriterRange | None,
        room_filter: RoomFilter,
    ) -> dict[str, Any]:
        """The ``rooms`` section: every room's timeline filtered and formatted for ``user`` together."""
        rooms = [
            r
            for r in plan.rooms.values()
            if r.section == "invite" or (r.room_id in timelines and timelines[r.room_id].rows) or r.member_event
        ]
        events, shown = await self._timelines(conn, user, rooms, timelines, room_filter)
        states = await self._states(conn, user, rooms, timelines, shown, span, room_filter)
        out: dict[str, dict[str, Any]] = {}
        for room in sorted(rooms, key=lambda r: r.room_id):
            if room.section == "invite":
                invite = room.member_event
                assert invite is not None  # an invite room is planned from the invite
                body: dict[str, Any] = {"invite_state": {"events": await self._invite_state(conn, user, invite)}}
            else:
                timeline = timelines.get(room.room_id, _Timeline())
                served = events.get(room.room_id, [])
                if not served and not states.get(room.room_id) and room.member_event is None:
                    continue
                body = {
                    "timeline": {"events": [_raw(e) for e in served], "limited": timeline.limited},
                    "state": {"events": [_raw(e) for e in states.get(room.room_id, [])]},
                }
                if timeline.prev_batch is not None:
                    body["timeline"]["prev_batch"] = timeline.prev_batch
            out.setdefault(room.section, {})[room.room_id] = body
            if room.invited_again is not None:
                invite_state = await self._invite_state(conn, user, room.invited_again)
                out.setdefault("invite", {})[room.room_id] = {"invite_state": {"events": invite_state}}
        return out

    async def _timelines(
        self,
        conn: AsyncConnection[Any],
        user: str,
        rooms: Sequence[RoomPlan],
        timelines: Mapping[str, _Timeline],
        room_filter: RoomFilter,
    ) -> tuple[dict[str, list[bytes]], dict[str, list[Row]]]:
        """Each room's timeline as ``user`` may see it (visibility, redactions, ``unsigned``), formatted;
        and the rows shown, by room."""
        rows: list[Row] = []
        for room in rooms:
            if room.section == "invite":
                continue
            timeline = timelines.get(room.room_id, _Timeline())
            kept = [r for r in timeline.rows if room_filter.timeline.allows(r.type)]
            if room.never_joined and room.member_event is not None:
                kept = [room.member_event]  # a rejected invite or withdrawn knock: the leave alone
            rows += kept + list(room.later)
        own = {room.member_event.event_id for room in rooms if room.member_event is not None}
        own.update(row.event_id for room in rooms for row in room.later)
        # the user was in every room here up to its cap: nobody reads a timeline as a stranger
        peeking = dict.fromkeys((room.room_id for room in rooms), False)
        visible_rows = await self.reads.visible(
            conn, user, [r for r in rows if r.event_id not in own], is_peeking=peeking
        )
        visible = {row.event_id: membership for row, membership in visible_rows}
        # the user's own membership events are theirs to see whatever the room's history visibility
        for row in rows:
            if row.event_id in own:
                visible[row.event_id] = row.membership
        ordered = [(row, visible[row.event_id]) for row in rows if row.event_id in visible]
        shown: dict[str, list[Row]] = {}
        for row, _ in ordered:
            shown.setdefault(row.room_id, []).append(row)
        out: dict[str, list[bytes]] = {}
        for (row, _), event in zip(ordered, await self.reads.format(conn, user, ordered), strict=True):
            out.setdefault(row.room_id, []).append(event)
        return out, shown

    async def _states(
        self,
        conn: AsyncConnection[Any],
        user: str,
        rooms: Sequence[RoomPlan],
        timelines: Mapping[str, _Timeline],
        shown: Mapping[str, Sequence[Row]],
        span: WriterRange | None,
        room_filter: RoomFilter,
    ) -> dict[str, list[bytes]]:
        """Each room's ``state``: the whole state at the timeline's end for an initial sync or a room
        joined in the range; otherwise the state changes the timeline skipped (a limited one), and,
        with ``lazy_load_members``, the member events of the timeline's senders."""
        timed = [r for r in rooms if r.section != "invite" and r.room_id in timelines and timelines[r.room_id].rows]
        lazy = room_filter.lazy_load_members
        at_end = await self._end_states(conn, [timelines[r.room_id] for r in timed if r.full_state or lazy])
        wanted: dict[str, dict[tuple[str, str], str]] = {}
        for room in timed:
            end = at_end.get(room.room_id, {})
            if room.full_state:
                wanted[room.room_id] = dict(end)
            elif lazy:
                senders = {r.sender for r in shown.get(room.room_id, ())}
                wanted[room.room_id] = {(MEMBER, s): end[(MEMBER, s)] for s in senders if (MEMBER, s) in end}
        skipped = [r for r in timed if not r.full_state and timelines[r.room_id].limited]
        if skipped and span is not None:  # an initial sync's rooms all have their full state
            where, params = span.sql("d.stream_id", "d.instance_name", "span")
            params["rooms"] = [r.room_id for r in skipped]
            params["highs"] = [min(row.stream for row in timelines[r.room_id].rows) for r in skipped]
            cur = await conn.execute(_STATE_CHANGES.format(span=where), params)
            for room_id, event_type, state_key, event_id in await cur.fetchall():
                if event_id is not None:
                    wanted.setdefault(str(room_id), {})[(str(event_type), str(state_key))] = str(event_id)
        return await self._state_events(conn, user, shown, wanted, room_filter)

    async def _end_states(
        self, conn: AsyncConnection[Any], timelines: Sequence[_Timeline]
    ) -> dict[str, dict[tuple[str, str], str]]:
        """The state after each room's last timeline event (topological order), every room's in one load."""
        groups: dict[str, int] = {}
        for timeline in timelines:
            end = max(timeline.rows, key=lambda r: (r.topological, r.stream))
            if end.state_group is not None:
                groups[end.room_id] = end.state_group
        if not groups:
            return {}
        loaded = await self.reads.states.load_groups(conn, {room_id: {g} for room_id, g in groups.items()})
        out: dict[str, dict[tuple[str, str], str]] = {}
        for room_id, group in groups.items():
            state = loaded[group].state
            out[room_id] = {(t, k): e for t, keys in state.items() for k, e in keys.items()}
        return out

    async def _state_events(
        self,
        conn: AsyncConnection[Any],
        user: str,
        shown: Mapping[str, Sequence[Row]],
        wanted: Mapping[str, Mapping[tuple[str, str], str]],
        room_filter: RoomFilter,
    ) -> dict[str, list[bytes]]:
        """The state events ``wanted`` of each room, less those in its timeline and those the filter
        drops (types; with ``lazy_load_members``, the members who sent none of the timeline's events)."""
        ids: list[str] = []
        for room_id, keys in wanted.items():
            in_timeline = {r.event_id for r in shown.get(room_id, ())}
            senders = {r.sender for r in shown.get(room_id, ())}
            for (event_type, state_key), event_id in sorted(keys.items()):
                if event_id in in_timeline or not room_filter.state.allows(event_type):
                    continue
                if room_filter.lazy_load_members and event_type == MEMBER and state_key not in senders:
                    continue
                ids.append(event_id)
        if not ids:
            return {}
        found = {r.event_id: r for r in map(row_of, await fetch_binary(conn, _STATE_BY_ID, {"ids": ids}))}
        ordered = [(found[e], None) for e in ids if e in found]
        # The state is served as the state, not as changes: no ``prev_content`` (what a state event
        # replaced may be in no state the user could read: a ``joined`` room's earlier name, say).
        served = await self.reads.format(conn, user, ordered, unseen=set(ids))
        out: dict[str, list[bytes]] = {}
        for (row, _), event in zip(ordered, served, strict=True):
            out.setdefault(row.room_id, []).append(event)
        return out

    async def _invite_state(self, conn: AsyncConnection[Any], user: str, invite: Row) -> list[Any]:
        """The invite and the stripped state of its room: from the state after the invite when this
        server holds it, else from the invite's own ``unsigned.invite_room_state`` (a remote invite)."""
        stripped: list[Any] = []
        if invite.outlier or invite.state_group is None:
            unsigned = parse_event_json(invite.raw).get("unsigned")
            given = unsigned.get("invite_room_state") if isinstance(unsigned, dict) else None
            for item in given if isinstance(given, list) else ():
                if isinstance(item, dict) and isinstance(item.get("type"), str):
                    stripped.append({k: item[k] for k in ("type", "state_key", "content", "sender") if k in item})
        else:
            loaded = await self.reads.states.load_groups(conn, {invite.room_id: {invite.state_group}})
            group = loaded[invite.state_group].state
            ids = [e for t, keys in group.items() if t in STRIPPED_TYPES for e in keys.values()]
            inviter = group.get(MEMBER, {}).get(invite.sender)
            if inviter is not None:
                ids.append(inviter)
            found = (await self.reads.rows(conn, ids)).values() if ids else ()
            for row in sorted(found, key=lambda r: (r.type, r.state_key or "")):
                event = parse_event_json(row.raw)
                stripped.append({k: event.get(k) for k in ("type", "state_key", "content", "sender")})
        own = await self.reads.format(conn, user, [(invite, invite.membership)])
        return [*stripped, *(_raw(e) for e in own)]


@dataclass(frozen=True, slots=True)
class _Timeline:
    """A room's timeline as read, before the user's view: its rows (oldest first), whether it is limited,
    and the token to page back from."""

    rows: tuple[Row, ...] = ()
    limited: bool = False
    prev_batch: str | None = None


def _raw(event: bytes) -> msgspec.Raw:
    return msgspec.Raw(event)
