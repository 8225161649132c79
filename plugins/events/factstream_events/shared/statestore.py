"""State groups in PostgreSQL: loading the state of a group, storing a new one (see ``statemath``).

A load walks the base links of the groups asked for (of any number of rooms) in one recursive query
that stops at the groups this process already holds, then replays each group's deltas on one working
copy from the oldest down, copying a type's map only the first time it changes after a snapshot. A
group asked for is kept in an LRU bounded by the number of state entries held, and so are the groups
on the walk that are bases of later groups (positions multiple of
:data:`~factstream_events.rules.statemath.BRANCHING`) when the walks they can spare are worth the copy their
snapshot costs (:func:`_worth_keeping`).

Groups are immutable, so the cache never needs invalidating; a group another process wrote is simply
loaded on first use.

**Batches** store their groups through a :class:`StatePlan`: each new group gets an ID at once (from a
block of ``state_group_id_seq`` values this process holds) and is usable by the rest of the batch, and
:meth:`StateStore.planned` gives the insert of all of them, a part of the batch's one statement. If one
of their hashes is already stored in the room (an identical state stored earlier, which the batch would
have to reuse), the room's unique index on the hash fails the statement, so nothing of the batch is
written or committed; the writer tells :meth:`StateStore.conflicted` and persists the batch again
without a plan, group by group as :meth:`StateStore.store` does alone (the room's lock makes the check
and the insert one step: no one else stores the room's groups meanwhile).
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from psycopg import AsyncConnection

from factstream_events.rules.statemath import (
    BRANCHING,
    EMPTY_HASH,
    EMPTY_STATE,
    Delta,
    State,
    apply_delta,
    base_position,
    decode_delta,
    diff,
    encode_delta,
    state_size,
    updated_hash,
)

#: The state entries the cache may hold (a 10,000-member room's state is 10,000 entries).
DEFAULT_CACHE_ENTRIES = 1_000_000

#: The base walks of several groups at once, each group once (``UNION``: walks that meet share the
#: rest). The walk carries only the links, so that ``UNION`` compares two numbers, not the deltas;
#: the rows are then read by key (``= ANY(ARRAY(...))``: a join there is planned as a scan of the table).
_WALK = """
WITH RECURSIVE walk(id, base) AS (
    SELECT id, base FROM state_groups WHERE id = ANY(%(ids)b::bigint[])
  UNION
    SELECT g.id, g.base FROM walk w JOIN state_groups g ON g.id = w.base
    WHERE w.base <> ALL(%(stop)s::bigint[])
)
SELECT id, base, position, hash, delta, CASE WHEN id = ANY(%(ids)b::bigint[]) THEN room_id END
FROM state_groups WHERE id = ANY(ARRAY(SELECT id FROM walk))
"""
_INSERT = """
INSERT INTO state_groups (id, room_id, parent, base, position, size, hash, delta)
VALUES (nextval('state_group_id_seq'), %(room_id)s, %(parent)s, %(base)s, %(position)s, %(size)s, %(hash)s, %(delta)s)
ON CONFLICT (room_id, hash) DO NOTHING
RETURNING id
"""
_PARENTS = "SELECT id, parent FROM state_groups WHERE id = ANY(%(ids)s)"
_SAME = "SELECT id, position, base FROM state_groups WHERE room_id = %(room_id)s AND hash = %(hash)s"
_INSERT_PLANNED = """
INSERT INTO state_groups (id, room_id, parent, base, position, size, hash, delta)
SELECT g.id, %(room_id)s, g.parent, g.base, g.position, g.size, g.hash, g.delta
FROM unnest(%(id)b::bigint[], %(parent)b::bigint[], %(base)b::bigint[], %(position)b::bigint[], %(size)b::bigint[],
    %(hash)b::bytea[], %(delta)b::bytea[]) AS g(id, parent, base, position, size, hash, delta)
