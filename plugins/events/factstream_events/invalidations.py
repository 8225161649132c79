"""The reader side of the ``events`` stream: what each row makes stale, on every process alike.

Every process, the writer included, applies the same rows (docs/plugins/events.md, Streams): the core
runs a stream's ``InvalidationSpec`` s and rows handlers on replicated rows (before the position
advances) and on the rows this process wrote itself (``local=True``: the invalidations as soon as the
transaction ends, the handlers once it committed and every earlier ID of this writer is complete).

Per row kind:

* ``ev`` (a new event, or an outlier persisted again, at its new ID): the event's own
  :data:`EVENT_FACTS` entry; for a redaction, its target's; unless it is an outlier, the room's
  :data:`ROOM_LATEST` entry and its entry in the room change cache (``Timeline.rooms``); for a member
  event, the target user's :data:`~factstream_events.read.timeline.ROOMS_FOR_USER` entry and their entry in
  the membership change cache (``Timeline.members``);
* ``state`` (one current-state change): the room's current state through the core's ``cs_cache_fake``
  fan-out (``host.caches.invalidate_room_state_local``: every cache declared with
  ``depends_on_room_state=True``, so :data:`CURRENT_STATE_IDS` and :data:`ROOM_MEMBERS` and other
  plugins' caches alike), with the member whose membership changed for ``m.room.member`` keys, who also
  gets their ``ROOMS_FOR_USER`` entry and membership change cache entry;
* ``state-all`` (a room's 150 or more changes at one ID): the room's state caches, every user's
  membership caches (the whole of ``ROOMS_FOR_USER`` and of every ``"member"`` and ``"room_member"``
  room-state cache), and the membership change cache answers "unsure" for positions before the row's.

The caches keyed by event, room or user alone are :class:`~factstream.InvalidationSpec` s (:func:`specs`),
so a writer's own next read never meets a stale entry; the fan-out and the change caches need the
host and go through the rows handler (:func:`on_rows`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from factstream import Caches, HostApi, InvalidationSpec, cached
from factstream_events.read.timeline import ROOMS_FOR_USER, Timeline
from factstream_events.rules.validate import MEMBER
from factstream_events.shared.rows import EV, STATE, STATE_ALL, STREAM, EventsRow, event_data, state_data
from factstream_events.store import EventsStore

#: A room's current state, ``(type, state_key) -> event_id``, by ``(room_id,)``.
CURRENT_STATE_IDS = "events_current_state_ids"
#: A room's joined members (sorted user IDs), by ``(room_id,)``.
ROOM_MEMBERS = "events_room_members"
#: What may change of a stored event (:class:`EventFacts`; None: not stored here), by ``(event_id,)``.
EVENT_FACTS = "events_event_facts"
#: A room's newest event by stream order (:class:`LatestEvent`; None: none yet), by ``(room_id,)``.
ROOM_LATEST = "events_room_latest"

_CURRENT_STATE = "SELECT type, state_key, event_id FROM current_state_events WHERE room_id = %(room_id)s"
_MEMBERS = """
SELECT state_key FROM current_state_events
WHERE room_id = %(room_id)s AND type = 'm.room.member' AND membership = 'join' ORDER BY state_key
"""
_EVENT_FACTS = """
SELECT room_id, topological_ordering, stream_ordering, outlier, redacted_by FROM events WHERE event_id = %(id)s
"""
_LATEST = """
SELECT event_id, stream_ordering FROM events
WHERE room_id = %(room_id)s AND NOT outlier AND stream_ordering > 0 ORDER BY stream_ordering DESC LIMIT 1
"""


@dataclass(frozen=True, slots=True)
class EventFacts:
    """The facts of a stored event that a later row may change: its orderings and ``outlier`` (an
    outlier persisted again), ``redacted_by`` (a redaction arrived)."""

    room_id: str
    topological: int
    stream: int
    outlier: bool
    redacted_by: str | None


@dataclass(frozen=True, slots=True)
class LatestEvent:
    """A room's newest non-outlier event by stream ordering (backfilled events excluded)."""

    event_id: str
    stream: int


