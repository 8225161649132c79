"""Persisting a batch of events of one room in one transaction: the events plugin's write path.

Every write, local or remote, ends here (:meth:`Persister.persist`). In one transaction, under the
room's row lock (and, in this process, the room's asyncio lock, so a room's batches queue here rather
than in PostgreSQL):

1. lock the room (create its row when a remote batch brings its create event or its version);
2. read what is already held of the batch's events and of their prev_events: an event stored with the
   same bytes is skipped, with other bytes the batch is refused (409, the first kept), and so is an ID
   that comes twice in the batch with other bytes (the same bytes twice are stored once); an event
   held as an outlier and now sent normally is *de-outliered*. References never cross rooms: a
   prev_event held in another room refuses the batch (400), and a redaction applies only to an event
   of its own room (one of another room is stored, never applied); a room has one create event (a
   second, or one with prev_events, refuses the batch: 400);
   a batch that would leave the room without forward extremities is refused (400: its events and
   those already stored form a cycle, which IDs given beside events can make);
3. order the batch so that prev_events come first, then per event: the state before it (its
   prev_events' states; several different ones are resolved by the ``resolve_state`` hook or the
   default resolver; none: the empty state, which has a group like any state), the state after it
   (a new state group for a state event), its history visibility, the membership change;
4. reserve the stream IDs as late as possible (events-semantics §2: an early reservation holds
   readers back), from the ``events`` stream, or the ``backfill`` stream for backfilled batches;
5. write the events, their JSON as received, edges, memberships, redactions; the forward extremities
   (replaced), the backward extremities (prev_events not held); the current state and its deltas;
   the room's last event and write count.

A writer keeps its view of each room it writes (forward extremities, current state group, history
visibility values) in memory, valid while the room's ``writes`` count is the one it last wrote; a
batch written by anyone else (a previous owner of the shard) makes it reload.
"""

from __future__ import annotations

import asyncio
import contextlib
import heapq
import time
from collections import OrderedDict
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import msgspec
import psycopg
from psycopg import AsyncConnection

from factstream import HostApi, Transaction
from factstream_events.canonical import parse_event_json
from factstream_events.combine import Writes
from factstream_events.errors import EventConflict, InvalidEvent, UnknownRoom
from factstream_events.prune import KNOWN_ROOM_VERSIONS, redacts_target
from factstream_events.rows import (
    BACKFILL_STREAM,
    STATE_ALL_THRESHOLD,
    STREAM,
    BackfillRow,
    EventRowData,
    EventsRow,
    StateRowData,
    ev_row,
    state_all_row,
    state_row,
)
from factstream_events.statemath import Delta, State, diff
from factstream_events.statestore import HASH_INDEX, Group, StatePlan, StateStore
from factstream_events.validate import CREATE, HISTORY_VISIBILITY, MEMBER, NEVER_SHOWN, REDACTION, EventFields
from factstream_events.visibility import HistoryVisibility, parse_history_visibility, stored_visibility

_encode_json = msgspec.json.Encoder().encode

#: ``async (room_id, room_version, states in order of preference) -> the state``.
Resolver = Callable[[str, str, Sequence[State]], Awaitable[State]]


@dataclass(frozen=True, slots=True)
class NewEvent:
    """One event to persist: its ID, the bytes to keep, the parsed JSON and its indexed fields."""

    event_id: str
    raw: bytes
    event: Mapping[str, Any]
    fields: EventFields
    outlier: bool = False


@dataclass(frozen=True, slots=True)
class Persisted:
    """What a batch did: the events stored now (in stream order) and those already held."""

    stored: list[str]
    duplicates: list[str]
    stream_ids: dict[str, int]


@dataclass(slots=True)
class _Held:
    """What the batch needs of an event already held (or stored earlier in the batch)."""

    outlier: bool
    depth: int
    stream: int
    state_group: int | None
    membership: str | None
    raw: bytes | None = None


@dataclass
class RoomView:
    """A writer's view of one room (see the module docstring)."""

    room_id: str
    room_version: str
    writes: int
    extremities: dict[str, tuple[int, int, int | None]]  # event_id -> (depth, stream, state_group)
    current: int | None
    visibilities: dict[str, HistoryVisibility] = field(default_factory=dict)