"""
#: The unique index a planned group violates when its state is already stored in the room.
HASH_INDEX = "state_groups_room_hash"
_RESERVE_IDS = "SELECT nextval('state_group_id_seq') FROM generate_series(1, %(n)s)"
#: State group IDs a process reserves at a time for planned groups.
ID_BLOCK = 64


async def _walk(conn: AsyncConnection[Any], group_ids: list[int], stop: list[int]) -> list[tuple[Any, ...]]:
    """The rows of :data:`_WALK`, in binary (the deltas as sent, not as hex text: a quarter of the time).

    ``stop`` goes as the text of an array literal: for the few hundred groups a busy room keeps cached,
    half the time psycopg takes to dump a list of ints in binary.
    """
    text = "{" + ",".join(map(str, stop)) + "}"
    async with conn.cursor(binary=True) as cur:
        await cur.execute(_WALK, {"ids": group_ids, "stop": text})
        return await cur.fetchall()


def _worth_keeping(position: int, state: State) -> bool:
    """Whether a group passed on a walk is kept (with its own copy of the maps the walk changes next).

    A group at a multiple of ``BRANCHING**k`` (k >= 1) is the base of later groups and spares a later
    walk up to ``BRANCHING**(k + 1)`` changes; it is kept when that is at least the size of the state
    its snapshot costs a copy of: in a room of 10,000 members only every 4,096th group is, in a room of
    200 every 16th.
    """
    if position % BRANCHING:
        return False
    spared = BRANCHING * BRANCHING
    while position % spared == 0 and spared <= position:
        spared *= BRANCHING
    return spared >= state_size(state)


def _lowest_positions(
    links: Mapping[int, tuple[int | None, int, bytes, bytes]],
    deltas: Mapping[int, Delta],
    held: Mapping[int, Group],
    wanted: set[tuple[str, str]],
) -> dict[tuple[str, str], int]:
    """For each key of ``wanted`` that a walk's deltas or held states mention: the lowest position that
    mentions it. A walk that gets below it cannot meet the key any more (positions fall along a walk)."""
    lowest: dict[tuple[str, str], int] = {}
    for gid, delta in deltas.items():
        position = links[gid][1]
        for event_type, changes in delta.items():
            for state_key in changes:
                key = (event_type, state_key)
                if key in wanted and position < lowest.get(key, position + 1):
                    lowest[key] = position
    for group in held.values():
        for key in wanted:
            if key[1] in group.state.get(key[0], {}) and group.position < lowest.get(key, group.position + 1):
                lowest[key] = group.position
    return lowest


class StateGroupError(LookupError):
    """A state group that does not exist, or is not of the room that asks for it."""


def _check_room(group_id: int, group_room: str, room_id: str) -> None:
    """A room's reads and writes load only its own groups: a state never crosses rooms, even through a
    row that names another room's group (the writer never stores one; this makes it an error, not a leak)."""
    if group_room != room_id:
        raise StateGroupError(f"state group {group_id} is of room {group_room}, not {room_id}")


@dataclass(frozen=True, slots=True)
class Group:
    """A state group: its ID, position on its lineage, multiset hash and the whole state."""

    id: int
    room_id: str
    position: int
    hash: bytes
    state: State


@dataclass(frozen=True, slots=True)
class StoreStats:
    """What storing groups cost: groups written, entries in their deltas, bytes of the deltas."""

    groups: int
    entries: int
    bytes: int


@dataclass
class StatePlan:
    """The groups one batch stores, written together by :meth:`StateStore.flush` (module docstring)."""

    room_id: str
    rows: list[tuple[int, int | None, int | None, int, int, bytes, bytes]] = field(default_factory=list)
    by_hash: dict[bytes, Group] = field(default_factory=dict)
    entries: int = 0


