"""Reading events: for a user (visibility, redactions, ``unsigned.membership``) and for a server.

Every read for a user goes through :meth:`Reads.for_user`: the user's membership at each event comes
from the event's state group (the store computed the event's history visibility once, when it stored
it), the rules are ``factstream_events.rules.visibility``, and each event shown is served in the client
format (``factstream_events.shared.served``: the stored values, never re-encoded, less the federation-only
keys): pruned if redacted, ``unsigned.redacted_because`` telling the user only a redaction they may
read (:meth:`Reads.readable`), ``prev_content`` from the state before a state event. A server's read
(``/backfill``, ``/state?server=true``) is the federation format: the stored bytes, redacted events
pruned; ``raw=true`` is the stored bytes exactly.
"""

from __future__ import annotations

import heapq
from collections.abc import Collection, Sequence
from dataclasses import dataclass
from typing import Any, Literal

import msgspec
from psycopg import AsyncConnection

from factstream import HostApi, LruCache
from factstream_events.read.roomtokens import parse_token, writer_names
from factstream_events.rules.canonical import parse_event_json
from factstream_events.rules.errors import Forbidden, InvalidParam, UnknownEvent, UnknownRoom
from factstream_events.rules.prune import prune_event
from factstream_events.rules.statemath import StateMap, nest
from factstream_events.rules.tokens import (
    RoomToken,
    next_token,
    order_by,
    pagination_bounds,
)
from factstream_events.rules.validate import MEMBER, NEVER_SHOWN, REDACTION
from factstream_events.rules.visibility import Verdict, check_event
from factstream_events.shared.caches import (
    CLIENT_BODIES,
    MEMBER_AT_GROUP,
    MEMBER_EVENT_MEMBERSHIP,
    REPLACES_STATE,
    ROOM_VERSIONS,
)
from factstream_events.shared.clock import now_ms
from factstream_events.shared.served import (
    REDACTED_MARKER,
    ClientBody,
    client_body,
    client_event,
    federation_event,
    pruned_json,
)
from factstream_events.shared.statestore import StateStore
from factstream_events.shared.stored import COLUMNS, Row, fetch_binary, row_of, rows_by_id

MAX_PAGE = 1_000
DEFAULT_PAGE = 10

_JSON = "SELECT event_id, json FROM event_json WHERE event_id = ANY(%(ids)s)"
_ROOM_OF = "SELECT event_id, room_id FROM events WHERE event_id = ANY(%(ids)s)"
_MEMBERSHIP_OF = "SELECT event_id, membership FROM events WHERE event_id = ANY(%(ids)s)"
_ROOM = "SELECT room_version FROM rooms WHERE room_id = %(room_id)s"
_CURRENT_MEMBER = """
SELECT c.event_id, c.membership, e.topological_ordering, e.stream_ordering
FROM current_state_events c JOIN events e ON e.event_id = c.event_id
WHERE c.room_id = %(room_id)s AND c.type = 'm.room.member' AND c.state_key = %(user)s
"""
_CURRENT_STATE = "SELECT event_id FROM current_state_events WHERE room_id = %(room_id)s ORDER BY type, state_key"
_NEWEST = """
SELECT topological_ordering, stream_ordering FROM events
WHERE room_id = %(room_id)s AND NOT outlier ORDER BY topological_ordering DESC, stream_ordering DESC LIMIT 1
"""
_PREV = "SELECT event_id, prev_event_id FROM event_edges WHERE event_id = ANY(%(ids)s)"
_ORDERS = """
SELECT event_id, topological_ordering, stream_ordering, room_id FROM events
WHERE event_id = ANY(%(ids)s) AND NOT outlier
"""

Direction = Literal["b", "f"]
_MISSING = object()


@dataclass(frozen=True, slots=True)
class Page:
    """A ``/messages`` page: the events shown (``chunk``), where it started and where the next starts."""

    chunk: list[bytes]
    start: str
    end: str | None


def _moved_redacts(row: Row, room_version: str) -> str | None:
    """The top-level ``redacts`` the client format gives a redaction of a room version that moved it into
    ``content`` (version 11 and later): its target as stored (``events.redacts``); None otherwise."""
    if row.type != REDACTION or row.redacts is None or not room_version.isdigit() or int(room_version) < 11:
        return None
    return row.redacts