_LOCK_ROOM = "SELECT room_version, writes, current_state_group FROM rooms WHERE room_id = %(room_id)s FOR UPDATE"
_NEW_ROOM = """
INSERT INTO rooms (room_id, room_version, creator, is_local, created_ts)
VALUES (%(room_id)s, %(room_version)s, %(creator)s, %(is_local)s, %(ts)s)
ON CONFLICT (room_id) DO NOTHING
"""
_EXTREMITIES = """
SELECT e.event_id, e.topological_ordering, e.stream_ordering, e.state_group
FROM event_forward_extremities f JOIN events e ON e.event_id = f.event_id
WHERE f.room_id = %(room_id)s
"""
#: The bytes of a held event are read only for the batch's own events (compared with the bytes sent).
_HELD = """
SELECT e.event_id, e.room_id, e.outlier, e.topological_ordering, e.stream_ordering, e.state_group, e.membership,
       CASE WHEN e.event_id = ANY(%(batch)b::text[])
            THEN (SELECT j.json FROM event_json j WHERE j.event_id = e.event_id) END
FROM events e
WHERE e.event_id = ANY(%(ids)b::text[])
"""
_MEMBERSHIPS = "SELECT event_id, membership FROM events WHERE event_id = ANY(%(ids)b::text[])"
#: The room's create event (read only when a batch brings one the room does not hold).
_HELD_CREATE = """
SELECT event_id FROM events WHERE room_id = %(room_id)s AND type = 'm.room.create' AND state_key = '' LIMIT 1
"""
_HV_JSON = "SELECT event_id, json FROM event_json WHERE event_id = ANY(%(ids)b::text[])"
#: Those of a batch's events that already have children: an event not yet held (or held as an outlier)
#: that a stored event names among its prev_events is a backward extremity of the room until it is
#: persisted normally, so the room's backward extremities (a short list) answer it, not ``event_edges``.
_CHILDREN = """
SELECT event_id FROM event_backward_extremities WHERE room_id = %(room_id)s AND event_id = ANY(%(ids)b::text[])
"""
# A batch's rows go in one statement per table, as one JSON array of row objects (``%(rows)s``): one
# parameter to send, whatever the number of rows and columns. An event redacted before it arrived is
# redacted by the first such redaction (``redacted_by`` of the row: one in the same batch).
_INSERT_EVENTS = """
INSERT INTO events (event_id, room_id, stream_ordering, instance_name, topological_ordering, type, state_key,
    sender, origin_server_ts, received_ts, outlier, backfilled, state_group, visibility, membership,
    prev_membership, redacts, relates_to, redacted_by)
SELECT e.event_id, %(room_id)s, e.stream, %(instance)s, e.depth, e.type, e.state_key, e.sender, e.ts, %(received)s,
    e.outlier, %(backfilled)s, e.state_group, e.visibility, e.membership,
    COALESCE(e.prev_membership, (SELECT p.membership FROM events p WHERE p.event_id = e.prev_member_event)),
    e.redacts, e.relates_to,
    COALESCE(CASE WHEN e.type <> 'm.room.create' THEN (
        SELECT r.event_id FROM redactions r WHERE r.redacts = e.event_id AND r.room_id = %(room_id)s
        ORDER BY r.received_ts, r.event_id LIMIT 1) END, e.redacted_by)
FROM json_to_recordset(%(rows)s::json) AS e(event_id text, stream bigint, depth bigint, type text, state_key text,
    sender text, ts bigint, outlier boolean, state_group bigint, visibility text, membership text,
    prev_membership text, prev_member_event text, redacts text, relates_to text, redacted_by text)
"""
_DEOUTLIER = """
UPDATE events SET outlier = FALSE, state_group = %(state_group)s, visibility = %(visibility)s,
    prev_membership = COALESCE(%(prev_membership)s::text,
        (SELECT p.membership FROM events p WHERE p.event_id = %(prev_member_event)s::text)),
    redacted_by = COALESCE(redacted_by, %(redacted_by)s)
WHERE event_id = %(event_id)s
"""
_INSERT_JSON = """
INSERT INTO event_json (event_id, room_id, json)
SELECT j.event_id, %(room_id)s, j.json FROM unnest(%(event_id)b::text[], %(json)b::bytea[]) AS j(event_id, json)
"""
_INSERT_EDGES = """
INSERT INTO event_edges (event_id, prev_event_id, room_id)
SELECT g.e, g.p, %(room_id)s FROM json_to_recordset(%(rows)s::json) AS g(e text, p text)
ON CONFLICT DO NOTHING
"""
_INSERT_MEMBERSHIPS = """
INSERT INTO room_memberships (event_id, user_id, sender, room_id, membership, stream_ordering,
    topological_ordering, outlier)
SELECT m.event_id, m.state_key, m.sender, %(room_id)s, m.membership, m.stream, m.depth, m.outlier
FROM json_to_recordset(%(rows)s::json)
    AS m(event_id text, state_key text, sender text, membership text, stream bigint, depth bigint, outlier boolean)
ON CONFLICT (event_id) DO UPDATE SET outlier = EXCLUDED.outlier
"""
_INSERT_REDACTION = """
INSERT INTO redactions (event_id, redacts, room_id, received_ts) VALUES (%(event_id)s, %(redacts)s, %(room_id)s, %(ts)s)
ON CONFLICT (event_id) DO NOTHING
"""
_APPLY_REDACTION = """
UPDATE events SET redacted_by = %(event_id)s
WHERE event_id = %(redacts)s AND room_id = %(room_id)s AND redacted_by IS NULL AND type <> 'm.room.create'
"""
_INSERT_EX_OUTLIER = (
    "INSERT INTO ex_outlier_stream (stream_id, instance_name, event_id) VALUES (%(stream)s, %(instance)s, %(event_id)s)"
)
#: The room's forward extremities replaced by ``ids``: both parts of one statement (they see the same
#: snapshot: the delete keeps the rows the insert would meet).
_DROP_FORWARD = """
DELETE FROM event_forward_extremities WHERE room_id = %(room_id)s AND event_id <> ALL(%(ids)b::text[])
"""
_ADD_FORWARD = """
INSERT INTO event_forward_extremities (room_id, event_id) SELECT %(room_id)s, unnest(%(ids)b::text[])
ON CONFLICT DO NOTHING
"""
#: The unique keys a local batch written without looking first violates when one of its events is held.
_EVENT_KEYS = frozenset({"events_pkey", "event_json_pkey"})
_DROP_BACKWARD = """
DELETE FROM event_backward_extremities WHERE room_id = %(room_id)s AND event_id = ANY(%(ids)b::text[])
"""
_ADD_BACKWARD = """
INSERT INTO event_backward_extremities (room_id, event_id) SELECT %(room_id)s, unnest(%(ids)b::text[])
ON CONFLICT DO NOTHING
"""
_SET_STATE = """
INSERT INTO current_state_events (room_id, type, state_key, event_id, membership)
SELECT %(room_id)s, s.type, s.state_key, s.event_id, s.membership
FROM json_to_recordset(%(rows)s::json) AS s(type text, state_key text, event_id text, membership text)
ON CONFLICT (room_id, type, state_key) DO UPDATE SET event_id = EXCLUDED.event_id, membership = EXCLUDED.membership
"""
_DROP_STATE = """
DELETE FROM current_state_events WHERE room_id = %(room_id)s AND type = %(type)s AND state_key = %(state_key)s
"""
_STATE_DELTA = """
INSERT INTO current_state_delta_stream (stream_id, instance_name, room_id, type, state_key, event_id, prev_event_id)
SELECT %(stream)s, %(instance)s, %(room_id)s, d.t, d.k, d.e, d.p
FROM json_to_recordset(%(rows)s::json) AS d(t text, k text, e text, p text)
"""
_UPDATE_ROOM = """
UPDATE rooms SET writes = writes + 1, current_state_group = %(current)s,
    last_stream_ordering = COALESCE(%(last_stream)s, last_stream_ordering),
    last_event_id = COALESCE(%(last_event)s, last_event_id)
WHERE room_id = %(room_id)s
"""


