"""A batch of events to persist, and the checks it passes before anything is planned.

What every write brings (:class:`NewEvent`) and gets back (:class:`Persisted`), and the refusals that
need nothing but the batch and what is held: an ID twice with other bytes (409), an event of another
room, ``prev_events`` across rooms (400), a second create event (400), a cycle (400). The batch is
then ordered so that every event comes after the batch events it names as ``prev_events``.
"""

from __future__ import annotations

import heapq
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from psycopg import AsyncConnection

from factstream_events.rules.errors import EventConflict, InvalidEvent
from factstream_events.rules.prune import KNOWN_ROOM_VERSIONS
from factstream_events.rules.validate import CREATE, EventFields


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


#: Nothing stored, nothing held: the outcome of an empty batch (or of one whose events are all held).
NOTHING = Persisted([], [], {})


@dataclass(frozen=True, slots=True)
class Held:
    """What a batch needs of an event already held (or stored earlier in the batch)."""

    outlier: bool
    depth: int
    stream: int
    state_group: int | None
    membership: str | None
    #: The bytes held, read only for the batch's own events (compared with the bytes sent).
    raw: bytes | None = None


def is_create(e: NewEvent) -> bool:
    return e.fields.type == CREATE and e.fields.state_key == ""


def room_version_of_create(event: Mapping[str, Any]) -> str:
    """The room version a create event names (``"1"`` when it names none); 400 for an unknown one."""
    content = event.get("content")
    version = content.get("room_version", "1") if isinstance(content, dict) else "1"
    if not isinstance(version, str) or version not in KNOWN_ROOM_VERSIONS:
        raise InvalidEvent(f"content.room_version of the create event: unsupported room version {version!r}")
    return version


def check_batch(room_id: str, batch: Sequence[NewEvent]) -> None:
    """Refuse a batch holding an event of another room (400) or an ID twice with other bytes (409)."""
    for e in batch:
        if e.fields.room_id != room_id:
            raise InvalidEvent(f"event {e.event_id}: room_id is {e.fields.room_id}, not {room_id}")
    _refuse_repeats_with_other_bytes(batch)


def _refuse_repeats_with_other_bytes(batch: Sequence[NewEvent]) -> None:
    """:class:`EventConflict` (409) when an ID comes twice in ``batch`` with other bytes, as it would across
    batches: which copy is the event cannot be decided, so nothing of the batch is stored."""
    first: dict[str, bytes] = {}
    for i, e in enumerate(batch):
        raw = first.setdefault(e.event_id, e.raw)
        if raw != e.raw:
            raise EventConflict(f"events[{i}]: event {e.event_id} comes twice in the batch with other content")


def refuse_references_elsewhere(batch: Sequence[NewEvent], room_id: str, elsewhere: Mapping[str, str]) -> None:
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


_HELD_CREATE = """
SELECT event_id FROM events WHERE room_id = %(room_id)s AND type = 'm.room.create' AND state_key = '' LIMIT 1
"""


async def refuse_another_create(
    conn: AsyncConnection[Any], room_id: str, batch: Sequence[NewEvent], new: Sequence[NewEvent], held_room: bool
) -> None:
    """:class:`InvalidEvent` (400) for a create event (``m.room.create``, state key ``""``) among the
    batch's ``new`` events that has ``prev_events``, that is the batch's second, or that is not the create
    event the room already holds: a room has one create event, its first (the specification's first
    authorisation rule), and a second would replace the room's creator and version in its state. The
    room's create event is read only when the batch brings one to a room held before it."""
    creates = [e for e in new if is_create(e)]
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


def batch_order(batch: Sequence[NewEvent]) -> list[NewEvent]:
    """The batch with every event after the batch events it names as prev_events (depth, then given
    order); 400 naming a few of them when they form a cycle."""
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


@dataclass(frozen=True, slots=True)
class Triage:
    """The batch sorted against what is held: the events to write (in order) and those already held."""

    todo: list[NewEvent]
    duplicates: list[str]
    #: Those of ``todo`` held as outliers and now sent normally: their rows are updated, not inserted.
    deoutliered: frozenset[str]


def triage(batch: Sequence[NewEvent], held: Mapping[str, Held], backfill: bool) -> Triage:
    """Which events of ``batch`` to write: a new one, or one held as an outlier and now sent normally
    (not by backfill); the same bytes again are a duplicate, other bytes a conflict (409, the first kept)."""
    todo: list[NewEvent] = []
    duplicates: list[str] = []
    seen: set[str] = set()
    for e in batch:
        if e.event_id in seen:
            continue  # the same bytes again (:func:`check_batch`): stored once
        seen.add(e.event_id)
        old = held.get(e.event_id)
        if old is None:
            todo.append(e)
            continue
        if old.raw is not None and old.raw != e.raw:
            raise EventConflict(f"event {e.event_id} is already stored with other content; the first is kept")
        if old.outlier and not e.outlier and not backfill:
            todo.append(e)
        else:
            duplicates.append(e.event_id)
    deoutliered = frozenset(e.event_id for e in todo if e.event_id in held)
    return Triage(todo, duplicates, deoutliered)
