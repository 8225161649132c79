"""What a batch will write, computed before anything is written.

From the batch (ordered, sorted against what is held) and the room's view, :class:`Planner` computes

1. per event, the state before it (its prev_events' states; several different ones are resolved by the
   ``resolve_state`` hook or the default resolver; none: the empty state, which has a group like any
   state) and after it (a new state group for a state event), its history visibility, its previous
   membership and whether a redaction of the batch redacts it: one :class:`EventRow` each;
2. the room's backward extremities added (prev_events not held);
3. the room after the batch (:class:`RoomAfter`): its forward extremities and its current state, with
   the change from the current state before it (the rows of ``current_state_events`` to set and drop,
   and the deltas of ``current_state_delta_stream``).

Only the stream orderings are missing from the plan: they are reserved after it, as late as possible
(an early reservation holds readers back), and stamped on its rows (:meth:`BatchPlan.stamped`).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import msgspec
from psycopg import AsyncConnection

from factstream_events.rules.canonical import parse_event_json
from factstream_events.rules.errors import InvalidEvent
from factstream_events.rules.prune import redacts_target
from factstream_events.rules.statemath import Delta, State, diff
from factstream_events.rules.validate import CREATE, HISTORY_VISIBILITY, MEMBER, REDACTION
from factstream_events.rules.visibility import HistoryVisibility, parse_history_visibility, stored_visibility
from factstream_events.shared.statestore import Group, StatePlan, StateStore
from factstream_events.write.batch import Held, NewEvent
from factstream_events.write.room import Extremities, RoomView, RoomWrite

#: ``async (room_id, room_version, states in order of preference) -> the state``.
Resolver = Callable[[str, str, Sequence[State]], Awaitable[State]]


class EventRow(msgspec.Struct, frozen=True):
    """One event's row of ``events``, as the batch writes it (the field names are the columns of the
    statement's ``json_to_recordset``)."""

    event_id: str
    #: The stream ordering: 0 until reserved; a de-outliered event keeps the one it had as an outlier.
    stream: int
    depth: int
    type: str
    state_key: str | None
    sender: str
    ts: int
    outlier: bool
    state_group: int | None
    visibility: str
    membership: str | None
    #: The sender's previous membership, when the batch knows it (else read by the insert from
    #: ``prev_member_event``, the event that set it).
    prev_membership: str | None
    prev_member_event: str | None
    redacts: str | None
    relates_to: str | None
    #: The batch's first redaction of this event (an earlier one, stored, is read by the insert).
    redacted_by: str | None


class CurrentStateRow(msgspec.Struct, frozen=True):
    """A row of ``current_state_events`` the batch sets."""

    type: str
    state_key: str
    event_id: str
    membership: str | None


class StateDelta(msgspec.Struct, frozen=True):
    """A row of ``current_state_delta_stream``: one key of the current state changed (None: dropped)."""

    type: str
    state_key: str
    event_id: str | None
    prev_event_id: str | None


@dataclass(frozen=True, slots=True)
class RoomAfter:
    """The room after a batch: its forward extremities and current state, and the change of its current
    state (computed before the batch's IDs are reserved: its state rows go out with the first of them)."""

    #: New events rank after every held one (a stream ordering above any real one) until stamped.
    extremities: Extremities
    current: int | None
    sets: list[CurrentStateRow]
    drops: list[tuple[str, str]]
    deltas: list[StateDelta]


#: A stream ordering above every real one: a new event's rank among the forward extremities until its
#: ID is reserved (in batch order).
_PROVISIONAL = 1 << 62