@dataclass(frozen=True, slots=True)
class _Lookups:
    """What a batch reads before its work: held events, and those of its events that already have
    children (remote batches only). Earlier redactions of its events are read by the insert itself."""

    held: list[tuple[Any, ...]]
    children: set[str]


async def _send_lookups(
    conn: AsyncConnection[Any], room_id: str, ids: list[str], batch_ids: list[str], children: bool
) -> tuple[Any, Any]:
    """Send the lookups of a batch (in a pipeline: their results come with its sync)."""
    held = await conn.execute(_HELD, {"ids": ids, "batch": batch_ids})
    if not children:
        return held, None
    return held, await conn.execute(_CHILDREN, {"ids": batch_ids, "room_id": room_id})


async def _fetch_lookups(held: Any, children: Any) -> _Lookups:
    found = {str(r[0]) for r in await children.fetchall()} if children is not None else set()
    return _Lookups(await held.fetchall(), found)


class _Replan(Exception):
    """A batch's planned state group equals one already stored: persist the batch again, unplanned."""


class _Careful(Exception):
    """A local batch written without looking first found one of its events held already: persist it
    again, looking first."""


#: ``found`` of a local batch written without looking first (its events are new: hashes of content,
#: time and the room's current extremities); a held one fails its insert and makes it :class:`_Careful`.
_ASSUMED_NEW = _Lookups([], set())

#: ``(the event IDs a batch stores) -> one more write for its statement (SQL, parameters), or None``.
AlsoWrite = Callable[[Sequence[str]], "tuple[str, Mapping[str, Any]] | None"]


def _rows(rows: Sequence[Mapping[str, Any]]) -> str:
    """``rows`` as the JSON text ``json_to_recordset`` reads (keys it is not asked for are ignored)."""
    return _encode_json(rows).decode()


def now_ms() -> int:
    return int(time.time() * 1000)


def _room_version_of_create(event: Mapping[str, Any]) -> str:
    content = event.get("content")
    version = content.get("room_version", "1") if isinstance(content, dict) else "1"
    if not isinstance(version, str) or version not in KNOWN_ROOM_VERSIONS:
        raise InvalidEvent(f"content.room_version of the create event: unsupported room version {version!r}")
    return version


def _batch_order(batch: Sequence[NewEvent]) -> list[NewEvent]:
    """The batch with every event after the batch events it names as prev_events (depth, then given order)."""
    index = {e.event_id: i for i, e in enumerate(batch)}
    waiting = {e.event_id: sum(1 for p in e.fields.prev_events if p in index) for e in batch}
    children: dict[str, list[str]] = {}
    for e in batch:
        for p in e.fields.prev_events:
            if p in index:
                children.setdefault(p, []).append(e.event_id)
    ready = [(e.fields.depth, index[e.event_id]) for e in batch if waiting[e.event_id] == 0]
    heapq.heapify(ready)
    out: list[NewEvent] = []
    while ready:
        _, i = heapq.heappop(ready)
        event = batch[i]
        out.append(event)
        for child in children.get(event.event_id, ()):
            waiting[child] -= 1
            if waiting[child] == 0:
                heapq.heappush(ready, (batch[index[child]].fields.depth, index[child]))
    if len(out) != len(batch):
        cycle = sorted(e.event_id for e in batch if waiting[e.event_id] > 0)
        raise InvalidEvent(f"events: prev_events form a cycle among {', '.join(cycle[:5])}")
    return out


def _refuse_repeats_with_other_bytes(batch: Sequence[NewEvent]) -> None:
    """:class:`EventConflict` (409) when an ID comes twice in ``batch`` with other bytes, as it would across
    batches: which copy is the event cannot be decided, so nothing of the batch is stored."""
    first: dict[str, bytes] = {}
    for i, e in enumerate(batch):
        raw = first.setdefault(e.event_id, e.raw)
        if raw != e.raw:
            raise EventConflict(f"events[{i}]: event {e.event_id} comes twice in the batch with other content")


