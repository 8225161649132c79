"""The events plugin's Python API: ``host.state(EventsStore)`` in any host process.

Writes (on a writer of the ``events`` stream):

* local events, which this server creates (``factstream_events.write.create``): :meth:`EventsStore.create_room`,
  :meth:`send` (idempotent per transaction ID), :meth:`change_membership`, :meth:`redact`;
* remote events, stored as received: :meth:`persist_remote`.

Both end in ``factstream_events.write.persist``, under the room's lock. With several writers each room has
one (``factstream_events.shared.sharding``): a write of a room another instance writes raises
:class:`~factstream_events.rules.errors.MisdirectedWrite` naming it, before anything is read or stored.

Reads (any process): see ``factstream_events.read.reads`` (:attr:`EventsStore.reads`).
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import psycopg

from factstream import HostApi, LruCache
from factstream_events import hookspecs
from factstream_events.read.reads import Reads
from factstream_events.read.sync import RoomSync
from factstream_events.read.timeline import Timeline
from factstream_events.rules.canonical import MAX_CANONICAL_INT, CanonicalJsonError, EventJsonError, parse_event_json
from factstream_events.rules.contentrules import HISTORY_VISIBILITIES
from factstream_events.rules.errors import EventConflict, InvalidEvent, MisdirectedWrite, UnknownEvent, UnknownRoom
from factstream_events.rules.eventid import EventIdError, event_id_for, is_valid_event_id
from factstream_events.rules.policy import LEVEL_DEFAULTS, RoomFacts
from factstream_events.rules.prune import KNOWN_ROOM_VERSIONS, UnknownRoomVersion, check_room_version
from factstream_events.rules.statemath import State, default_resolve
from factstream_events.rules.validate import (
    CREATE,
    HISTORY_VISIBILITY,
    JOIN_RULES,
    MAX_EVENT_BYTES,
    MEMBER,
    POWER_LEVELS,
    REDACTION,
    BadEvent,
    EventFields,
    check_event,
)
from factstream_events.shared.caches import ROOM_CREATORS, STATE_CONTENTS
from factstream_events.shared.sharding import new_room_id, refuse_misdirected
from factstream_events.shared.statestore import StateStore
from factstream_events.write.batch import NewEvent, Persisted
from factstream_events.write.create import Draft, EventCreator, LocalWrite, Txn
from factstream_events.write.persist import Origin, Persister
from factstream_events.write.steps import TXN_KEY

#: Room versions whose events may hold integers beyond canonical JSON's range (before version 6).
LOOSE_JSON_VERSIONS = frozenset({"1", "2", "3", "4", "5"})
DEFAULT_ROOM_VERSION = "10"
PRESETS = {"private_chat": "invite", "public_chat": "public", "trusted_private_chat": "invite"}

_EARLIER_TXN = "SELECT request_hash, event_id FROM event_txn_ids WHERE user_id = %(user_id)s AND txn_id = %(txn_id)s"


@dataclass(frozen=True, slots=True)
class RemoteEvent:
    """A remote event as received: its bytes, and its ID when given beside the JSON."""

    raw: bytes
    event_id: str | None = None
    outlier: bool = False


def request_hash(*parts: object) -> str:
    text = json.dumps(list(parts), sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    return hashlib.sha256(text.encode("utf-8", "surrogatepass")).hexdigest()


class EventsStore:
    """One host process's events (module docstring)."""

    def __init__(self, host: HostApi) -> None:
        self.host = host
        self.states = StateStore()
        #: Contents of state events (immutable): a bounded cache.
        self._contents: LruCache[Mapping[str, Any]] = host.caches.get(STATE_CONTENTS)
        #: The creator each create event names, by its ID (immutable): ``(creator or None,)``.
        self._creators: LruCache[tuple[str | None]] = host.caches.get(ROOM_CREATORS)
        self.creator = EventCreator(self._policy, self._contents, self._creators)
        self.persister = Persister(host, self.states, self._resolve, self.creator)
        self.reads = Reads(host, self.states)
        self.timeline = Timeline(host, self.reads)
        #: The ``rooms`` section of ``/sync`` (``factstream_events.read.sync``).
        self.sync = RoomSync(host, self.reads, self.timeline)

    # -- hooks -------------------------------------------------------------------------------------

    async def _resolve(self, room_id: str, room_version: str, states: Sequence[State]) -> State:
        answer = await self.host.call_first(
            hookspecs.resolve_state, room_id=room_id, room_version=room_version, states=states
        )
        return default_resolve(states) if answer is None else answer

    async def _policy(self, room_id: str, event: Mapping[str, Any], state: State, facts: RoomFacts) -> str | None:
        answer = await self.host.call_first(
            hookspecs.check_local_event, room_id=room_id, event=event, state=state, facts=facts
        )
        if answer is None or answer is True:
            return None
        return answer if isinstance(answer, str) and answer else "the local policy refused the event"

    # -- local writes ------------------------------------------------------------------------------

    async def _local(self, room_id: str, write: LocalWrite) -> list[str]:
        """Persist the local ``write`` (its drafts completed and checked in order: ``create``); the event IDs.

        With a transaction ID, a retry gets the first event's ID back and another request under the same
        ID is refused (409). A room this instance does not write is refused first (:class:`MisdirectedWrite`).
        """
        refuse_misdirected(self.host, room_id)
        txn = write.txn
        if txn is not None:
            earlier = await self._earlier_txn(txn)
            if earlier is not None:
                return [earlier]
        try:
            try:
                outcome = await self.persister.persist_local(room_id, write)
            except psycopg.errors.UniqueViolation as exc:
                if txn is None or exc.diag.constraint_name != TXN_KEY:
                    raise
                raise EventConflict(f"transaction ID {txn.txn_id!r} was used concurrently; retry the request") from None
        except EventConflict:
            if txn is not None:
                earlier = await self._earlier_txn(txn)
                if earlier is not None:
                    return [earlier]
            raise
        return outcome.stored

    async def _earlier_txn(self, txn: Txn) -> str | None:
        rows = await self.host.database().fetchall(_EARLIER_TXN, {"user_id": txn.user, "txn_id": txn.txn_id})
        if not rows:
            return None
        if rows[0][0] != txn.digest:
            raise EventConflict(f"transaction ID {txn.txn_id!r} was already used by {txn.user} for a different request")
        return str(rows[0][1])

    async def create_room(
        self,
        creator: str,
        *,
        preset: str = "private_chat",
        history_visibility: str = "shared",
        name: str | None = None,
        topic: str | None = None,
        room_version: str = DEFAULT_ROOM_VERSION,
        initial_state: Sequence[tuple[str, str, Mapping[str, Any]]] = (),
        invite: Sequence[str] = (),
    ) -> str:
        """Create a room: its create, the creator's join, power levels, join rules, history visibility
        (and name, topic, initial state, invites), in one transaction; returns the room ID, one that
        this instance writes (``sharding.new_room_id``)."""
        if room_version not in KNOWN_ROOM_VERSIONS or room_version in {"1", "2"}:
            raise InvalidEvent(f"room_version: {room_version!r} is not a version this server creates rooms in")
        if history_visibility not in HISTORY_VISIBILITIES:
            raise InvalidEvent(
                f"history_visibility: must be one of {', '.join(HISTORY_VISIBILITIES)}, not {history_visibility!r}"
            )
        if preset not in PRESETS:
            raise InvalidEvent(f"preset: must be one of {', '.join(sorted(PRESETS))}, not {preset!r}")
        room_id = new_room_id(self.host, _server_of(creator))
        create_content: dict[str, Any] = {"room_version": room_version}
        if room_version != "11":
            create_content["creator"] = creator
        drafts = [
            Draft(CREATE, creator, create_content, ""),
            Draft(MEMBER, creator, {"membership": "join"}, creator),
            Draft(
                POWER_LEVELS,
                creator,
                {"users": {creator: 100}, **LEVEL_DEFAULTS, "events": {}},
                "",
            ),
            Draft(JOIN_RULES, creator, {"join_rule": PRESETS[preset]}, ""),
            Draft(HISTORY_VISIBILITY, creator, {"history_visibility": history_visibility}, ""),
        ]
        if name is not None:
            drafts.append(Draft("m.room.name", creator, {"name": name}, ""))
        if topic is not None:
            drafts.append(Draft("m.room.topic", creator, {"topic": topic}, ""))
        drafts += [
            Draft(t, creator, dict(c), k, where=f"initial_state[{i}].") for i, (t, k, c) in enumerate(initial_state)
        ]
        drafts += [Draft(MEMBER, creator, {"membership": "invite"}, u) for u in invite]
        await self._local(room_id, LocalWrite(tuple(drafts), new_room_version=room_version))
        return room_id

    async def send(
        self,
        room_id: str,
        sender: str,
        event_type: str,
        content: Mapping[str, Any],
        *,
        state_key: str | None = None,
        txn_id: str | None = None,
    ) -> str:
        """Send one event (a state event with ``state_key``); idempotent per ``(sender, txn_id)``."""
        digest = request_hash("send", room_id, event_type, state_key, content)
        txn = Txn(sender, f"send/{txn_id}", digest) if txn_id else None
        return (await self._local(room_id, LocalWrite((Draft(event_type, sender, content, state_key),), txn=txn)))[0]

    async def change_membership(
        self,
        room_id: str,
        sender: str,
        target: str,
        membership: str,
        *,
        reason: str | None = None,
        verb: str | None = None,
    ) -> str:
        """Join, leave, invite, kick (leave of another user), ban or unban; the event's ID. ``verb``
        (``kick``, ``unban``) says what a leave of another user means: refused (403) when the target's
        membership is not what it undoes, judged under the room's lock (``policy.verb_refusal``)."""
        content: dict[str, Any] = {"membership": membership}
        if reason is not None:
            content["reason"] = reason
        return (await self._local(room_id, LocalWrite((Draft(MEMBER, sender, content, target, verb=verb),))))[0]

    async def redact(
        self, room_id: str, sender: str, target: str, *, reason: str | None = None, txn_id: str | None = None
    ) -> str:
        """Redact ``target`` (an event of the same room); the redaction's ID."""
        content: dict[str, Any] = {} if reason is None else {"reason": reason}
        txn = Txn(sender, f"redact/{txn_id}", request_hash("redact", room_id, target, content)) if txn_id else None
        return (await self._local(room_id, LocalWrite((Draft(REDACTION, sender, content, None, target),), txn=txn)))[0]

    # -- remote writes -----------------------------------------------------------------------------

    async def persist_remote(
        self,
        room_id: str,
        events: Sequence[RemoteEvent],
        *,
        backfill: bool = False,
        room_version: str | None = None,
    ) -> Persisted:
        """Store complete events as received (see the module docstring of ``persist``).

        The batch's events may come in any order: a room not held yet takes its version from its create
        event wherever it is in the batch, else from ``room_version``; a ``room_version`` given must be
        the room's. A room this instance does not write is refused before anything else
        (:class:`MisdirectedWrite`), a backfilled batch too: ``backfill`` is sharded as ``events`` is."""
        refuse_misdirected(self.host, room_id)
        if room_version is not None:
            try:
                check_room_version(room_version)
            except UnknownRoomVersion as exc:
                raise InvalidEvent(f"room_version: {exc}") from None
        parsed = [_parse_remote(i, item) for i, item in enumerate(events)]
        if not parsed:  # nothing to store: no version needed, nothing held changes
            return Persisted([], [], {})
        version = await self._batch_version(room_id, [event for event, _ in parsed], room_version)
        batch: list[NewEvent] = []
        for i, ((event, fields), item) in enumerate(zip(parsed, events, strict=True)):
            where = f"events[{i}]"
            this_version = _create_version(event) or version  # a create event's ID follows its own version
            if this_version not in LOOSE_JSON_VERSIONS:
                for name in ("depth", "origin_server_ts"):
                    if event[name] > MAX_CANONICAL_INT:
                        raise InvalidEvent(
                            f"{where}.{name}: must be at most 2**53-1 in room version {this_version}, not {event[name]}"
                        )
            if item.event_id is not None and not is_valid_event_id(item.event_id):
                raise InvalidEvent(f"event_ids[{i}]: {item.event_id!r:.60} is not an event ID")
            try:
                computed = _remote_event_id(event, this_version, item.event_id)
            except (EventIdError, UnknownRoomVersion, CanonicalJsonError) as exc:
                raise InvalidEvent(f"{where}.event_id: {exc}") from None
            batch.append(NewEvent(computed, item.raw, event, fields, item.outlier))
        origin = Origin.BACKFILL if backfill else Origin.REMOTE
        return await self.persister.persist(room_id, batch, origin=origin, room_version=version)

    async def _batch_version(self, room_id: str, events: Sequence[Mapping[str, Any]], given: str | None) -> str:
        """The version of a remote batch's room: the held room's, else its create event's (anywhere in the
        batch), else ``given``; a ``given`` version that is not the room's is refused."""
        held = await self._room_version(room_id)
        create = next((v for v in map(_create_version, events) if v is not None), None)
        version = held or create or given
        if version is None:
            raise InvalidEvent(f"room_version: room {room_id} is not held here; give its version or its create event")
        if given is not None and given != version:
            source = "the room held here" if held else "the batch's create event"
            raise InvalidEvent(f"room_version: {source} says room {room_id} is of version {version}, not {given!r}")
        return version

    async def _room_version(self, room_id: str) -> str | None:
        """The room's version (read once per room and process), or None for a room not held here."""
        cached = self.reads.cached_room_version(room_id)
        if cached is not None:  # no connection taken from the pool: a remote batch asks every time
            return cached
        try:
            async with self.host.database().autocommit() as conn:
                return await self.reads.room_version(conn, room_id)
        except UnknownRoom:
            return None