@dataclass(frozen=True, slots=True)
class BatchPlan:
    """Everything a batch writes but its stream orderings (module docstring)."""

    #: Every event the batch writes, in order (prev_events first).
    rows: list[EventRow]
    #: The batch's events held as outliers and now written normally (their rows are updated).
    deoutliered: frozenset[str]
    #: prev_events of the batch not held: the room's new backward extremities.
    backward: set[str]
    #: None for a backfilled batch, or one of outliers only: the room's ends and state do not move.
    after: RoomAfter | None

    @property
    def new_rows(self) -> list[EventRow]:
        return [r for r in self.rows if r.event_id not in self.deoutliered]

    @property
    def deoutliered_rows(self) -> list[EventRow]:
        return [r for r in self.rows if r.event_id in self.deoutliered]

    def stamped(self, orderings: Sequence[int]) -> BatchPlan:
        """The plan with the reserved ``orderings`` on its new rows (in order), and on the forward
        extremities they are."""
        given = dict(zip((r.event_id for r in self.new_rows), orderings, strict=True))
        rows = [msgspec.structs.replace(r, stream=given[r.event_id]) if r.event_id in given else r for r in self.rows]
        after = self.after
        if after is not None:
            streams = {r.event_id: r.stream for r in rows}
            extremities = {eid: (d, streams.get(eid, s), g) for eid, (d, s, g) in after.extremities.items()}
            after = RoomAfter(extremities, after.current, after.sets, after.drops, after.deltas)
        return BatchPlan(rows, self.deoutliered, self.backward, after)


@dataclass(frozen=True, slots=True)
class _EventState:
    """What the batch computed of one (non-outlier) event's state."""

    group: int | None
    visibility: str
    #: The event that set the previous membership of a membership event's target, if any.
    prev_member: str | None


_MEMBERSHIPS = "SELECT event_id, membership FROM events WHERE event_id = ANY(%(ids)b::text[])"
_HV_JSON = "SELECT event_id, json FROM event_json WHERE event_id = ANY(%(ids)b::text[])"