def _refuse_references_elsewhere(batch: Sequence[NewEvent], room_id: str, elsewhere: Mapping[str, str]) -> None:
    """:class:`InvalidEvent` (400) naming the first ``prev_events`` entry of ``batch`` that is an event
    held in another room (``elsewhere``: event ID -> its room). An event's graph is its room's: a state,
    a visibility or a membership never comes from another room through it (the reference rejects such
    an event too)."""
    for i, e in enumerate(batch):
        for p in e.fields.prev_events:
            other = elsewhere.get(p)
            if other is not None:
                raise InvalidEvent(
                    f"events[{i}].prev_events: {p} is an event of room {other}, not {room_id}; an event's "
                    f"prev_events are events of its own room"
                )


def _is_create(e: NewEvent) -> bool:
    return e.fields.type == CREATE and e.fields.state_key == ""


async def _refuse_another_create(
    conn: AsyncConnection[Any], room_id: str, batch: Sequence[NewEvent], new: Sequence[NewEvent], held_room: bool
) -> None:
    """:class:`InvalidEvent` (400) for a create event (``m.room.create``, state key ``""``) among the
    batch's ``new`` events that has ``prev_events``, that is the batch's second, or that is not the create
    event the room already holds: a room has one create event, its first (the specification's first
    authorisation rule), and a second would replace the room's creator and version in its state."""
    creates = [e for e in new if _is_create(e)]
    if not creates:
        return
    where = {e.event_id: i for i, e in enumerate(batch)}
    the_one: str | None = creates[0].event_id
    if held_room:
        cur = await conn.execute(_HELD_CREATE, {"room_id": room_id})
        row = await cur.fetchone()
        the_one = the_one if row is None or str(row[0]) == the_one else None
    for e in creates:
        if e.event_id != the_one:
            raise InvalidEvent(
                f"events[{where[e.event_id]}].type: room {room_id} already has a create event; a room has one"
            )
        if e.fields.prev_events:
            raise InvalidEvent(f"events[{where[e.event_id]}].prev_events: a create event has none, the room's first")


#: Room views a writer keeps (a view is its room's forward extremities and history visibility values:
#: a few hundred bytes; an evicted one is read again, one query, when its room is next written).
MAX_ROOM_VIEWS = 10_000


