"""Persisting a batch of events of one room in one transaction: the events plugin's write path.

Every write, local or remote, ends here, under the room's lock (:meth:`Persister.room`): a value of
:class:`LockedRoom` proves its holder has the room's asyncio lock (a room's batches queue here, one at
a time, rather than in PostgreSQL). A write is then, in one transaction (:meth:`LockedRoom._attempt`):

1. **open the room**: lock its row, or create it when the batch brings its create event (a remote batch
   may give the version of a room whose create event it lacks); the writer's view of the room
   (``room``);
2. **what is held**: of the batch's events and of their prev_events, and which of the batch's events
   already have children (``batch``): an event stored with the same bytes is skipped, with other bytes
   the batch is refused (409, the first kept); an event held as an outlier and now sent normally is
   *de-outliered*; references never cross rooms (400); a room has one create event (400);
3. **plan**: state, visibility, memberships and redactions per event, the room's extremities and current
   state after the batch (``plan``: everything is computed before anything is written);
4. **reserve** the stream IDs, as late as possible (an early reservation holds readers back), from the
   ``events`` stream, or the ``backfill`` stream for backfilled batches;
5. **write**: one step per table (``steps``), in one round trip with the ``COMMIT``;
6. **remember** the room's view after the batch.

A write has up to three attempts (:class:`Attempt`): the batch's new state groups are first planned
(written in its one statement) and a local batch first writes without looking for its events (they are
new: hashes of content, time and the room's extremities). If a planned state was already stored, or a
local batch's event was held already, the statement fails, the transaction is rolled back and the batch
is written again: group by group, or looking first.
"""

from __future__ import annotations

import contextlib
import enum
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from dataclasses import dataclass, replace
from typing import Any

import psycopg
from psycopg import AsyncConnection