def _peeking(mine: tuple[str, int, int, str] | None) -> bool:
    """Whether a user whose current membership is ``mine`` reads the room as a stranger: unless they are
    joined to it or left it (an invited, banned or knocking user reads as a stranger, as the reference's
    ``/event`` does)."""
    return mine is None or mine[0] not in ("join", "leave")


def _after_leave(row: Row, mine: tuple[str, int, int, str] | None) -> bool:
    """Whether ``row`` comes after the user's leave (``mine``: their current membership), in the
    room's ``(topological, stream)`` order: nothing after it is theirs to read."""
    return mine is not None and mine[0] == "leave" and (row.topological, row.stream) > (mine[1], mine[2])


class Reads:
    """Reads of one host process (module docstring)."""

    def __init__(self, host: HostApi, states: StateStore) -> None:
        self.host = host
        self.states = states
        #: Room versions never change: kept (bounded), one query per room and process at most.
        self._versions: LruCache[str] = host.caches.get(ROOM_VERSIONS)
        self._memberships: LruCache[str | None] = host.caches.get(MEMBER_EVENT_MEMBERSHIP)
        #: The state event each state event replaced (None: none); immutable, like the state before it.
        self._replaces: LruCache[str | None] = host.caches.get(REPLACES_STATE)
        #: A user's member event in a state group (None: none); groups never change.
        self._member_at: LruCache[str | None] = host.caches.get(MEMBER_AT_GROUP)
        #: Events in the client format less ``unsigned`` (not redacted ones: their stored bytes are fixed).
        self._bodies: LruCache[ClientBody] = host.caches.get(CLIENT_BODIES)

    # -- helpers ---------------------------------------------------------------------------------

    def cached_room_version(self, room_id: str) -> str | None:
        """The room's version when it is cached (no query), else None."""
        return self._versions.get((room_id,))

    async def room_version(self, conn: AsyncConnection[Any], room_id: str) -> str:
        version = self.cached_room_version(room_id)
        if version is None:
            cur = await conn.execute(_ROOM, {"room_id": room_id})
            row = await cur.fetchone()
            if row is None:
                raise UnknownRoom(f"room {room_id} is not known here")
            version = str(row[0])
            self._versions.set((room_id,), version)
        return version

    async def rows(self, conn: AsyncConnection[Any], event_ids: Sequence[str]) -> dict[str, Row]:
        return await rows_by_id(conn, event_ids)

    async def _membership_of_events(self, conn: AsyncConnection[Any], event_ids: set[str]) -> dict[str, str | None]:
        """The membership each member event sets (immutable, so kept in a bounded cache)."""
        known: dict[str, str | None] = {}
        missing: list[str] = []
        for event_id in event_ids:
            hit = self._memberships.get((event_id,), _MISSING)
            if hit is _MISSING:
                missing.append(event_id)
            else:
                known[event_id] = hit
        if missing:
            cur = await conn.execute(_MEMBERSHIP_OF, {"ids": missing})
            for event_id, membership in await cur.fetchall():
                known[str(event_id)] = membership
                self._memberships.set((str(event_id),), membership)
        return known

    async def memberships_at(
        self, conn: AsyncConnection[Any], user: str, rows: Sequence[Row], *, whole_states: bool = True
    ) -> list[str | None]:
        """The user's membership in the state after each event (None: none; outliers: None).

        ``whole_states``: load each event's state (kept in the state cache, for the next page of the
        room); False: look up the one key in each (``StateStore.entries``: nothing replayed or kept),
        for many events of a room whose states the cache could not hold (every state event of a state).
        """
        held = [(r, r.state_group) for r in rows if r.state_group is not None]
        if whole_states:
            groups: dict[str, set[int]] = {}
            for row, group in held:
                groups.setdefault(row.room_id, set()).add(group)
            loaded = await self.states.load_groups(conn, groups)
            found = [loaded[group].state.get(MEMBER, {}).get(user) for _, group in held]
        else:
            found = await self._member_entries(conn, user, held)
        at = dict(zip([r.event_id for r, _ in held], found, strict=True))
        member_events = [at.get(row.event_id) for row in rows]
        known = await self._membership_of_events(conn, {e for e in member_events if e is not None})
        return [known.get(e) if e is not None else None for e in member_events]

    async def _member_entries(
        self, conn: AsyncConnection[Any], user: str, held: Sequence[tuple[Row, int]]
    ) -> list[str | None]:
        """The user's member event in each ``(row, state group)``'s state: ``StateStore.entries``, kept
        per group and user (a bounded cache: a group never changes)."""
        found: list[Any] = [self._member_at.get((group, user), _MISSING) for _, group in held]
        missing = [i for i, hit in enumerate(found) if hit is _MISSING]
        if missing:
            asks = [(held[i][0].room_id, held[i][1], MEMBER, user) for i in missing]
            for i, member_event in zip(missing, await self.states.entries(conn, asks), strict=True):
                found[i] = member_event
                self._member_at.set((held[i][1], user), member_event)
        return found

    async def current_membership(
        self, conn: AsyncConnection[Any], room_id: str, user: str
    ) -> tuple[str, int, int, str] | None:
        """The user's current membership in the room, its event's (topological, stream) and ID, or None."""
        cur = await conn.execute(_CURRENT_MEMBER, {"room_id": room_id, "user": user})
        row = await cur.fetchone()
        return None if row is None else (str(row[1]), int(row[2]), int(row[3]), str(row[0]))

    # -- formatting for a user -------------------------------------------------------------------------

    async def for_user(
        self, conn: AsyncConnection[Any], user: str, rows: Sequence[Row], *, is_peeking: dict[str, bool] | None = None
    ) -> list[bytes]:
        """The events of ``rows`` the user may see, in order, each formatted for them (:meth:`visible`,
        then :meth:`format`)."""
        return await self.format(conn, user, await self.visible(conn, user, rows, is_peeking=is_peeking))

    async def readable(
        self, conn: AsyncConnection[Any], user: str, rows: Sequence[Row], *, annotate: bool = True
    ) -> list[tuple[Row, str | None]]:
        """The rows the user may read by ID, as ``/event`` reads them: :meth:`visible`, peeking unless
        they are joined to the room or left it now, and nothing after their leave."""
        mine = {room_id: await self.current_membership(conn, room_id, user) for room_id in {r.room_id for r in rows}}
        peeking = {room_id: _peeking(m) for room_id, m in mine.items()}
        kept = [r for r in rows if not _after_leave(r, mine[r.room_id])]
        return await self.visible(conn, user, kept, is_peeking=peeking, annotate=annotate)

    async def visible(
        self,
        conn: AsyncConnection[Any],
        user: str,
        rows: Sequence[Row],
        *,
        is_peeking: dict[str, bool] | None = None,
        annotate: bool = True,
    ) -> list[tuple[Row, str | None]]:
        """The rows the user may see, in order, each with the user's membership at it; rows of any
        number of rooms, read in the same few queries.

        ``is_peeking`` per room; for a room not given, the user is peeking unless they are joined to it
        or left it now (an invited or banned user reads as a stranger would, as the reference's
        ``/event`` does; where a departed user's history ends is the caller's to enforce).
        ``annotate=False``: only which rows, not the memberships (None), so the user's membership is
        looked up only at the rows whose answer depends on it (not ``world_readable`` ones, nor
        ``shared`` ones for a user who is not peeking).
        """
        rows = [r for r in rows if r.type not in NEVER_SHOWN]
        rows = await self._without_unheld_targets(conn, rows)
        peeking = dict(is_peeking or {})
        for room_id in {r.room_id for r in rows} - peeking.keys():
            peeking[room_id] = _peeking(await self.current_membership(conn, room_id, user))
        facts = rows  # a row has every field the rules read (``visibility.EventLike``)
        verdicts: list[Verdict | None] = [None] * len(rows)
        if not annotate:  # what the rules show whatever the user's membership at the event
            for i, (row, fact) in enumerate(zip(rows, facts, strict=True)):
                verdict = check_event(user, fact, None, is_peeking=peeking[row.room_id])
                verdicts[i] = verdict if verdict.visible else None
        asked = [i for i, v in enumerate(verdicts) if v is None]
        found = await self.memberships_at(conn, user, [rows[i] for i in asked], whole_states=annotate)
        for i, membership in zip(asked, found, strict=True):
            verdicts[i] = check_event(user, facts[i], membership, is_peeking=peeking[rows[i].room_id])
        return [
            (row, v.membership if annotate else None)
            for row, v in zip(rows, verdicts, strict=True)
            if v is not None and v.visible
        ]

    async def _without_unheld_targets(self, conn: AsyncConnection[Any], rows: list[Row]) -> list[Row]:
        """``rows`` without the redactions whose target is not held in their room (docs/plugins/events.md,
        Redactions: such a redaction is stored, and shown once its target arrives)."""
        targets = {r.redacts for r in rows if r.type == REDACTION and r.redacts}
        if not targets:
            return rows
        cur = await conn.execute(_ROOM_OF, {"ids": list(targets)})
        held = {(str(e), str(room)) for e, room in await cur.fetchall()}
        return [r for r in rows if r.type != REDACTION or (r.redacts, r.room_id) in held]

    async def format(
        self,
        conn: AsyncConnection[Any],
        user: str,
        shown: Sequence[tuple[Row, str | None]],
        *,
        unseen: Collection[str] = (),
    ) -> list[bytes]:
        """Each event as sent to ``user``, in the client format (``factstream_events.shared.served``): pruned if
        redacted, with ``unsigned``: ``membership`` (when given), ``age``, ``redacted_because``
        (:meth:`_redactions`) and, for a state event that replaced another, ``replaces_state``,
        ``prev_content`` and ``prev_sender`` (:meth:`_replaced`), except for the events of ``unseen``
        (state events served that the user may not see as events: :meth:`_unseen_replacing`)."""
        because = await self._redactions(conn, user, [r.redacted_by for r, _ in shown if r.redacted_by])
        replaced = await self._replaced(conn, [r for r, _ in shown if r.event_id not in unseen])
        now = now_ms()
        bodies = self._bodies
        # Rows read without their JSON (``raw`` empty: a read that expects most bodies to be kept) get
        # it here, in one query, where it is needed: a redacted event, or a body not kept.
        unread = [r.event_id for r, _ in shown if not r.raw and (r.redacted_by or (r.event_id,) not in bodies)]
        raws: dict[str, bytes] = {}
        if unread:
            raws = {str(e): bytes(j) for e, j in await fetch_binary(conn, _JSON, {"ids": unread})}
        out: list[bytes] = []
        for row, membership in shown:
            unsigned: dict[str, Any] = {} if membership is None else {"membership": membership}
            unsigned.update(replaced.get(row.event_id, ()))
            if row.redacted_by:
                version = await self.room_version(conn, row.room_id)
                unsigned["redacted_because"] = because[row.redacted_by]
                raw = pruned_json(row.raw or raws[row.event_id], version)
                out.append(client_event(raw, row.event_id, unsigned, redacts=_moved_redacts(row, version), now=now))
                continue
            body: ClientBody | None = bodies.get((row.event_id,))
            if body is None:
                moved = _moved_redacts(row, await self.room_version(conn, row.room_id)) if row.redacts else None
                body = client_body(row.raw or raws[row.event_id], row.event_id, redacts=moved)
                bodies.set((row.event_id,), body)
            out.append(body.served(unsigned, now))
        return out

    async def _redactions(self, conn: AsyncConnection[Any], user: str, event_ids: Sequence[str]) -> dict[str, Any]:
        """``unsigned.redacted_because`` for each redaction of ``event_ids``: the redaction in the client
        format (pruned if it was redacted itself) if ``user`` may read it (:meth:`readable`), else
        ``served.REDACTED_MARKER``, which tells nothing of it."""
        if not event_ids:
            return {}
        found = await self.rows(conn, list(dict.fromkeys(event_ids)))
        may_read = {r.event_id for r, _ in await self.readable(conn, user, list(found.values()), annotate=False)}
        out: dict[str, Any] = dict.fromkeys(event_ids, REDACTED_MARKER)
        for event_id in may_read:
            red = found[event_id]
            version = await self.room_version(conn, red.room_id)
            raw = pruned_json(red.raw, version) if red.redacted_by else red.raw
            out[event_id] = msgspec.Raw(client_event(raw, event_id, None, redacts=_moved_redacts(red, version)))
        return out

    async def _replaced(self, conn: AsyncConnection[Any], rows: Sequence[Row]) -> dict[str, dict[str, Any]]:
        """For each state event of ``rows`` that replaced another in the state before it: ``replaces_state``,
        ``prev_content`` (pruned if that event was redacted) and ``prev_sender``.

        The state before a state event is the parent of the event's own state group (the group is that
        state with the event set); only the one key is looked up (``StateStore.entries``).
        """
        before = await self._replaces_state(conn, [r for r in rows if r.state_key is not None])
        previous = {e for e in before.values() if e is not None}
        prev_rows = await self.rows(conn, list(previous)) if previous else {}
        out: dict[str, dict[str, Any]] = {}
        rooms = {r.event_id: r.room_id for r in rows}
        for event_id, prev_id in before.items():
            prev = prev_rows.get(prev_id) if prev_id is not None and prev_id != event_id else None
            if prev is None or prev.room_id != rooms[event_id]:  # never another room's event
                continue
            event = parse_event_json(prev.raw)
            if prev.redacted_by:
                event = prune_event(event, await self.room_version(conn, prev.room_id))
            content = event.get("content")
            out[event_id] = {
                "replaces_state": prev.event_id,
                "prev_content": content if isinstance(content, dict) else {},
                "prev_sender": prev.sender,
            }
        return out

    async def _unseen_replacing(self, conn: AsyncConnection[Any], user: str, rows: Sequence[Row]) -> set[str]:
        """The state events of ``rows`` that replaced another and that ``user`` may not read as events
        (:meth:`readable`). ``/state`` serves every event of a state the user may read, also those set
        before the user could see the room (a ``joined`` room's name, set before they joined): what such
        an event replaced is in no state the user may read, so its ``prev_content`` is not told."""
        before = await self._replaces_state(conn, [r for r in rows if r.state_key is not None])
        replacing = [r for r in rows if before.get(r.event_id) not in (None, r.event_id)]
        if not replacing:
            return set()
        seen = {r.event_id for r, _ in await self.readable(conn, user, replacing, annotate=False)}
        return {r.event_id for r in replacing} - seen

    async def _replaces_state(self, conn: AsyncConnection[Any], rows: Sequence[Row]) -> dict[str, str | None]:
        """The event at each state event's key in the state before it (None: none; kept in a bounded
        cache: the state before an event never changes)."""
        out: dict[str, str | None] = {}
        missing: list[tuple[Row, int]] = []
        for r in rows:
            hit = self._replaces.get((r.event_id,), _MISSING)
            if hit is not _MISSING:
                out[r.event_id] = hit
            elif r.state_group is not None:
                missing.append((r, r.state_group))
        if not missing:
            return out
        parents = await self.states.parents(conn, {g for _, g in missing})
        asks = [(r, p) for r, g in missing if (p := parents.get(g)) is not None]
        found = await self.states.entries(conn, [(r.room_id, p, r.type, r.state_key or "") for r, p in asks])
        known = dict(zip([r.event_id for r, _ in asks], found, strict=True))
        for r, _ in missing:
            out[r.event_id] = known.get(r.event_id)
            self._replaces.set((r.event_id,), out[r.event_id])
        return out

    # -- reads -----------------------------------------------------------------------------------------

    async def event(self, user: str | None, event_id: str, room_id: str | None = None) -> bytes:
        """One event (of ``room_id`` when given): its stored bytes for a server (``user`` None),
        formatted if the user may read it (:meth:`readable`: a user who left sees nothing after their
        leave, as in ``/messages``; an invited or banned user reads as a stranger)."""
        async with self.host.database().autocommit() as conn:
            rows = await self.rows(conn, [event_id])
            row = rows.get(event_id)
            if row is None or (room_id is not None and row.room_id != room_id):
                raise UnknownEvent(f"event {event_id} is not known here")
            if user is None:
                return row.raw
            shown = await self.format(conn, user, await self.readable(conn, user, [row]))
            if not shown:
                raise UnknownEvent(f"event {event_id} is not known here or {user} may not see it")
            return shown[0]

    async def state_ids(self, room_id: str, at: str | None = None) -> StateMap:
        """The room's current state, or the state after event ``at``: ``(type, state_key) -> event_id``
        (a read-only mapping over the stored state, not a copy of it)."""
        async with self.host.database().autocommit() as conn:
            await self.room_version(conn, room_id)
            if at is None:
                cur = await conn.execute(
                    "SELECT type, state_key, event_id FROM current_state_events WHERE room_id = %(room_id)s",
                    {"room_id": room_id},
                )
                return StateMap(nest(((str(t), str(k)), str(e)) for t, k, e in await cur.fetchall()))
            rows = await self.rows(conn, [at])
            row = rows.get(at)
            if row is None or row.room_id != room_id:
                raise UnknownEvent(f"event {at} is not known in room {room_id}")
            if row.outlier:
                raise UnknownEvent(f"event {at} is an outlier: its state is not known here")
            if row.state_group is None:  # stored before the empty state had a group: the empty state
                return StateMap({})
            group = await self.states.load(conn, room_id, row.state_group)
            return StateMap(group.state)

    async def state_events(self, user: str | None, room_id: str, at: str | None = None) -> list[bytes]:
        """The state events of the current state or after ``at``: formatted for ``user``, or as the server
        sees them (``user`` None: every event of the state, in the federation format, ``served``).

        A user reads the current state when joined (or when the room is ``world_readable``), the
        state at their leave when they left (their own leave, even one they may not see as an event:
        an unban after a ban, as the reference reads it), and the state after an event they may see.
        """
        own_leave = False
        async with self.host.database().autocommit() as conn:
            if user is not None and at is None:
                mine = await self.current_membership(conn, room_id, user)
                if mine is not None and mine[0] == "leave":
                    at, own_leave = mine[3], True
                elif mine is None or mine[0] != "join":
                    ids = await self.state_ids(room_id)
                    vis = ids.get(("m.room.history_visibility", ""))
                    if vis is None or not await self._world_readable(conn, vis):
                        raise Forbidden(f"{user} is not in room {room_id}")
            if user is not None and at is not None and not own_leave:
                await self.event(user, at, room_id)  # 404 unless an event of the room the user may see
        ids = await self.state_ids(room_id, at)
        async with self.host.database().autocommit() as conn:
            rows = await self.rows(conn, list(ids.values()))
            ordered = [
                rows[e]
                for e in sorted(ids.values(), key=lambda e: (rows[e].type, rows[e].state_key or ""))
                if e in rows
            ]
            if user is None:
                return await self.for_server(conn, ordered)
            unseen = await self._unseen_replacing(conn, user, ordered)
            return await self.format(conn, user, [(r, None) for r in ordered], unseen=unseen)

    async def for_server(self, conn: AsyncConnection[Any], rows: Sequence[Row]) -> list[bytes]:
        """``rows`` in the federation format (``served``): the stored bytes, pruned if redacted."""
        return [
            federation_event(r.raw, await self.room_version(conn, r.room_id), redacted=r.redacted_by is not None)
            for r in rows
        ]

    async def _world_readable(self, conn: AsyncConnection[Any], event_id: str) -> bool:
        cur = await conn.execute(_JSON, {"ids": [event_id]})
        row = await cur.fetchone()
        if row is None:
            return False
        content = parse_event_json(bytes(row[1])).get("content")
        return isinstance(content, dict) and content.get("history_visibility") == "world_readable"

    async def messages(
        self,
        user: str,
        room_id: str,
        *,
        from_token: str | None = None,
        to_token: str | None = None,
        direction: Direction = "b",
        limit: int = DEFAULT_PAGE,
    ) -> Page:
        """A page of the room's timeline for ``user`` (docs/plugins/events.md, ``GET /rooms/{room_id}/messages``).

        403 for a user who is invited but never joined, banned, or not in a room that is not
        ``world_readable``; a user who left pages up to their leave. ``limit``: events read, at most
        :data:`MAX_PAGE` (a larger limit reads that many, as the reference); 0 reads none and ends
        where it starts.
        """
        if direction not in ("b", "f"):
            raise InvalidParam(f"dir: must be 'b' or 'f', not {direction!r}")
        if limit < 0:
            raise InvalidParam(f"limit: must be 0 or more, not {limit}")
        limit = min(limit, MAX_PAGE)
        start = parse_token("from", from_token)
        end = parse_token("to", to_token)
        names = await writer_names(self.host, "from", start) | await writer_names(self.host, "to", end)
        async with self.host.database().autocommit() as conn:
            await self.room_version(conn, room_id)
            mine = await self.current_membership(conn, room_id, user)
            cap: RoomToken | None = None
            if mine is None or mine[0] in {"invite", "ban", "knock"}:
                ids = await self.state_ids(room_id)
                vis = ids.get(("m.room.history_visibility", ""))
                if vis is None or not await self._world_readable(conn, vis):
                    raise Forbidden(f"{user} may not read the history of room {room_id}")
            elif mine[0] == "leave":
                cap = RoomToken(topological=mine[1], stream=mine[2])
            if start is None:
                if direction == "b":
                    cur = await conn.execute(_NEWEST, {"room_id": room_id})
                    newest = await cur.fetchone()
                    start = RoomToken(topological=int(newest[0]), stream=int(newest[1])) if newest else RoomToken(0)
                else:
                    start = RoomToken(topological=0, stream=-(2**62))
            if cap is not None:
                if direction == "b" and _after(start, cap):
                    start = cap
                if direction == "f" and (end is None or _after(end, cap)):
                    end = cap
            where, params = pagination_bounds(direction, start, end, names)
            sql = (
                f"SELECT {COLUMNS}, j.json FROM (SELECT * FROM events WHERE room_id = %(room_id)s AND NOT outlier"
                f" AND {where} ORDER BY {order_by(direction)} LIMIT %(limit)s) AS e"
                f" JOIN event_json j ON j.event_id = e.event_id ORDER BY {order_by(direction)}"
            )
            rows = [row_of(r) for r in await fetch_binary(conn, sql, {**params, "room_id": room_id, "limit": limit})]
            # an invited or banned user reads a world_readable room as a stranger does
            peeking = mine is None or mine[0] in {"invite", "ban", "knock"}
            chunk = await self.for_user(conn, user, rows, is_peeking={room_id: peeking})
        # A page that found events has an end, even when filtering showed none of them; only a page
        # past the last event has none (docs/plugins/events.md, ``GET /rooms/{room_id}/messages``).
        next_end = str(next_token(direction, rows[-1].topological, rows[-1].stream)) if rows else None
        if limit == 0:  # nothing read, so nothing is known to end here: the next page starts where this one did
            next_end = str(start)
        return Page(chunk, str(start), next_end)

    async def backfill(self, room_id: str, seeds: Sequence[str], limit: int) -> list[bytes]:
        """Up to ``limit`` events before ``seeds`` (those included), walking prev_events deepest first."""
        if not 1 <= limit <= MAX_PAGE:
            raise InvalidParam(f"limit: must be from 1 to {MAX_PAGE}, not {limit}")
        async with self.host.database().autocommit() as conn:
            await self.room_version(conn, room_id)
            if not seeds:
                raise InvalidParam("v: give at least one event ID to walk back from")
            out: list[str] = []
            seen: set[str] = set()
            queue: list[tuple[int, int, str]] = []
            frontier = list(dict.fromkeys(seeds))
            while frontier or queue:
                if frontier:
                    cur = await conn.execute(_ORDERS, {"ids": frontier})
                    for event_id, topo, stream, in_room in await cur.fetchall():
                        if in_room == room_id and event_id not in seen:
                            seen.add(str(event_id))
                            heapq.heappush(queue, (-int(topo), -int(stream), str(event_id)))
                    frontier = []
                if not queue or len(out) >= limit:
                    break
                _, _, event_id = heapq.heappop(queue)
                out.append(event_id)
                cur = await conn.execute(_PREV, {"ids": [event_id]})
                frontier = [str(p) for _, p in await cur.fetchall() if p not in seen]
            rows = await self.rows(conn, out)
            return await self.for_server(conn, [rows[e] for e in out if e in rows])


def _after(token: RoomToken, cap: RoomToken) -> bool:
    """Whether ``token`` is past ``cap`` (a historic token) in the room's (topological, stream) order; a
    token with writers is past it when any writer's position is (the cap then bounds the page)."""
    if token.writers:
        return max(p for _, p in token.writers) > cap.stream
    if token.topological is None:
        return token.stream > cap.stream
    return (token.topological, token.stream) > (cap.topological or 0, cap.stream)