class Planner:
    """Computes :class:`BatchPlan` s with the process's state store and the state resolver."""

    def __init__(self, states: StateStore, resolver: Resolver) -> None:
        self.states = states
        self.resolver = resolver

    async def plan(
        self,
        room: RoomWrite,
        ordered: Sequence[NewEvent],
        deoutliered: frozenset[str],
        held: Mapping[str, Held],
        has_children: set[str],
        backfill: bool,
        groups: StatePlan | None,
    ) -> BatchPlan:
        """The plan of the batch's events to write, ``ordered`` (prev_events first), for ``room``.

        ``deoutliered``: those held as outliers; ``held``: what is held of the batch's events and their
        prev_events; ``has_children``: those of the batch's events that already had children when it
        started (remote batches); ``groups``: the new state groups are planned to be written together
        (see ``statestore``)."""
        in_batch = {e.event_id: e for e in ordered}
        held = dict(held)  # the batch's events join it as they are planned (a later event's prev_events)
        derived: dict[int, tuple[int, Delta]] = {}  # group -> (the group it was made from, the change)
        backward: set[str] = set()
        states: dict[str, _EventState] = {}
        for e in ordered:
            if e.outlier:
                continue
            states[e.event_id] = await self._event_state(room, e, in_batch, held, derived, backward, groups)
        memberships = _memberships(in_batch, held)
        targets = {
            e.event_id: redacts_target(dict(e.event), room.view.room_version)
            for e in ordered
            if e.fields.type == REDACTION
        }
        redacted_by = _redacted_in_batch(ordered, in_batch, targets)
        rows = [_row(e, states.get(e.event_id), memberships, targets, redacted_by, held) for e in ordered]
        after = None
        if not backfill and any(not e.outlier for e in ordered):
            after = await self._room_after(room, ordered, rows, has_children, memberships, derived, groups)
        return BatchPlan(rows, deoutliered, backward, after)

    async def _event_state(
        self,
        room: RoomWrite,
        e: NewEvent,
        in_batch: Mapping[str, NewEvent],
        held: dict[str, Held],
        derived: dict[int, tuple[int, Delta]],
        backward: set[str],
        groups: StatePlan | None,
    ) -> _EventState:
        """The state before and after ``e``, its visibility and previous membership; ``e`` joins ``held``."""
        conn, room_id, f = room.conn, room.room_id, e.fields
        prev_groups: list[tuple[int, int, int]] = []
        for p in f.prev_events:
            h = held.get(p)
            if h is None or h.outlier:
                if p not in in_batch:
                    backward.add(p)
                continue
            if h.state_group is not None:  # (None: an event stored before the empty state had a group)
                prev_groups.append((-h.depth, -h.stream, int(h.state_group)))
        prev_groups.sort()
        before = await self._resolved(conn, room.view, [g for _, _, g in prev_groups], groups)
        after = before
        if f.state_key is not None:
            change = {f.type: {f.state_key: e.event_id}}
            after = await self.states.store(conn, room_id, before, change, groups)
            if after is not before and before is not None:
                derived[after.id] = (before.id, change)
        elif after is None:  # the empty state is a state: only outliers have none
            after = await self.states.empty(conn, room_id, groups)
        vis_before = await self._visibility(conn, room.view, before, in_batch)
        vis_after = vis_before if after is before else await self._visibility(conn, room.view, after, in_batch)
        prev_member = None
        if f.type == MEMBER and before is not None:
            prev_member = before.state.get(MEMBER, {}).get(str(f.state_key))
        kept = held[e.event_id].stream if e.event_id in held else 0  # a de-outliered event keeps its ordering
        group = after.id if after is not None else None
        held[e.event_id] = Held(False, f.depth, kept, group, f.membership)
        return _EventState(group, stored_visibility(f.type, f.state_key, vis_after, vis_before), prev_member)

    async def _resolved(
        self, conn: AsyncConnection[Any], view: RoomView, candidates: list[int], groups: StatePlan | None
    ) -> Group | None:
        """The state of groups ``candidates`` (in order of preference) taken together: the one group, or
        their resolution (stored as a group); None for no group."""
        group_ids = list(dict.fromkeys(candidates))
        if not group_ids:
            return None
        if len(group_ids) == 1:  # a linear history: most often the group just stored
            return self.states.cached(group_ids[0]) or await self.states.load(conn, view.room_id, group_ids[0])
        loaded = await self.states.load_many(conn, view.room_id, group_ids)
        inputs = [loaded[g] for g in group_ids]
        resolved = await self.resolver(view.room_id, view.room_version, [g.state for g in inputs])
        return await self.states.store_state(conn, view.room_id, inputs[0], resolved, groups, inputs)

    @staticmethod
    async def _visibility(
        conn: AsyncConnection[Any], view: RoomView, group: Group | None, batch: Mapping[str, NewEvent]
    ) -> HistoryVisibility:
        """The history visibility in force in ``group``'s state (``shared`` without one)."""
        if group is None:
            return "shared"
        event_id = group.state.get(HISTORY_VISIBILITY, {}).get("")
        if event_id is None:
            return "shared"
        known = view.visibilities.get(event_id)
        if known is not None:
            return known
        if event_id in batch:
            value = parse_history_visibility(batch[event_id].event.get("content"))
        else:
            cur = await conn.execute(_HV_JSON, {"ids": [event_id]})
            row = await cur.fetchone()
            value = parse_history_visibility(parse_event_json(bytes(row[1])).get("content")) if row else "shared"
        view.visibilities[event_id] = value
        return value

    async def _room_after(
        self,
        room: RoomWrite,
        ordered: Sequence[NewEvent],
        rows: Sequence[EventRow],
        has_children: set[str],
        memberships: Mapping[str, str | None],
        derived: Mapping[int, tuple[int, Delta]],
        groups: StatePlan | None,
    ) -> RoomAfter:
        """The forward extremities and the current state after the batch (``derived``: the groups the
        batch made from others by a change; the current state's change is composed from them when it
        can be, without comparing whole states)."""
        view = room.view
        extremities = _extremities_after(view, ordered, rows, has_children)
        ranked = sorted((-d, -s, g) for d, s, g in extremities.values() if g is not None)
        new = await self._resolved(room.conn, view, [int(g) for _, _, g in ranked], groups)
        if new is None or new.id == view.current:
            return RoomAfter(extremities, view.current, [], [], [])
        old_state: State = {}
        if view.current is not None:
            old_state = (await self.states.load(room.conn, view.room_id, int(view.current))).state
        changed = _changes_between(view.current, new.id, old_state, derived)
        sets: list[CurrentStateRow] = []
        drops: list[tuple[str, str]] = []
        deltas: list[StateDelta] = []
        unknown: set[str] = set()  # member events whose membership the batch does not know
        for event_type, keys in sorted((diff(old_state, new.state) if changed is None else changed).items()):
            for state_key, event_id in sorted(keys.items()):
                deltas.append(StateDelta(event_type, state_key, event_id, old_state.get(event_type, {}).get(state_key)))
                if event_id is None:
                    drops.append((event_type, state_key))
                    continue
                membership = memberships.get(event_id) if event_type == MEMBER else None
                if event_type == MEMBER and membership is None:
                    unknown.add(event_id)
                sets.append(CurrentStateRow(event_type, state_key, event_id, membership))
        if unknown:
            cur = await room.conn.execute(_MEMBERSHIPS, {"ids": sorted(unknown)})
            found = {str(r[0]): r[1] for r in await cur.fetchall()}
            sets = [
                msgspec.structs.replace(s, membership=found.get(s.event_id)) if s.event_id in unknown else s
                for s in sets
            ]
        return RoomAfter(extremities, new.id, sets, drops, deltas)