class StateStore:
    """Loads and stores state groups for one process; safe to share between rooms and tasks."""

    def __init__(self, max_entries: int = DEFAULT_CACHE_ENTRIES) -> None:
        self.max_entries = max_entries
        self._cache: OrderedDict[int, Group] = OrderedDict()
        self._held = 0
        self._by_room: dict[str, set[int]] = {}
        #: id -> (base, position) of every group seen: immutable, small.
        self._links: dict[int, tuple[int | None, int]] = {}
        self.groups_written = 0
        self.entries_written = 0
        self.bytes_written = 0
        self.loads = 0
        self.rows_read = 0
        self._free_ids: list[int] = []

    def stats(self) -> StoreStats:
        return StoreStats(self.groups_written, self.entries_written, self.bytes_written)

    # -- the cache ---------------------------------------------------------------------------------

    def cached(self, group_id: int) -> Group | None:
        group = self._cache.get(group_id)
        if group is not None:
            self._cache.move_to_end(group_id)
        return group

    def _keep(self, group: Group) -> None:
        if group.id in self._cache:
            self._cache.move_to_end(group.id)
            return
        self._cache[group.id] = group
        self._by_room.setdefault(group.room_id, set()).add(group.id)
        self._held += max(1, state_size(group.state))
        while self._held > self.max_entries and len(self._cache) > 1:
            _, old = self._cache.popitem(last=False)
            self._held -= max(1, state_size(old.state))
            room = self._by_room.get(old.room_id)
            if room is not None:
                room.discard(old.id)

    # -- loading -----------------------------------------------------------------------------------

    async def load(self, conn: AsyncConnection[Any], room_id: str, group_id: int) -> Group:
        """The state group ``group_id`` of ``room_id``; :class:`StateGroupError` if it does not exist."""
        hit = self.cached(group_id)
        if hit is not None:
            _check_room(group_id, hit.room_id, room_id)
            return hit
        return (await self.load_groups(conn, {room_id: [group_id]}))[group_id]

    async def load_many(self, conn: AsyncConnection[Any], room_id: str, group_ids: list[int]) -> dict[int, Group]:
        """:meth:`load` for several groups of one room, in one query."""
        return await self.load_groups(conn, {room_id: group_ids})

    async def load_groups(self, conn: AsyncConnection[Any], wanted: Mapping[str, Iterable[int]]) -> dict[int, Group]:
        """The groups of ``wanted`` (room ID -> group IDs), those not cached read in one query.

        The query walks every missing group's base links at once, stopping at the groups of those
        rooms this process holds; each state is then replayed from the nearest held state (or the
        empty state) on one working copy (module docstring). :class:`StateGroupError` if a group does
        not exist.
        """
        out: dict[int, Group] = {}
        missing: dict[int, str] = {}
        for room_id, ids in wanted.items():
            for gid in ids:
                hit = self.cached(gid)
                if hit is not None:
                    _check_room(hit.id, hit.room_id, room_id)
                    out[gid] = hit
                else:
                    missing[gid] = room_id
        if not missing:
            return out
        self.loads += len(missing)
        links, held = await self._walked(conn, missing)
        # Lowest position first: a group asked for that is an ancestor of another is replayed (and held)
        # before it, never found already held by its own replay.
        for gid in sorted(missing, key=lambda g: links[g][1]):
            out[gid] = self._replay(gid, missing[gid], links, held)
        return out

    async def _walked(
        self, conn: AsyncConnection[Any], missing: Mapping[int, str]
    ) -> tuple[dict[int, tuple[int | None, int, bytes, bytes]], dict[int, Group]]:
        """The base walks of the groups of ``missing`` (group ID -> the room asking for it) in one query,
        stopping at the groups held of those rooms: their links and the held groups met.
        :class:`StateGroupError` for a group that does not exist or is not of the room asking for it."""
        stop = [g for room_id in set(missing.values()) for g in self._by_room.get(room_id, ())]
        rows = await _walk(conn, list(missing), stop)
        links, held = self._links_of(rows)
        if held is None:  # a group the walk stopped at was evicted meanwhile: walk to the empty state
            rows = await _walk(conn, list(missing), [])
            links, held = self._links_of(rows)
            assert held is not None
        self.rows_read += len(rows)
        rooms = {int(r[0]): r[5] for r in rows if r[5] is not None}
        for gid, room_id in missing.items():
            if gid not in links:
                raise StateGroupError(f"state group {gid} of {room_id} does not exist")
            _check_room(gid, rooms[gid], room_id)
        return links, held

    async def parents(self, conn: AsyncConnection[Any], group_ids: Iterable[int]) -> dict[int, int | None]:
        """The parent of each group (the state it changed: for a state event's own group, the state
        before the event; None for a group changed from the empty state)."""
        cur = await conn.execute(_PARENTS, {"ids": list(group_ids)})
        return {int(g): None if p is None else int(p) for g, p in await cur.fetchall()}

    async def entries(self, conn: AsyncConnection[Any], asks: Sequence[tuple[str, int, str, str]]) -> list[str | None]:
        """For each ``(room_id, group_id, type, state_key)``: the event at that key in the group's state
        (None: the state has no such key).

        One key of a state, not the whole of it: a group not held is not replayed (and not kept), its
        base walk's deltas are read (in one query for all, as :meth:`load_groups` does) and searched,
        newest first, for the key.
        """
        out: list[str | None] = [None] * len(asks)
        pending: list[int] = []
        for i, (room_id, gid, event_type, state_key) in enumerate(asks):
            hit = self.cached(gid)
            if hit is not None:
                _check_room(gid, hit.room_id, room_id)
                out[i] = hit.state.get(event_type, {}).get(state_key)
            else:
                pending.append(i)
        if not pending:
            return out
        links, held = await self._walked(conn, {asks[i][1]: asks[i][0] for i in pending})
        deltas = {gid: decode_delta(link[3]) for gid, link in links.items()}
        wanted = {(asks[i][2], asks[i][3]) for i in pending}
        lowest = _lowest_positions(links, deltas, held, wanted)
        for i in pending:
            _, gid, event_type, state_key = asks[i]
            floor = lowest.get((event_type, state_key), -1)
            link: int | None = gid if floor >= 0 else None  # -1: nothing down the walks has the key
            while link is not None:
                if link in held:
                    out[i] = held[link].state.get(event_type, {}).get(state_key)
                    break
                if link not in links:
                    raise StateGroupError(f"state group {link} of {asks[i][0]} does not exist")
                base, position, _, _ = links[link]
                if position < floor:
                    break  # no delta down the walk, and no held state, has the key: not in the state
                changes = deltas[link].get(event_type)
                if changes is not None and state_key in changes:
                    out[i] = changes[state_key]  # None: removed
                    break
                link = base
        return out

    def _links_of(
        self, rows: Sequence[tuple[Any, ...]]
    ) -> tuple[dict[int, tuple[int | None, int, bytes, bytes]], dict[int, Group] | None]:
        """The walk's rows by group ID, and the held groups it stopped at (None if one is gone: the
        replay must not depend on a group the cache may evict while it runs, so they are taken now)."""
        links: dict[int, tuple[int | None, int, bytes, bytes]] = {}
        for gid, base, position, digest, blob, _ in rows:
            link = (None if base is None else int(base), int(position), bytes(digest), bytes(blob))
            links[int(gid)] = link
            self._links[int(gid)] = link[:2]
        held: dict[int, Group] = {}
        for base, *_ in links.values():
            if base is not None and base not in links:
                group = self._cache.get(base)
                if group is None:
                    return links, None
                held[base] = group
        return links, held

    def _replay(
        self,
        group_id: int,
        room_id: str,
        links: Mapping[int, tuple[int | None, int, bytes, bytes]],
        held: dict[int, Group],
    ) -> Group:
        """The state of ``group_id``: its deltas from the nearest held state (or the empty one) replayed
        up the walk; the groups worth keeping on the way are kept, and added to ``held``."""
        chain: list[int] = []
        start: State = EMPTY_STATE
        gid: int | None = group_id
        while gid is not None:
            known = held.get(gid)
            if known is not None:
                start = known.state
                break
            chain.append(gid)
            gid = links[gid][0]
        work: dict[str, Any] = dict(start)
        owned: set[str] = set()
        result: Group | None = None
        for gid in reversed(chain):
            _, position, digest, blob = links[gid]
            delta = decode_delta(blob)
            for event_type, changes in delta.items():
                if event_type not in owned:
                    work[event_type] = dict(work.get(event_type, {}))
                    owned.add(event_type)
                inner = work[event_type]
                inner.update(changes)
                if None in changes.values():  # removals
                    for state_key, event_id in changes.items():
                        if event_id is None:
                            del inner[state_key]
                if not inner:
                    del work[event_type]
                    owned.discard(event_type)
            if gid == group_id or _worth_keeping(position, work):
                group = Group(gid, room_id, position, digest, dict(work))
                owned.clear()  # the snapshot shares the maps: the next change copies them again
                self._keep(group)
                held[gid] = group
                result = group
        assert result is not None and result.id == group_id
        return result

    # -- storing -----------------------------------------------------------------------------------

    async def _ancestor(self, conn: AsyncConnection[Any], parent: Group, position: int) -> Group | None:
        """The group at ``position`` on ``parent``'s base walk (None for position 0, the empty state)."""
        if position == 0:
            return None
        gid: int | None = parent.id
        while gid is not None:
            link = self._links.get(gid)
            if link is None:
                await self.load(conn, parent.room_id, gid)
                link = self._links[gid]
            base, pos = link
            if pos == position:
                return await self.load(conn, parent.room_id, gid)
            if pos < position:
                break
            gid = base
        raise StateGroupError(f"state group {parent.id} has no ancestor at position {position} on its base walk")

    async def store(
        self,
        conn: AsyncConnection[Any],
        room_id: str,
        parent: Group | None,
        change: Delta,
        plan: StatePlan | None = None,
        same: Sequence[Group] = (),
    ) -> Group:
        """The group whose state is ``parent``'s changed by ``change`` (an existing one if equal).

        With a ``plan``, a new group is only planned (its insert is :meth:`planned`); ``same``: groups known
        to be stored whose state the result may equal (the states a fork was resolved from).
        """
        before = parent.state if parent is not None else EMPTY_STATE
        state = apply_delta(before, change)
        digest = updated_hash(parent.hash if parent is not None else EMPTY_HASH, before, change)
        if parent is not None and digest == parent.hash:
            return parent
        for known in same:
            if known.hash == digest:
                return known
        if plan is not None and digest in plan.by_hash:
            return plan.by_hash[digest]
        position = (parent.position if parent is not None else 0) + 1
        base_pos = base_position(position)
        if parent is None or base_pos == parent.position:
            base = parent
            # the change itself, less what it sets to the value already there (not a walk of the state)
            delta: Mapping[str, Mapping[str, str | None]] = {
                t: real
                for t, keys in change.items()
                if (real := {k: v for k, v in keys.items() if before.get(t, {}).get(k) != v})
            }
        else:
            base = await self._ancestor(conn, parent, base_pos)
            delta = diff(base.state if base is not None else EMPTY_STATE, state)
        blob = encode_delta(delta)
        if plan is not None:
            gid = await self._new_id(conn)
            parent_id = parent.id if parent is not None else None
            base_id = base.id if base is not None else None
            plan.rows.append((gid, parent_id, base_id, position, state_size(state), digest, blob))
            plan.entries += sum(len(c) for c in delta.values())
            self._links[gid] = (base_id, position)
            group = Group(gid, room_id, position, digest, state)
            plan.by_hash[digest] = group
            self._keep(group)
            return group
        params = {
            "room_id": room_id,
            "parent": parent.id if parent is not None else None,
            "base": base.id if base is not None else None,
            "position": position,
            "size": state_size(state),
            "hash": digest,
            "delta": blob,
        }
        cur = await conn.execute(_INSERT, params)
        row = await cur.fetchone()
        if row is None:  # an identical state exists: use it
            cur = await conn.execute(_SAME, {"room_id": room_id, "hash": digest})
            found = await cur.fetchone()
            assert found is not None
            gid, position, found_base = int(found[0]), int(found[1]), found[2]
            self._links.setdefault(gid, (None if found_base is None else int(found_base), position))
        else:
            gid = int(row[0])
            self._links[gid] = (base.id if base is not None else None, position)
            self.groups_written += 1
            self.entries_written += sum(len(c) for c in delta.values())
            self.bytes_written += len(blob)
        group = Group(gid, room_id, position, digest, state)
        self._keep(group)
        return group

    async def empty(self, conn: AsyncConnection[Any], room_id: str, plan: StatePlan | None = None) -> Group:
        """The room's group of the empty state: the state of an event whose ``prev_events`` hold no state
        here (none held, or none given), which is a state like any other, not an outlier's lack of one.

        Position 0, no parent, no base, an empty delta; stored once per room (its hash, that of the empty
        state, is unique in the room), when an event first needs it. Its children base their deltas on it
        as on any group. With a ``plan``, a new one is only planned (as :meth:`store` does).
        """
        if plan is not None and EMPTY_HASH in plan.by_hash:
            return plan.by_hash[EMPTY_HASH]
        cur = await conn.execute(_SAME, {"room_id": room_id, "hash": EMPTY_HASH})
        found = await cur.fetchone()
        if found is not None:
            gid, position, base = int(found[0]), int(found[1]), found[2]
            self._links.setdefault(gid, (None if base is None else int(base), position))
            group = Group(gid, room_id, position, EMPTY_HASH, EMPTY_STATE)
            self._keep(group)
            return group
        blob = encode_delta({})
        if plan is not None:
            gid = await self._new_id(conn)
            plan.rows.append((gid, None, None, 0, 0, EMPTY_HASH, blob))
        else:
            params = {"room_id": room_id, "parent": None, "base": None, "position": 0, "size": 0}
            cur = await conn.execute(_INSERT, {**params, "hash": EMPTY_HASH, "delta": blob})
            row = await cur.fetchone()
            assert row is not None  # none was stored: the room's lock is held
            gid = int(row[0])
            self.groups_written += 1
            self.bytes_written += len(blob)
        self._links[gid] = (None, 0)
        group = Group(gid, room_id, 0, EMPTY_HASH, EMPTY_STATE)
        if plan is not None:
            plan.by_hash[EMPTY_HASH] = group
        self._keep(group)
        return group

    async def store_state(
        self,
        conn: AsyncConnection[Any],
        room_id: str,
        parent: Group | None,
        state: State,
        plan: StatePlan | None = None,
        same: Sequence[Group] = (),
    ) -> Group:
        """The group holding ``state``, stored as a change of ``parent`` (a resolved fork's state)."""
        change = diff(parent.state if parent is not None else EMPTY_STATE, state)
        return await self.store(conn, room_id, parent, change, plan, same)

    async def _new_id(self, conn: AsyncConnection[Any]) -> int:
        if not self._free_ids:
            cur = await conn.execute(_RESERVE_IDS, {"n": ID_BLOCK})
            self._free_ids = sorted((int(r[0]) for r in await cur.fetchall()), reverse=True)
        return self._free_ids.pop()

    def planned(self, plan: StatePlan) -> tuple[str, dict[str, Any]] | None:
        """The insert of ``plan``'s groups (SQL and parameters; None: no group), to run in the batch's
        statement; then :meth:`settled` once it committed, or :meth:`conflicted` if it failed on
        :data:`HASH_INDEX`."""
        if not plan.rows:
            return None
        ids, parents, bases, positions, sizes, hashes, deltas = (list(c) for c in zip(*plan.rows, strict=True))
        params = {
            "room_id": plan.room_id, "id": ids, "parent": parents, "base": bases, "position": positions,
            "size": sizes, "hash": hashes, "delta": deltas,
        }  # fmt: skip
        return _INSERT_PLANNED, params

    def settled(self, plan: StatePlan) -> None:
        """``plan``'s groups are stored: count them."""
        self.groups_written += len(plan.rows)
        self.entries_written += plan.entries
        self.bytes_written += sum(len(r[6]) for r in plan.rows)

    def conflicted(self, plan: StatePlan) -> None:
        """``plan``'s insert failed on :data:`HASH_INDEX`: none of its groups exists; forget them."""
        for group in plan.by_hash.values():
            self._drop(group.id)

    def _drop(self, group_id: int) -> None:
        group = self._cache.pop(group_id, None)
        if group is not None:
            self._held -= max(1, state_size(group.state))
            room = self._by_room.get(group.room_id)
            if room is not None:
                room.discard(group_id)
        self._links.pop(group_id, None)

    def forget(self) -> None:
        """Drop every cached state (tests; a process under memory pressure)."""
        self._cache.clear()
        self._by_room.clear()
        self._held = 0
