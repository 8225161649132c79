"""Creating local events: what this server writes in its own name.

A local event is built from a :class:`Draft` (type, sender, content, state key, redacted event) and
the room as it is when the batch is written (:class:`~factstream_events.write.room.RoomWrite`, under the
room's lock): the server picks its ``prev_events`` (the room's forward extremities, at most
:data:`MAX_PREV_EVENTS` of the deepest), its ``depth`` (one more than the deepest of them, capped),
its ``origin_server_ts`` and its ``auth_events``. Its content must pass the content rules
(``contentrules``) and the local policy (the ``check_local_event`` hook, by default
``factstream_events.rules.policy``) must allow it against the room's state before it and the room's facts
(creator, power levels, join rule, memberships, a redaction's target). It is then sealed: its content
hash, its ID and its canonical bytes (:func:`seal`). A batch's drafts follow one another: each event's
only prev_event is the one before it, and each state event changes the state the next is checked on.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

from psycopg import AsyncConnection

from factstream import LruCache
from factstream_events.rules.canonical import MAX_CANONICAL_INT, CanonicalJsonError, canonical_json, parse_event_json
from factstream_events.rules.contentrules import check_local_content
from factstream_events.rules.errors import Forbidden, InvalidEvent
from factstream_events.rules.eventid import content_hash, event_id_for
from factstream_events.rules.policy import RoomFacts, creator_of, verb_refusal
from factstream_events.rules.statemath import State, apply_delta
from factstream_events.rules.validate import (
    CREATE,
    JOIN_RULES,
    MAX_EVENT_BYTES,
    MEMBER,
    POWER_LEVELS,
    BadEvent,
    check_event,
)
from factstream_events.shared.clock import now_ms
from factstream_events.shared.stored import rows_by_id
from factstream_events.write.batch import NewEvent
from factstream_events.write.room import RoomWrite

#: A local event follows at most this many of the room's deepest forward extremities.
MAX_PREV_EVENTS = 10

#: ``async (room_id, event, state before it, the room's facts) -> None to allow it, or the reason (403)``.
Policy = Callable[[str, Mapping[str, Any], State, RoomFacts], Awaitable[str | None]]

_CONTENTS = "SELECT event_id, json FROM event_json WHERE event_id = ANY(%(ids)s)"
_TARGET = "SELECT sender, type, room_id FROM events WHERE event_id = %(event_id)s"


@dataclass(frozen=True, slots=True)
class Draft:
    """A local event before the server completes it."""

    type: str
    sender: str
    content: Mapping[str, Any]
    state_key: str | None = None
    redacts: str | None = None
    #: Where the event came from in the request, a prefix of the field names in refusals (``initial_state[2].``).
    where: str = ""
    #: What a ``leave`` of another user means (``kick``, ``unban``): judged with the policy
    #: (``policy.verb_refusal``).
    verb: str | None = None


@dataclass(frozen=True, slots=True)
class Txn:
    """A client's transaction ID for an idempotent send: a retry gets the first event's ID back; another
    request under the same ``(user, txn_id)`` is refused (409). ``digest`` identifies the request."""

    user: str
    txn_id: str
    digest: str


@dataclass(frozen=True, slots=True)
class LocalWrite:
    """A local write as a value: what the route or the Python API asks the room's writer to write.

    ``drafts`` are completed under the room's lock (:meth:`EventCreator.build`), in order; ``events`` are
    local events already complete (written as they are, the way a draft's event is once built).
    ``new_room_version``: the room may be new (the drafts then start with its create event). ``txn``: its
    claim is written with the events (a concurrent claim of the same ID fails the batch).
    """

    drafts: tuple[Draft, ...] = ()
    events: tuple[NewEvent, ...] = ()
    new_room_version: str | None = None
    txn: Txn | None = None


class EventCreator:
    """Builds local batches (module docstring); the contents of state events and the creators of rooms
    it reads are kept in ``contents`` and ``creators`` (both immutable facts)."""

    def __init__(
        self,
        policy: Policy,
        contents: LruCache[Mapping[str, Any]],
        creators: LruCache[tuple[str | None]],
    ) -> None:
        self.policy = policy
        self._contents = contents
        self._creators = creators

    async def build(self, room: RoomWrite, drafts: Sequence[Draft]) -> list[NewEvent]:
        """The events of ``drafts``, in order, complete and checked (400 naming the field, 403 with the
        policy's reason)."""
        version = room.view.room_version
        state: State = room.current.state if room.current is not None else {}
        prev, depth = _after_extremities(room)
        made: dict[str, NewEvent] = {}
        out: list[NewEvent] = []
        exists = room.held_before
        for draft in drafts:
            event = _draft_event(room.room_id, draft, version, state, prev, depth)
            facts = await self._facts(room.conn, room.room_id, state, draft, made, exists, version)
            reason = verb_refusal(draft.verb, draft.state_key or "", facts) if draft.verb else None
            reason = reason or await self.policy(room.room_id, event, state, facts)
            if reason is not None:
                raise Forbidden(reason)
            new = seal(event, version)
            made[new.event_id] = new
            out.append(new)
            if draft.state_key is not None:
                state = apply_delta(state, {draft.type: {draft.state_key: new.event_id}})
            exists = True
            prev, depth = [new.event_id], min(depth + 1, MAX_CANONICAL_INT)
        return out

    async def contents(self, conn: AsyncConnection[Any], event_ids: Sequence[str]) -> dict[str, Mapping[str, Any]]:
        """The ``content`` of each held event of ``event_ids``."""
        out: dict[str, Mapping[str, Any]] = {}
        missing: list[str] = []
        for event_id in event_ids:
            hit = self._contents.get((event_id,))
            if hit is None:
                missing.append(event_id)
            else:
                out[event_id] = hit
        if missing:
            cur = await conn.execute(_CONTENTS, {"ids": missing})
            for event_id, raw in await cur.fetchall():
                content = parse_event_json(bytes(raw)).get("content")
                out[str(event_id)] = content if isinstance(content, dict) else {}
                self._contents.set((str(event_id),), out[str(event_id)])
        return out

    async def _facts(
        self,
        conn: AsyncConnection[Any],
        room_id: str,
        state: State,
        draft: Draft,
        batch: Mapping[str, NewEvent],
        exists: bool,
        room_version: str,
    ) -> RoomFacts:
        """What the policy judges ``draft`` on, from ``state`` (the state before it) and the batch so far."""
        users = [draft.sender] + ([draft.state_key] if draft.type == MEMBER and draft.state_key else [])
        wanted = {
            k: state.get(t, {}).get(s)
            for k, (t, s) in {"create": (CREATE, ""), "pl": (POWER_LEVELS, ""), "jr": (JOIN_RULES, "")}.items()
        }
        members = {u: state.get(MEMBER, {}).get(u) for u in users}
        ids = [e for e in [wanted["pl"], wanted["jr"], *members.values()] if e is not None]
        contents = {e: batch[e].fields.content for e in ids if e in batch}
        contents.update(await self.contents(conn, [e for e in ids if e not in contents]))
        creator = None
        if wanted["create"] is not None:
            creator = await self._creator(conn, wanted["create"], batch, room_version)
        jr = contents.get(wanted["jr"], {}) if wanted["jr"] else {}
        facts = RoomFacts(
            exists=exists,
            creator=creator,
            power_levels=contents.get(wanted["pl"]) if wanted["pl"] else None,
            join_rule=str(jr.get("join_rule", "invite")),
            memberships={
                u: str(contents.get(e, {}).get("membership", "leave")) for u, e in members.items() if e is not None
            },
        )
        if draft.redacts is not None:
            facts = await self._with_target(conn, facts, room_id, draft.redacts)
        return facts

    async def _creator(
        self, conn: AsyncConnection[Any], create_id: str, batch: Mapping[str, NewEvent], room_version: str
    ) -> str | None:
        """The creator the create event ``create_id`` names (``policy.creator_of``)."""
        made = batch.get(create_id)
        if made is not None:
            return creator_of(made.event, room_version)
        hit = self._creators.get((create_id,))
        if hit is None:
            row = (await rows_by_id(conn, [create_id])).get(create_id)
            hit = (creator_of(parse_event_json(row.raw), room_version) if row else None,)
            self._creators.set((create_id,), hit)
        return hit[0]

    @staticmethod
    async def _with_target(conn: AsyncConnection[Any], facts: RoomFacts, room_id: str, target: str) -> RoomFacts:
        """``facts`` with the sender and type of the event a redaction redacts, if held (400 when it is an
        event of another room)."""
        cur = await conn.execute(_TARGET, {"event_id": target})
        row = await cur.fetchone()
        if row is None:
            return facts
        if row[2] != room_id:
            raise InvalidEvent(f"redacts: event {target} is in another room, not {room_id}")
        return replace(facts, redaction_target=(str(row[0]), str(row[1])))


def _after_extremities(room: RoomWrite) -> tuple[list[str], int]:
    """The prev_events and depth of the room's next local event: its deepest forward extremities (at most
    :data:`MAX_PREV_EVENTS`), one deeper; a new room's first event has none, at depth 1."""
    if not room.view.extremities:
        return [], 1
    deepest = sorted(room.view.extremities.items(), key=lambda kv: (-kv[1][0], -kv[1][1]))[:MAX_PREV_EVENTS]
    # capped, as the reference caps it: a remote event at the largest depth must not freeze the room
    return [eid for eid, _ in deepest], min(max(d for _, (d, _, _) in deepest) + 1, MAX_CANONICAL_INT)


def _draft_event(
    room_id: str, draft: Draft, version: str, state: State, prev: Sequence[str], depth: int
) -> dict[str, Any]:
    """The event ``draft`` makes, before its hashes and ID; 400 naming the field when its content breaks
    the content rules."""
    event: dict[str, Any] = {
        "room_id": room_id,
        "type": draft.type,
        "sender": draft.sender,
        "content": dict(draft.content),
        "origin_server_ts": now_ms(),
        "prev_events": list(prev),
        "depth": depth,
        "auth_events": auth_events(state, draft),
    }
    if draft.state_key is not None:
        event["state_key"] = draft.state_key
    if draft.redacts is not None:
        event["redacts"] = draft.redacts
        if version == "11":
            event["content"]["redacts"] = draft.redacts
    try:
        check_local_content(event, version, draft.where)
    except BadEvent as exc:
        raise InvalidEvent(str(exc)) from None
    return event


def auth_events(state: State, draft: Draft) -> list[str]:
    """The auth events Matrix selects: create, power levels, the sender's membership, and for a
    membership event the target's and the join rules."""
    keys = [(CREATE, ""), (POWER_LEVELS, ""), (MEMBER, draft.sender)]
    if draft.type == MEMBER and draft.state_key is not None:
        keys += [(MEMBER, draft.state_key), (JOIN_RULES, "")]
    found = [state.get(t, {}).get(k) for t, k in keys]
    return list(dict.fromkeys(e for e in found if e is not None))


def seal(event: dict[str, Any], room_version: str) -> NewEvent:
    """A local event, complete and checked: its hashes, ID and canonical bytes (400s naming the field)."""
    try:
        event["hashes"] = {"sha256": content_hash(event)}
        event_id = event_id_for(event, room_version)
        raw = canonical_json(event)
    except CanonicalJsonError as exc:  # a float or an integer beyond 2**53 in the content
        raise InvalidEvent(f"content: {exc}") from None
    if len(raw) > MAX_EVENT_BYTES:
        raise InvalidEvent(f"the event is {len(raw)} bytes of JSON; at most {MAX_EVENT_BYTES} are allowed")
    try:
        return NewEvent(event_id, raw, event, check_event(event))
    except BadEvent as exc:
        raise InvalidEvent(str(exc)) from None