def _memberships(in_batch: Mapping[str, NewEvent], held: Mapping[str, Held]) -> dict[str, str | None]:
    """The membership of each member event the batch knows: its own, then those held."""
    memberships: dict[str, str | None] = {eid: e.fields.membership for eid, e in in_batch.items()}
    for eid, h in held.items():
        if h.membership is not None:
            memberships.setdefault(eid, h.membership)
    return memberships


def _redacted_in_batch(
    ordered: Sequence[NewEvent], in_batch: Mapping[str, NewEvent], targets: Mapping[str, str | None]
) -> dict[str, str]:
    """``event -> the batch's first redaction of it``, for the batch's events other than create events
    (``targets``: the event each redaction of the batch redacts, if it names one)."""
    out: dict[str, str] = {}
    for e in ordered:
        target = targets.get(e.event_id)
        victim = in_batch.get(target) if target else None
        if victim is not None and victim.fields.type != CREATE and target not in out:
            out[victim.event_id] = e.event_id
    return out


def _row(
    e: NewEvent,
    state: _EventState | None,
    memberships: Mapping[str, str | None],
    targets: Mapping[str, str | None],
    redacted_by: Mapping[str, str],
    held: Mapping[str, Held],
) -> EventRow:
    f = e.fields
    prev_member = state.prev_member if state is not None else None
    prev_membership = memberships.get(prev_member) if prev_member is not None else None
    h = held.get(e.event_id)
    return EventRow(
        event_id=e.event_id,
        stream=h.stream if h is not None else 0,
        depth=f.depth,
        type=f.type,
        state_key=f.state_key,
        sender=f.sender,
        ts=f.origin_server_ts,
        outlier=e.outlier,
        state_group=state.group if state is not None else None,
        visibility=state.visibility if state is not None else "shared",
        membership=f.membership,
        prev_membership=prev_membership,
        prev_member_event=prev_member if prev_member is not None and prev_membership is None else None,
        redacts=targets.get(e.event_id),
        relates_to=f.relates_to,
        redacted_by=redacted_by.get(e.event_id),
    )


def _extremities_after(
    view: RoomView, ordered: Sequence[NewEvent], rows: Sequence[EventRow], has_children: set[str]
) -> Extremities:
    """The room's forward extremities after the batch: its events replace their prev_events, but for
    those that already have children (400 when none would be left: a cycle through held events)."""
    extremities = dict(view.extremities)
    by_id = {r.event_id: r for r in rows}
    for i, e in enumerate(e for e in ordered if not e.outlier):
        for p in e.fields.prev_events:
            extremities.pop(p, None)
        if e.event_id not in has_children:
            r = by_id[e.event_id]
            extremities[e.event_id] = (e.fields.depth, r.stream or _PROVISIONAL + i, r.state_group)
    if not extremities:
        raise InvalidEvent(
            f"events: the batch would leave room {view.room_id} without a latest event: each of its events is "
            f"already a prev_event of a stored event, and the room's latest are its prev_events (a cycle)"
        )
    return extremities


def _changes_between(
    old: int | None, new: int, old_state: State, derived: Mapping[int, tuple[int, Delta]]
) -> dict[str, dict[str, str | None]] | None:
    """``diff(old's state, new's state)`` composed from the changes that made ``new`` from ``old`` in this
    batch; None when ``new`` was not made from ``old`` that way."""
    chain: list[Delta] = []
    gid = new
    while gid != old:
        step = derived.get(gid)
        if step is None or len(chain) > len(derived):
            return None
        gid, change = step
        chain.append(change)
    composed: dict[str, dict[str, str | None]] = {}
    for change in reversed(chain):
        for event_type, keys in change.items():
            composed.setdefault(event_type, {}).update(keys)
    return {
        t: real
        for t, keys in composed.items()
        if (real := {k: v for k, v in keys.items() if old_state.get(t, {}).get(k) != v})
    }