from factstream import HostApi, Transaction
from factstream_events.rules.errors import EventConflict, UnknownRoom
from factstream_events.shared.clock import now_ms
from factstream_events.shared.rows import (
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
from factstream_events.shared.sharding import refuse_misdirected
from factstream_events.shared.statestore import HASH_INDEX, StatePlan, StateStore
from factstream_events.write import steps
from factstream_events.write.batch import (
    Held,
    NewEvent,
    Persisted,
    batch_order,
    check_batch,
    is_create,
    refuse_another_create,
    refuse_references_elsewhere,
    room_version_of_create,
    triage,
)
from factstream_events.write.create import EventCreator, LocalWrite, Txn
from factstream_events.write.plan import BatchPlan, EventRow, Planner, Resolver
from factstream_events.write.room import (
    LOCK_ROOM,
    RoomLocks,
    RoomRow,
    RoomView,
    RoomViews,
    RoomWrite,
    create_room_row,
    lock_room,
)

__all__ = ["LocalWrite", "LockedRoom", "NewEvent", "Origin", "Persisted", "Persister", "RoomView"]

#: ``(the event IDs a batch stores) -> one more write for its statement (SQL, parameters), or None``.
#: ``async (the room a local batch is written to) -> the batch``: called again when the batch is.

#: Room views a writer keeps (a view is its room's forward extremities and history visibility values:
#: a few hundred bytes; an evicted one is read again, one query, when its room is next written).
MAX_ROOM_VIEWS = 10_000


class Origin(enum.Enum):
    """Where a batch comes from: this server (``LOCAL``), another (``REMOTE``), or another's history
    fetched backwards (``BACKFILL``: new stream IDs count down; the room's ends and state stay)."""

    LOCAL = "local"
    REMOTE = "remote"
    BACKFILL = "backfill"


@dataclass(frozen=True, slots=True)
class Attempt:
    """How a batch is written this time (module docstring)."""

    #: The batch's new state groups are planned and written in its one statement (else one by one).
    plan_groups: bool = True
    #: What is held of the batch is read before writing (False: a local batch's first attempt).
    look_first: bool = True


@dataclass(frozen=True, slots=True)
class _Reserved:
    """The stream IDs a batch reserved: all of them (the first goes to its state rows), and those of the
    rows of ``ex_outlier_stream``."""

    all: list[int]
    ex_outlier: list[int]

    @property
    def first(self) -> int:
        return self.all[0] if self.all else 0


class TryAgain(Exception):
    """The batch's statement failed in a way :attr:`attempt` avoids: write the batch again that way."""

    def __init__(self, attempt: Attempt, reason: str) -> None:
        super().__init__(reason)
        self.attempt = attempt


#: The unique keys a local batch written without looking first violates when one of its events is held.
_EVENT_KEYS = frozenset({"events_pkey", "event_json_pkey"})
#: Held events, with their bytes when they are the batch's own (compared with the bytes sent).
_HELD = """
SELECT e.event_id, e.room_id, e.outlier, e.topological_ordering, e.stream_ordering, e.state_group, e.membership,
       CASE WHEN e.event_id = ANY(%(batch)b::text[])
            THEN (SELECT j.json FROM event_json j WHERE j.event_id = e.event_id) END
FROM events e
WHERE e.event_id = ANY(%(ids)b::text[])
"""
#: Those of a batch's events that already have children: an event not yet held (or held as an outlier)
#: that a stored event names among its prev_events is a backward extremity of the room until it is
#: persisted normally, so the room's backward extremities (a short list) answer it, not ``event_edges``.
_CHILDREN = """
SELECT event_id FROM event_backward_extremities WHERE room_id = %(room_id)s AND event_id = ANY(%(ids)b::text[])
"""


@dataclass(frozen=True, slots=True)
class _Lookups:
    """The reads of :func:`_send_lookups`: held events (rows of :data:`_HELD`), and those of the batch's
    events that already have children (remote batches only)."""

    held: list[tuple[Any, ...]]
    children: set[str]


async def _send_lookups(
    conn: AsyncConnection[Any], room_id: str, batch: Sequence[NewEvent], ids: Sequence[str], children: bool
) -> Awaitable[_Lookups]:
    """Send the lookups of ``batch`` (of ``ids``: its events and their prev_events; ``children``: and
    which of its events have children) without waiting: in a pipeline their results come with its
    sync. Await the returned value for the :class:`_Lookups`."""
    batch_ids = [e.event_id for e in batch]
    held = await conn.execute(_HELD, {"ids": list(ids), "batch": batch_ids})
    having = await conn.execute(_CHILDREN, {"ids": batch_ids, "room_id": room_id}) if children else None

    async def fetch() -> _Lookups:
        found = {str(r[0]) for r in await having.fetchall()} if having is not None else set()
        return _Lookups(await held.fetchall(), found)

    return fetch()


def _wanted(batch: Sequence[NewEvent]) -> list[str]:
    """The batch's events and their prev_events, each once."""
    return list({p: None for e in batch for p in (e.event_id, *e.fields.prev_events)})


class Persister:
    """The write path of one host process (module docstring)."""

    def __init__(
        self,
        host: HostApi,
        states: StateStore,
        resolver: Resolver,
        creator: EventCreator,
        *,
        max_views: int = MAX_ROOM_VIEWS,
    ) -> None:
        self.host = host
        self.states = states
        self.creator = creator
        self.planner = Planner(states, resolver)
        self._locks = RoomLocks()
        self._views = RoomViews(max_views)

    @property
    def max_views(self) -> int:
        return self._views.max_views

    @max_views.setter
    def max_views(self, value: int) -> None:
        self._views.max_views = value

    @property
    def rooms_in_memory(self) -> tuple[int, int]:
        """``(room views kept, room locks held)``: bounded by ``max_views`` and by the writes under way."""
        return len(self._views), len(self._locks)

    @contextlib.asynccontextmanager
    async def room(self, room_id: str) -> AsyncIterator[LockedRoom]:
        """The room's lock, held until the block ends: its writes go through the value. Only the room's
        writer gets it (``sharding.refuse_misdirected``: every write path passes here)."""
        refuse_misdirected(self.host, room_id)
        async with self._locks.hold(room_id):
            yield LockedRoom(self, room_id)

    async def persist(
        self,
        room_id: str,
        batch: Sequence[NewEvent],
        *,
        origin: Origin = Origin.REMOTE,
        room_version: str | None = None,
    ) -> Persisted:
        """Persist ``batch`` (complete events of ``room_id``) under the room's lock; see
        :meth:`LockedRoom.persist`."""
        async with self.room(room_id) as room:
            return await room.persist(batch, origin=origin, room_version=room_version)

    async def persist_local(self, room_id: str, write: LocalWrite) -> Persisted:
        """Persist the local ``write`` under the room's lock; see :meth:`LockedRoom.persist_local`."""
        async with self.room(room_id) as room:
            return await room.persist_local(write)


async def _retried(first: Attempt, once: Callable[[Attempt], Awaitable[Persisted]]) -> Persisted:
    """``once(attempt)`` until it does not ask to try again (a ``TryAgain`` carries the next attempt)."""
    attempt = first
    while True:
        try:
            return await once(attempt)
        except TryAgain as again:
            attempt = again.attempt


class LockedRoom:
    """A room whose lock its holder has (:meth:`Persister.room`): its writes, one at a time."""

    def __init__(self, persister: Persister, room_id: str) -> None:
        self._p = persister
        self.room_id = room_id

    async def persist(
        self, batch: Sequence[NewEvent], *, origin: Origin = Origin.REMOTE, room_version: str | None = None
    ) -> Persisted:
        """Persist ``batch``, complete events received in any order.

        ``room_version``: for a batch of a room not held yet whose create event is not in the batch."""
        check_batch(self.room_id, batch)
        return await _retried(Attempt(), lambda attempt: self._persist_given(batch, origin, room_version, attempt))

    async def persist_local(self, write: LocalWrite) -> Persisted:
        """Persist the local ``write``: its drafts are built from the room as it is (its forward
        extremities, its current state), so no other write of the room comes in between; its claim of a
        transaction ID, if any, is a part of the batch's statement (a unique violation fails the batch)."""
        return await _retried(Attempt(look_first=False), lambda attempt: self._persist_built(write, attempt))

    @contextlib.asynccontextmanager
    async def _transaction(self) -> AsyncIterator[Transaction]:
        """A transaction of the room; the room's view is dropped if it fails."""
        try:
            async with self._p.host.database().transaction() as txn:
                yield txn
        except BaseException:
            self._p._views.drop(self.room_id)
            raise

    async def _persist_given(
        self, batch: Sequence[NewEvent], origin: Origin, room_version: str | None, attempt: Attempt
    ) -> Persisted:
        """One attempt at a given batch: the room's row is locked with the batch's lookups (one round trip)."""
        async with self._transaction() as txn:
            conn = txn.conn
            async with conn.pipeline():
                cur = await conn.execute(LOCK_ROOM, {"room_id": self.room_id})
                lookups = await _send_lookups(conn, self.room_id, batch, _wanted(batch), origin is Origin.REMOTE)
            row = await cur.fetchone()
            found = await lookups
            room = await self._open(txn, row, batch, origin, room_version)
            return await self._attempt(room, batch, origin, attempt, found, None)

    async def _persist_built(self, write: LocalWrite, attempt: Attempt) -> Persisted:
        """One attempt at a local batch: its drafts are built from the room once its row is locked."""
        async with self._transaction() as txn:
            row = await lock_room(txn.conn, self.room_id)
            if row is None and write.new_room_version is None:
                raise UnknownRoom(f"room {self.room_id} is not known here")
            base = await self._base(txn, row, write.new_room_version)
            batch = list(write.events) + await self._p.creator.build(base, write.drafts)
            room = base if row is not None else await self._open(txn, None, batch, Origin.LOCAL, None)
            return await self._attempt(room, batch, Origin.LOCAL, attempt, None, write.txn)

    async def _base(self, txn: Transaction, row: RoomRow | None, new_room_version: str | None) -> RoomWrite:
        """What a local batch is built on: the room with its current state; or, for a room not created
        yet, an empty view of ``new_room_version``."""
        if row is None:
            return RoomWrite(txn, RoomView(self.room_id, str(new_room_version), 0, {}, None), held_before=False)
        view = await self._p._views.of(txn.conn, self.room_id, row)
        current = None
        if view.current is not None:
            current = await self._p.states.load(txn.conn, self.room_id, int(view.current))
        return RoomWrite(txn, view, held_before=True, current=current)

    async def _open(
        self, txn: Transaction, row: RoomRow | None, batch: Sequence[NewEvent], origin: Origin, version: str | None
    ) -> RoomWrite:
        """The room of the write, its row locked: created when the batch brings its create event (or, for
        a remote batch, its ``version``)."""
        held_before = row is not None
        if row is None:
            create = next((e for e in batch if is_create(e)), None)
            if create is None and (origin is Origin.LOCAL or version is None):
                raise UnknownRoom(f"room {self.room_id} is not known here")
            version = room_version_of_create(create.event) if create is not None else str(version)
            creator = create.fields.sender if create is not None else None
            row = await create_room_row(txn.conn, self.room_id, version, creator, local=origin is Origin.LOCAL)
        view = await self._p._views.of(txn.conn, self.room_id, row)
        return RoomWrite(txn, view, held_before)

    async def _attempt(
        self,
        room: RoomWrite,
        batch: Sequence[NewEvent],
        origin: Origin,
        attempt: Attempt,
        found: _Lookups | None,
        claim: Txn | None,
    ) -> Persisted:
        """The batch's work in ``room``'s transaction, which it commits (module docstring)."""
        held, children = await self._held(room, batch, origin, attempt, found)
        sorted_out = triage(batch, held, origin is Origin.BACKFILL)
        if not sorted_out.todo:
            return Persisted([], sorted_out.duplicates, {})
        await refuse_another_create(room.conn, room.room_id, batch, sorted_out.todo, room.held_before)
        ordered = batch_order(sorted_out.todo)
        groups = StatePlan(room.room_id) if attempt.plan_groups else None
        backfill = origin is Origin.BACKFILL
        plan = await self._p.planner.plan(room, ordered, sorted_out.deoutliered, held, children, backfill, groups)
        plan, ids = await self._reserve(room, plan, origin)
        await self._write(room, plan, ordered, origin, attempt, groups, ids, claim)
        self._remember(room.view, plan)
        stream_ids = {r.event_id: r.stream for r in plan.rows}
        return Persisted([r.event_id for r in plan.rows], sorted_out.duplicates, stream_ids)

    async def _held(
        self, room: RoomWrite, batch: Sequence[NewEvent], origin: Origin, attempt: Attempt, found: _Lookups | None
    ) -> tuple[dict[str, Held], set[str]]:
        """What is held of the batch's events and their prev_events (the room's forward extremities are
        known from its view); and those of its events that already have children (remote batches).

        ``found``: the lookups made with the room's lock, or None to make them now (a local batch's
        first attempt makes none: its events are new)."""
        held = {
            eid: Held(False, depth, stream, group, None)
            for eid, (depth, stream, group) in room.view.extremities.items()
        }
        batch_ids = {e.event_id for e in batch}
        if found is None and attempt.look_first:
            ids = [i for i in _wanted(batch) if i not in held or i in batch_ids]
            async with room.conn.pipeline():
                lookups = await _send_lookups(room.conn, room.room_id, batch, ids, origin is Origin.REMOTE)
            found = await lookups
        if found is None:
            return held, set()
        elsewhere: dict[str, str] = {}
        for eid, other_room, outlier, depth, stream, group, membership, raw in found.held:
            if other_room != room.room_id:
                if eid in batch_ids:
                    raise EventConflict(f"event {eid} is already stored in another room, {other_room}")
                elsewhere[str(eid)] = str(other_room)
                continue  # never a part of this room's graph
            held[str(eid)] = Held(
                bool(outlier), int(depth), int(stream), group, membership, bytes(raw) if raw is not None else None
            )
        if elsewhere:
            refuse_references_elsewhere(batch, room.room_id, elsewhere)
        return held, found.children

    async def _reserve(self, room: RoomWrite, plan: BatchPlan, origin: Origin) -> tuple[BatchPlan, _Reserved]:
        """The batch's stream IDs, stamped on its plan; and every ID reserved. A backfilled batch's come
        from the ``backfill`` stream; the rows of the
        ``events`` stream tell readers of each event, and of the room's current state changes (with the
        batch's first ID)."""
        host, room_id, new_rows = self._p.host, room.room_id, plan.new_rows
        if origin is Origin.BACKFILL:
            backfill = host.stream(BACKFILL_STREAM, BackfillRow)
            rows = [BackfillRow(r.event_id, room_id, r.type, r.state_key, r.redacts, r.relates_to) for r in new_rows]
            ids = await backfill.reserve(room.txn, rows)
            return plan.stamped(ids), _Reserved(ids, [])
        per_id = [[ev_row(_event_data(room_id, r, r.outlier))] for r in new_rows]
        per_id += [[ev_row(_event_data(room_id, r, False))] for r in plan.deoutliered_rows]
        after = plan.after
        if after is not None and after.deltas:
            if len(after.deltas) >= STATE_ALL_THRESHOLD:
                per_id[0].append(state_all_row(room_id))
            else:
                per_id[0] += [state_row(StateRowData(room_id, d.type, d.state_key, d.event_id)) for d in after.deltas]
        ids = await host.stream(STREAM, EventsRow).reserve_groups(room.txn, per_id)
        return plan.stamped(ids[: len(new_rows)]), _Reserved(ids, ids[len(new_rows) :])

    async def _write(
        self,
        room: RoomWrite,
        plan: BatchPlan,
        ordered: Sequence[NewEvent],
        origin: Origin,
        attempt: Attempt,
        groups: StatePlan | None,
        ids: _Reserved,
        claim: Txn | None,
    ) -> None:
        """Write the batch, step by step (``steps``: one per table), and commit: one round trip."""
        instance, received, backfill = self._p.host.instance_name, now_ms(), origin is Origin.BACKFILL
        w = steps.BatchWrites(room.room_id)
        steps.events(w, plan, instance=instance, received=received, backfill=backfill)
        steps.event_json(w, plan, ordered)
        steps.deoutliered(w, plan, ids.ex_outlier, instance=instance)
        steps.edges(w, ordered)
        steps.memberships(w, plan)
        steps.redactions(w, plan, received=received)
        steps.backward_extremities(w, plan, ordered, local=origin is Origin.LOCAL)
        steps.room_row(w, plan, plan.after.current if plan.after else room.view.current, backfill=backfill)
        new_groups = self._p.states.planned(groups) if groups is not None else None
        if new_groups is not None:
            w.combined.add(*new_groups)
        if claim is not None:
            steps.txn_claim(w, plan, claim, received=received)
        if plan.after is not None:
            steps.forward_extremities(w, plan.after)
            steps.current_state(w, plan.after, stream=ids.first, instance=instance)
        try:
            await _send(room.txn, w)
        except psycopg.errors.UniqueViolation as exc:
            if new_groups is not None and groups is not None:
                self._p.states.conflicted(groups)  # the statement failed: none of its groups is stored
            raise _again(exc, attempt, room.room_id) from None
        if new_groups is not None and groups is not None:
            self._p.states.settled(groups)

    def _remember(self, view: RoomView, plan: BatchPlan) -> None:
        """The room's view after the batch: its row is locked, so its count is the one read, plus one."""
        view.writes += 1
        if plan.after is not None:
            view.extremities = plan.after.extremities
            view.current = plan.after.current


async def _send(txn: Transaction, w: steps.BatchWrites) -> None:
    """The batch's row-by-row writes, then its statement and the ``COMMIT``: one round trip."""
    conn = txn.conn
    sql, values = w.combined.statement()
    if not w.row_by_row:
        await txn.execute_and_commit(sql, values)
        return
    async with conn.pipeline(), conn.cursor() as c:
        for statement, rows in w.row_by_row:
            await c.executemany(statement, rows)
        await txn.execute_and_commit(sql, values)


def _again(exc: psycopg.errors.UniqueViolation, attempt: Attempt, room_id: str) -> BaseException:
    """The attempt that avoids ``exc``, as :class:`TryAgain`; else ``exc`` itself."""
    key = exc.diag.constraint_name
    if key == HASH_INDEX and attempt.plan_groups:
        return TryAgain(replace(attempt, plan_groups=False), f"a state of room {room_id} planned is already stored")
    if key in _EVENT_KEYS and not attempt.look_first:
        return TryAgain(replace(attempt, look_first=True), f"room {room_id}: an event of the local batch is held")
    return exc


def _event_data(room_id: str, r: EventRow, outlier: bool) -> EventRowData:
    return EventRowData(r.event_id, room_id, r.type, r.state_key, r.redacts, r.relates_to, r.membership, False, outlier)