def _parse_remote(index: int, item: RemoteEvent) -> tuple[dict[str, Any], EventFields]:
    """The parsed JSON of a remote event and its indexed fields; :class:`InvalidEvent` naming the field."""
    where = f"events[{index}]"
    if len(item.raw) > MAX_EVENT_BYTES:
        raise InvalidEvent(f"{where}: is {len(item.raw)} bytes of JSON; at most {MAX_EVENT_BYTES} are allowed")
    try:
        event = parse_event_json(item.raw)
        return event, check_event(event, where)
    except (EventJsonError, BadEvent) as exc:
        raise InvalidEvent(f"{where}: {exc}" if isinstance(exc, EventJsonError) else str(exc)) from None


def _create_version(event: Mapping[str, Any]) -> str | None:
    """The room version a create event names (``"1"`` when it names none); None for other events."""
    if event.get("type") != CREATE or event.get("state_key") != "":
        return None
    content = event.get("content")
    return str(content.get("room_version", "1")) if isinstance(content, dict) else "1"


def _remote_event_id(event: Mapping[str, Any], room_version: str, given: str | None) -> str:
    """The ID of a remote event: inside its JSON (room versions 1 and 2, or given there), given beside
    it, or its reference hash (room versions 3 and later); inside and beside must agree."""
    inside = event.get("event_id")
    if inside is not None and not (isinstance(inside, str) and is_valid_event_id(inside)):
        raise EventIdError(f"must be an event ID (a string starting with '$'), not {inside!r:.60}")
    if given is not None and not is_valid_event_id(given):
        raise EventIdError(f"{given!r:.60} is not an event ID")
    if inside is not None and given is not None and inside != given:
        raise EventIdError(f"the ID given beside the event ({given}) differs from the one inside it ({inside})")
    if inside is not None:
        return str(inside)
    if given is not None:
        return given
    return event_id_for(dict(event), room_version)


def _server_of(user_id: str) -> str:
    _, _, server = user_id.partition(":")
    return server or "localhost"


__all__ = ["Draft", "EventsStore", "MisdirectedWrite", "RemoteEvent", "UnknownEvent"]