class RoomState:
    """Cached reads of rooms' current state, members and events (``host.state(RoomState)``); every
    entry is dropped by the rows that change it (module docstring)."""

    def __init__(self, host: HostApi) -> None:
        self.host = host
        #: Where ``@cached`` finds its caches.
        self.caches: Caches = host.caches

    @cached(name=CURRENT_STATE_IDS, max_size=10_000, depends_on_room_state=True)
    async def current_state_ids(self, room_id: str) -> dict[tuple[str, str], str]:
        """The room's current state, ``(type, state_key) -> event_id`` (empty: an unknown room).

        The dictionary is shared by every caller: read it, never change it."""
        rows = await self.host.database().fetchall(_CURRENT_STATE, {"room_id": room_id})
        return {(str(t), str(k)): str(e) for t, k, e in rows}

    @cached(name=ROOM_MEMBERS, max_size=10_000, depends_on_room_state=True)
    async def room_members(self, room_id: str) -> tuple[str, ...]:
        """The users joined to the room now, sorted."""
        return tuple(str(u) for (u,) in await self.host.database().fetchall(_MEMBERS, {"room_id": room_id}))

    @cached(name=EVENT_FACTS, max_size=100_000)
    async def event_facts(self, event_id: str) -> EventFacts | None:
        """The changeable facts of a stored event (None: not stored here)."""
        rows = await self.host.database().fetchall(_EVENT_FACTS, {"id": event_id})
        if not rows:
            return None
        room_id, topological, stream, outlier, redacted_by = rows[0]
        return EventFacts(str(room_id), int(topological), int(stream), bool(outlier), redacted_by)

    @cached(name=ROOM_LATEST, max_size=10_000)
    async def latest_event(self, room_id: str) -> LatestEvent | None:
        """The room's newest event by stream ordering (None: none)."""
        rows = await self.host.database().fetchall(_LATEST, {"room_id": room_id})
        return LatestEvent(str(rows[0][0]), int(rows[0][1])) if rows else None


# -- the InvalidationSpecs: caches keyed by the row alone -------------------------------------------------


def event_facts_keys(row: EventsRow) -> list[tuple[str]]:
    """An ``ev`` row: its event's entry, and its redaction target's."""
    if row.kind != EV:
        return []
    data = event_data(row)
    return [(data.event_id,)] if data.redacts is None else [(data.event_id,), (data.redacts,)]


def room_latest_keys(row: EventsRow) -> list[tuple[str]]:
    """An ``ev`` row of an event that is not an outlier: its room's entry."""
    if row.kind != EV:
        return []
    data = event_data(row)
    return [] if data.outlier else [(data.room_id,)]


def rooms_for_user_keys(row: EventsRow) -> list[tuple[str]] | None:
    """A member event's target, a ``state`` row's member; ``state-all``: everyone (None)."""
    if row.kind == EV:
        data = event_data(row)
        return [(data.state_key,)] if data.type == MEMBER and data.state_key is not None else []
    if row.kind == STATE:
        change = state_data(row)
        return [(change.state_key,)] if change.type == MEMBER else []
    if row.kind == STATE_ALL:
        return None
    return []


def specs() -> list[InvalidationSpec]:
    """The events stream's invalidations of caches keyed by the row alone (registered by the plugin)."""
    return [
        InvalidationSpec(stream=STREAM, cache=EVENT_FACTS, keys=event_facts_keys),
        InvalidationSpec(stream=STREAM, cache=ROOM_LATEST, keys=room_latest_keys),
        InvalidationSpec(stream=STREAM, cache=ROOMS_FOR_USER, keys=rooms_for_user_keys),
    ]


# -- the rows handler: the room-state fan-out and the change caches -----------------------------------------


def on_rows(host: HostApi, instance: str, token: int, rows: Sequence[EventsRow], local: bool) -> None:
    """One token's rows of the events stream, this process's own or replicated (module docstring)."""
    timeline = _timeline(host)
    timeline.on_rows(token, rows)
    changed: dict[str, list[str]] = {}
    for row in rows:
        if row.kind == STATE:
            change = state_data(row)
            members = changed.setdefault(change.room_id, [])
            if change.type == MEMBER:
                members.append(change.state_key)
                timeline.members.changed(change.state_key, token)
        elif row.kind == STATE_ALL:
            room_id = str(row.data[0])
            changed.pop(room_id, None)
            host.caches.invalidate_room_state_local(room_id, every_member=True)
            timeline.members.unsure_before(token)
    for room_id, members in changed.items():
        host.caches.invalidate_room_state_local(room_id, members)


def _timeline(host: HostApi) -> Timeline:
    return host.state(EventsStore).timeline