class Persister:
    """The write path of one host process (module docstring)."""

    def __init__(
        self, host: HostApi, states: StateStore, resolver: Resolver, *, max_views: int = MAX_ROOM_VIEWS
    ) -> None:
        self.host = host
        self.states = states
        self.resolver = resolver
        #: ``room -> [its lock, the writes using or waiting for it]``: dropped when no write holds it.
        self._locks: dict[str, list[Any]] = {}
        #: The views of the rooms written last, least recently written first (at most ``max_views``).
        self._views: OrderedDict[str, RoomView] = OrderedDict()
        self.max_views = max_views

    @property
    def rooms_in_memory(self) -> tuple[int, int]:
        """``(room views kept, room locks held)``: bounded by ``max_views`` and by the writes under way."""
        return len(self._views), len(self._locks)

    @contextlib.asynccontextmanager
    async def _lock(self, room_id: str) -> AsyncIterator[None]:
        """The room's asyncio lock: a room's batches queue here, one at a time, rather than in PostgreSQL."""
        entry = self._locks.get(room_id)
        if entry is None:
            entry = self._locks[room_id] = [asyncio.Lock(), 0]
        entry[1] += 1
        try:
            async with entry[0]:
                yield
        finally:
            entry[1] -= 1
            if entry[1] == 0:
                del self._locks[room_id]

    async def _view(
        self, conn: AsyncConnection[Any], room_id: str, version: str, writes: int, current: int | None
    ) -> RoomView:
        view = self._views.get(room_id)
        if view is not None and view.writes == writes:
            self._views.move_to_end(room_id)
            return view
        cur = await conn.execute(_EXTREMITIES, {"room_id": room_id})
        extremities = {str(r[0]): (int(r[1]), int(r[2]), r[3]) for r in await cur.fetchall()}
        view = RoomView(room_id, version, writes, extremities, current)
        self._views[room_id] = view
        self._views.move_to_end(room_id)
        while len(self._views) > self.max_views:
            self._views.popitem(last=False)
        return view

    async def _visibility(
        self, conn: AsyncConnection[Any], view: RoomView, group: Group | None, batch: Mapping[str, NewEvent]
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

    async def persist(
        self,
        room_id: str,
        batch: Sequence[NewEvent],
        *,
        backfill: bool = False,
        local: bool = False,
        room_version: str | None = None,
    ) -> Persisted:
        """Persist ``batch`` (events of ``room_id``) in one transaction; see the module docstring.

        ``local``: the room must exist (or the batch starts with its create event); ``room_version``:
        for a remote batch of a room not held yet whose create event is not in the batch.
        """
        for e in batch:
            if e.fields.room_id != room_id:
                raise InvalidEvent(f"event {e.event_id}: room_id is {e.fields.room_id}, not {room_id}")
        _refuse_repeats_with_other_bytes(batch)

        batch_ids = [e.event_id for e in batch]
        wanted = list({p: None for e in batch for p in (e.event_id, *e.fields.prev_events)})

        async def attempt(plan: StatePlan | None) -> Persisted:
            async with self._room_transaction(room_id) as txn:
                conn = txn.conn
                async with conn.pipeline():  # the lock and the lookups (taken under it): one round trip
                    cur = await conn.execute(_LOCK_ROOM, {"room_id": room_id})
                    sent = await _send_lookups(conn, room_id, wanted, batch_ids, not local and not backfill)
                room = await cur.fetchone()
                found = await _fetch_lookups(*sent)
                return await self._persist(txn, room_id, room, batch, backfill, local, room_version, plan, found)

        return await self._attempts(room_id, lambda plan, _: attempt(plan))

    async def _attempts(
        self, room_id: str, attempt: Callable[[StatePlan | None, bool], Awaitable[Persisted]]
    ) -> Persisted:
        """``attempt(plan, optimistic)``: first with the batch's state groups planned (written in one
        statement) and, for a local batch, its lookups sent with its writes. If a planned state was
        already stored, or a local batch's event was held or redacted already, the transaction is
        rolled back and the batch persisted again: group by group, or looking first."""
        planned, optimistic = True, True
        while True:
            try:
                return await attempt(StatePlan(room_id) if planned else None, optimistic)
            except _Replan:
                if not planned:
                    raise
                planned = False
            except _Careful:
                if not optimistic:
                    raise
                optimistic = False

    @contextlib.asynccontextmanager
    async def _room_transaction(self, room_id: str) -> AsyncIterator[Transaction]:
        """A transaction under the room's asyncio lock; the room's view is dropped if it fails."""
        async with self._lock(room_id):
            try:
                async with self.host.database().transaction() as txn:
                    yield txn
            except BaseException:
                self._views.pop(room_id, None)
                raise

    async def _lock_room(self, conn: AsyncConnection[Any], room_id: str) -> tuple[Any, ...] | None:
        """The room's row, locked until the transaction ends (None: not held)."""
        async with conn.pipeline():  # with the transaction's BEGIN: one round trip
            cur = await conn.execute(_LOCK_ROOM, {"room_id": room_id})
        return await cur.fetchone()

    async def persist_local(
        self,
        room_id: str,
        build: Callable[[AsyncConnection[Any], RoomView | None, Group | None], Awaitable[Sequence[NewEvent]]],
        *,
        new_room_version: str | None = None,
        also: AlsoWrite | None = None,
    ) -> Persisted:
        """Persist the events ``build`` makes from the room's view and current state, under the room's lock.

        ``build`` picks prev_events and depth from what it is given, so no other write of the room
        can come in between. ``new_room_version``: the room is new (``build`` makes its create event).
        ``also``: one more write of the batch's statement (a transaction ID's claim); a unique violation
        in it fails the batch.
        """

        async def attempt(plan: StatePlan | None, optimistic: bool) -> Persisted:
            async with self._room_transaction(room_id) as txn:
                conn = txn.conn
                room = await self._lock_room(conn, room_id)
                view: RoomView | None = None
                current: Group | None = None
                if room is not None:
                    view = await self._view(conn, room_id, str(room[0]), int(room[1]), room[2])
                    if view.current is not None:
                        current = await self.states.load(conn, room_id, int(view.current))
                elif new_room_version is None:
                    raise UnknownRoom(f"room {room_id} is not known here")
                batch = await build(conn, view, current)
                version = new_room_version if room is None else None
                found = _ASSUMED_NEW if optimistic else None
                return await self._persist(txn, room_id, room, batch, False, True, version, plan, found, also)

        return await self._attempts(room_id, attempt)

    async def _persist(
        self,
        txn: Transaction,
        room_id: str,
        room: tuple[Any, ...] | None,
        batch: Sequence[NewEvent],
        backfill: bool,
        local: bool,
        room_version: str | None,
        plan: StatePlan | None,
        found: _Lookups | None = None,
        also: AlsoWrite | None = None,
    ) -> Persisted:
        """The batch's work inside ``txn``, which it commits; ``room`` is the room's row, already locked
        (None: not held).

        ``plan``: the batch's new state groups are written together (see ``statestore``); :class:`_Replan`
        when one of them was already stored. ``found``: the lookups of :func:`_send_lookups`, made with the
        lock (of the batch's events and every prev_event), or None to make them now. The writes go in one
        round trip with the ``COMMIT``: whatever must undo the batch fails its statement."""
        conn = txn.conn
        held_room = room is not None
        if room is None:
            create = next((e for e in batch if _is_create(e)), None)
            if create is None and (local or room_version is None):
                raise UnknownRoom(f"room {room_id} is not known here")
            version = _room_version_of_create(create.event) if create is not None else str(room_version)
            if version not in KNOWN_ROOM_VERSIONS:
                raise InvalidEvent(f"room_version: unsupported room version {version!r}")
            creator = create.fields.sender if create is not None else None
            await conn.execute(
                _NEW_ROOM,
                {"room_id": room_id, "room_version": version, "creator": creator, "is_local": local, "ts": now_ms()},
            )
            room = await self._lock_room(conn, room_id)
            assert room is not None
        view = await self._view(conn, room_id, str(room[0]), int(room[1]), room[2])

        batch_ids = [e.event_id for e in batch]
        wanted = set(batch_ids)
        for e in batch:
            wanted.update(e.fields.prev_events)
        held: dict[str, _Held] = {}
        for eid, (depth, stream, group) in view.extremities.items():
            held[eid] = _Held(False, depth, stream, group, None)
        batch_set = set(batch_ids)
        if found is None:
            lookup = [i for i in wanted if i not in held or i in batch_set]
            async with conn.pipeline():
                sent = await _send_lookups(conn, room_id, lookup, batch_ids, not local and not backfill)
            found = await _fetch_lookups(*sent)
        has_children = found.children
        elsewhere: dict[str, str] = {}
        for eid, other_room, outlier, depth, stream, group, membership, raw in found.held:
            if other_room != room_id:
                if eid in batch_set:
                    raise EventConflict(f"event {eid} is already stored in another room, {other_room}")
                elsewhere[str(eid)] = str(other_room)
                continue  # never a part of this room's graph (module docstring)
            held[str(eid)] = _Held(
                bool(outlier), int(depth), int(stream), group, membership, bytes(raw) if raw is not None else None
            )
        if elsewhere:
            _refuse_references_elsewhere(batch, room_id, elsewhere)

        todo: list[NewEvent] = []
        duplicates: list[str] = []
        seen: set[str] = set()
        for e in batch:
            if e.event_id in seen:
                continue  # the same bytes again (:func:`_refuse_repeats_with_other_bytes`): stored once
            seen.add(e.event_id)
            old = held.get(e.event_id)
            if old is None:
                todo.append(e)
                continue
            if old.raw is not None and old.raw != e.raw:
                raise EventConflict(f"event {e.event_id} is already stored with other content; the first is kept")
            if old.outlier and not e.outlier and not backfill:
                todo.append(e)  # de-outlier
            else:
                duplicates.append(e.event_id)
        if not todo:
            return Persisted([], duplicates, {})
        await _refuse_another_create(conn, room_id, batch, todo, held_room)
        ordered = _batch_order(todo)
        in_batch = {e.event_id: e for e in ordered}
        deoutliered = {e.event_id for e in ordered if e.event_id in held}
        rooms_version = view.room_version

        # -- state, visibility and membership per event ---------------------------------------------
        rows: list[dict[str, Any]] = []
        member_lookups: dict[str, str] = {}  # new event id -> the event id whose membership is the previous one
        derived: dict[int, tuple[int, Delta]] = {}  # group -> (the group it was made from, the change)
        backward: set[str] = set()
        for e in ordered:
            f = e.fields
            row: dict[str, Any] = {
                "event_id": e.event_id,
                "room_id": room_id,
                "depth": f.depth,
                "type": f.type,
                "state_key": f.state_key,
                "sender": f.sender,
                "ts": f.origin_server_ts,
                "outlier": e.outlier,
                "backfilled": backfill,
                "state_group": None,
                "visibility": "shared",
                "membership": f.membership,
                "prev_membership": None,
                "prev_member_event": None,  # the previous membership is this event's, when not known here
                "redacts": redacts_target(dict(e.event), rooms_version) if f.type == REDACTION else None,
                "relates_to": f.relates_to,
                "redacted_by": None,
            }
            rows.append(row)
            if e.outlier:
                continue
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
            group_ids = list(dict.fromkeys(g for _, _, g in prev_groups))
            before: Group | None
            if not group_ids:
                before = None
            elif len(group_ids) == 1:  # a linear history: most often the group just stored
                before = self.states.cached(group_ids[0]) or await self.states.load(conn, room_id, group_ids[0])
            else:
                groups = await self.states.load_many(conn, room_id, group_ids)
                inputs = [groups[g] for g in group_ids]
                resolved = await self.resolver(room_id, rooms_version, [g.state for g in inputs])
                before = await self.states.store_state(conn, room_id, inputs[0], resolved, plan, inputs)
            after = before
            if f.state_key is not None:
                change = {f.type: {f.state_key: e.event_id}}
                after = await self.states.store(conn, room_id, before, change, plan)
                if after is not before and before is not None:
                    derived[after.id] = (before.id, change)
            elif after is None:  # the empty state is a state: only outliers have none
                after = await self.states.empty(conn, room_id, plan)
            vis_before = await self._visibility(conn, view, before, in_batch)
            vis_after = vis_before if after is before else await self._visibility(conn, view, after, in_batch)
            row["visibility"] = stored_visibility(f.type, f.state_key, vis_after, vis_before)
            row["state_group"] = after.id if after is not None else None
            if f.type == MEMBER and before is not None:
                prev_member = before.state.get(MEMBER, {}).get(str(f.state_key))
                if prev_member is not None:
                    member_lookups[e.event_id] = prev_member
            kept = held[e.event_id].stream if e.event_id in held else 0  # a de-outliered event keeps its ordering
            held[e.event_id] = _Held(False, f.depth, kept, row["state_group"], f.membership)

        # previous memberships: from the batch or what is held, else read by the statement writing the row
        memberships = {eid: e.fields.membership for eid, e in in_batch.items()}
        for eid, h in held.items():
            if h.membership is not None:
                memberships.setdefault(eid, h.membership)
        by_id = {r["event_id"]: r for r in rows}
        for eid, prev in member_lookups.items():
            known = memberships.get(prev)
            by_id[eid]["prev_membership"] = known
            if known is None:
                by_id[eid]["prev_member_event"] = prev

        # redactions in the batch (an earlier one, stored, comes first: read by the insert)
        for row in rows:
            target = by_id.get(row["redacts"]) if row["redacts"] else None
            if target is not None and target["redacted_by"] is None and target["type"] != CREATE:
                target["redacted_by"] = row["event_id"]

        # -- forward extremities and current state (their state rows go out with the first new ID) -----
        advance: _Advance | None = None
        if not backfill and any(not e.outlier for e in ordered):
            advance = await self._advance(conn, view, ordered, rows, held, has_children, memberships, plan, derived)

        # -- stream IDs, as late as possible --------------------------------------------------------
        instance = self.host.instance_name
        new_rows = [r for r in rows if r["event_id"] not in deoutliered]
        re_rows = [r for r in rows if r["event_id"] in deoutliered]
        ex_ids: list[int] = []
        if backfill:
            backfill_writer = self.host.stream(BACKFILL_STREAM, BackfillRow)
            ids = await backfill_writer.reserve(
                txn,
                [
                    BackfillRow(r["event_id"], room_id, r["type"], r["state_key"], r["redacts"], r["relates_to"])
                    for r in new_rows
                ],
            )
            for r, sid in zip(new_rows, ids, strict=True):
                r["stream"] = sid
        else:
            writer = self.host.stream(STREAM, EventsRow)
            per_id = [[ev_row(self._ev_data(r))] for r in new_rows]
            per_id += [[ev_row(self._ev_data(r, outlier=False))] for r in re_rows]
            if advance is not None and advance.deltas:
                if len(advance.deltas) >= STATE_ALL_THRESHOLD:
                    per_id[0].append(state_all_row(room_id))
                else:
                    per_id[0] += [state_row(StateRowData(room_id, t, k, e)) for t, k, e, _ in advance.deltas]
            ids = await writer.reserve_groups(txn, per_id)
            for r, sid in zip(new_rows, ids[: len(new_rows)], strict=True):
                r["stream"] = sid
            ex_ids = ids[len(new_rows) :]
        received = now_ms()
        for r in new_rows:
            r["instance"] = instance
            r["received"] = received

        # -- writing: one round trip -----------------------------------------------------------------
        current = advance.current if advance is not None else view.current
        last_stream = None
        last_event = None
        shown = [r for r in new_rows + re_rows if not r["outlier"] and not backfill and r["type"] not in NEVER_SHOWN]
        if shown:
            top = max(shown, key=lambda r: held_stream(r, held))
            last_stream, last_event = held_stream(top, held), top["event_id"]
        ids_of = {"room_id": room_id}
        # The rare writes (row by row, or read back) go first; every other write of the batch is a part
        # of one statement (``combine``), which also answers the check of an optimistic local batch.
        writes = Writes()
        if new_rows:
            params = {"room_id": room_id, "instance": instance, "received": received, "backfilled": backfill}
            writes.add(_INSERT_EVENTS, {**params, "rows": _rows(new_rows)})
            fresh = [e for e in ordered if e.event_id not in deoutliered]
            writes.add(
                _INSERT_JSON, {**ids_of, "event_id": [e.event_id for e in fresh], "json": [e.raw for e in fresh]}
            )
        edges = [{"e": e.event_id, "p": p} for e in ordered if not e.outlier for p in e.fields.prev_events]
        if edges:
            writes.add(_INSERT_EDGES, {**ids_of, "rows": _rows(edges)})
        members = [dict(r, stream=held_stream(r, held)) for r in rows if r["membership"] is not None]
        if members:
            writes.add(_INSERT_MEMBERSHIPS, {**ids_of, "rows": _rows(members)})
        normal = [e for e in ordered if not e.outlier]
        if normal and not local:
            writes.add(_DROP_BACKWARD, {**ids_of, "ids": [e.event_id for e in normal]})
        if backward:
            writes.add(_ADD_BACKWARD, {**ids_of, "ids": sorted(backward)})
        writes.add(
            _UPDATE_ROOM, {"room_id": room_id, "current": current, "last_stream": last_stream, "last_event": last_event}
        )
        redactions = [r for r in rows if r["redacts"]]
        applied = [
            {"event_id": r["event_id"], "redacts": r["redacts"], "room_id": room_id}
            for r in redactions
            if r["redacts"] not in by_id
        ]
        new_groups = self.states.planned(plan) if plan is not None else None
        if new_groups is not None:
            writes.add(*new_groups)
        extra = also([r["event_id"] for r in rows]) if also is not None else None
        if extra is not None:
            writes.add(*extra)
        rare = bool(re_rows or redactions or (advance is not None and advance.drops))
        try:
            async with contextlib.AsyncExitStack() as stack:
                if rare:
                    await stack.enter_async_context(conn.pipeline())  # the rare writes, the statement, COMMIT
                c = await stack.enter_async_context(conn.cursor())
                for r in re_rows:
                    await c.execute(_DEOUTLIER, r)
                for r, sid in zip(re_rows, ex_ids, strict=True):
                    await c.execute(
                        _INSERT_EX_OUTLIER, {"stream": sid, "instance": instance, "event_id": r["event_id"]}
                    )
                if redactions:
                    await c.executemany(
                        _INSERT_REDACTION,
                        [
                            {"event_id": r["event_id"], "redacts": r["redacts"], "room_id": room_id, "ts": received}
                            for r in redactions
                        ],
                    )
                    if applied:
                        await c.executemany(_APPLY_REDACTION, applied)
                if advance is not None:
                    await self._write_advance(c, writes, view, advance, rows, held, ids[0] if ids else 0, instance)
                sql, values = writes.statement()
                await txn.execute_and_commit(sql, values)
        except psycopg.errors.UniqueViolation as exc:
            key = exc.diag.constraint_name
            if plan is not None and new_groups is not None and key == HASH_INDEX:
                self.states.conflicted(plan)
                raise _Replan(f"a state of room {room_id} planned by the batch is already stored") from None
            if found is _ASSUMED_NEW and key in _EVENT_KEYS:
                raise _Careful(f"room {room_id}: an event of the local batch is already held") from None
            raise
        if plan is not None and new_groups is not None:
            self.states.settled(plan)
        view.writes += 1  # the room's row is locked: the count read with it, plus this batch
        view.current = current
        stream_ids = {r["event_id"]: held_stream(r, held) for r in rows}
        return Persisted([r["event_id"] for r in rows], duplicates, stream_ids)

    @staticmethod
    def _ev_data(r: Mapping[str, Any], outlier: bool | None = None) -> EventRowData:
        return EventRowData(
            r["event_id"],
            r["room_id"],
            r["type"],
            r["state_key"],
            r["redacts"],
            r["relates_to"],
            r["membership"],
            False,
            r["outlier"] if outlier is None else outlier,
        )

    async def _advance(
        self,
        conn: AsyncConnection[Any],
        view: RoomView,
        ordered: Sequence[NewEvent],
        rows: Sequence[dict[str, Any]],
        held: dict[str, _Held],
        has_children: set[str],
        memberships: Mapping[str, str | None],
        plan: StatePlan | None,
        derived: Mapping[int, tuple[int, Delta]],
    ) -> _Advance:
        """The forward extremities and the current state after the batch (written by :meth:`_write_advance`).

        ``has_children``: the batch's events that already had children when it started (remote batches);
        ``derived``: the groups the batch made from others by a change (the current state's change is
        composed from them when it can be: no comparison of whole states)."""
        room_id = view.room_id
        by_id = {r["event_id"]: r for r in rows}
        normal = [e for e in ordered if not e.outlier]
        extremities = dict(view.extremities)
        #: New events rank after every held one, in batch order, until their IDs are known.
        provisional = 1 << 62
        for i, e in enumerate(normal):
            for p in e.fields.prev_events:
                extremities.pop(p, None)
            if e.event_id not in has_children:
                r = by_id[e.event_id]
                kept = held[e.event_id].stream if held[e.event_id].stream else provisional + i
                extremities[e.event_id] = (e.fields.depth, kept, r["state_group"])
        if not extremities:
            raise InvalidEvent(
                f"events: the batch would leave room {room_id} without a latest event: each of its events is "
                f"already a prev_event of a stored event, and the room's latest are its prev_events (a cycle)"
            )
        ranked = sorted((-d, -s, g) for d, s, g in extremities.values() if g is not None)
        group_ids = list(dict.fromkeys(int(g) for _, _, g in ranked))
        if not group_ids:
            return _Advance(extremities, view.current, [], [], [])
        groups = await self.states.load_many(conn, room_id, group_ids)
        if len(group_ids) == 1:
            new = groups[group_ids[0]]
        else:
            inputs = [groups[g] for g in group_ids]
            resolved = await self.resolver(room_id, view.room_version, [g.state for g in inputs])
            new = await self.states.store_state(conn, room_id, inputs[0], resolved, plan, inputs)
        if new.id == view.current:
            return _Advance(extremities, view.current, [], [], [])
        old_state: State = {}
        if view.current is not None:
            old_state = (await self.states.load(conn, room_id, int(view.current))).state
        sets: list[dict[str, Any]] = []
        drops: list[dict[str, Any]] = []
        deltas: list[tuple[str, str, str | None, str | None]] = []
        changed = _changes_between(view.current, new.id, old_state, derived)
        for event_type, keys in sorted((diff(old_state, new.state) if changed is None else changed).items()):
            for state_key, event_id in sorted(keys.items()):
                key = {"room_id": room_id, "type": event_type, "state_key": state_key}
                deltas.append((event_type, state_key, event_id, old_state.get(event_type, {}).get(state_key)))
                if event_id is None:
                    drops.append(key)
                else:
                    membership = memberships.get(event_id) if event_type == MEMBER else None
                    sets.append({**key, "event_id": event_id, "membership": membership})
        missing = [s["event_id"] for s in sets if s["type"] == MEMBER and s["membership"] is None]
        if missing:
            cur = await conn.execute(_MEMBERSHIPS, {"ids": missing})
            found = {str(r[0]): r[1] for r in await cur.fetchall()}
            for s in sets:
                if s["type"] == MEMBER and s["membership"] is None:
                    s["membership"] = found.get(s["event_id"])
        return _Advance(extremities, new.id, sets, drops, deltas)

    async def _write_advance(
        self,
        c: Any,
        writes: Writes,
        view: RoomView,
        advance: _Advance,
        rows: Sequence[dict[str, Any]],
        held: dict[str, _Held],
        first_stream: int,
        instance: str,
    ) -> None:
        room_id = view.room_id
        by_id = {r["event_id"]: r for r in rows}
        extremities = {
            eid: (d, held_stream(by_id[eid], held) if eid in by_id else s, g)
            for eid, (d, s, g) in advance.extremities.items()
        }
        forward = {"room_id": room_id, "ids": list(extremities)}
        writes.add(_DROP_FORWARD, forward)
        writes.add(_ADD_FORWARD, forward)
        view.extremities = extremities
        if advance.sets:
            writes.add(_SET_STATE, {"room_id": room_id, "rows": _rows(advance.sets)})
        if advance.drops:
            await c.executemany(_DROP_STATE, advance.drops)  # before the statement: other keys than the sets
        if advance.deltas:
            deltas = [{"t": t, "k": k, "e": e, "p": p} for t, k, e, p in advance.deltas]
            params = {"room_id": room_id, "stream": first_stream, "instance": instance, "rows": _rows(deltas)}
            writes.add(_STATE_DELTA, params)


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


@dataclass(frozen=True, slots=True)
class _Advance:
    """A batch's effect on the room's ends and current state, computed before its IDs are reserved."""

    extremities: dict[str, tuple[int, int, int | None]]
    current: int | None
    sets: list[dict[str, Any]]
    drops: list[dict[str, Any]]
    deltas: list[tuple[str, str, str | None, str | None]]


def held_stream(row: Mapping[str, Any], held: Mapping[str, _Held]) -> int:
    """The stream ordering of a batch row: reserved now, or kept from its outlier days."""
    if "stream" in row:
        return int(row["stream"])
    return held[row["event_id"]].stream if row["event_id"] in held else 0
