"""Room histories built the way another server sends them: complete events of room version 10 with their
own ``prev_events``, ``depth``, ``auth_events`` and ``hashes``, and IDs by the reference-hash rule
(``factstream_events.rules.eventid``), persisted as remote events (the fastest public write path)."""

from __future__ import annotations

import base64
import hashlib
import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from factstream_events.rules.canonical import CanonicalJsonError
from factstream_events.rules.eventid import content_hash, event_id_for
from factstream_events.store import EventsStore, RemoteEvent

ROOM_VERSION = "10"
#: How a test writes an event's JSON (the bytes the server receives).
Writer = Callable[[dict[str, Any]], bytes]


def compact(event: dict[str, Any]) -> bytes:
    return json.dumps(event, separators=(",", ":"), ensure_ascii=False).encode()


@dataclass(frozen=True, slots=True)
class Built:
    """One event as sent: the parsed form, its ID and its bytes."""

    event: dict[str, Any]
    event_id: str
    raw: bytes

    @property
    def type(self) -> str:
        return str(self.event["type"])

    @property
    def state_key(self) -> str | None:
        return self.event.get("state_key")

    @property
    def depth(self) -> int:
        return int(self.event["depth"])


@dataclass
class RemoteRoom:
    """A room's history as a remote server builds it; :meth:`add` appends to the chain by default."""

    room_id: str
    events: list[Built] = field(default_factory=list)
    state: dict[tuple[str, str], str] = field(default_factory=dict)
    depths: dict[str, int] = field(default_factory=dict)

    def add(
        self,
        event_type: str,
        sender: str,
        content: dict[str, Any],
        *,
        state_key: str | None = None,
        prev: Sequence[str] | None = None,
        depth: int | None = None,
        redacts: str | None = None,
        write: Writer = compact,
        append: bool = True,
    ) -> Built:
        """A new event after ``prev`` (default: the last event appended) at ``depth`` (default: one
        deeper than the deepest prev); appended to the chain (and its state) unless ``append`` is false."""
        if prev is None:
            prev = [self.events[-1].event_id] if self.events else []
        if depth is None:
            depth = max((self.depths[p] for p in prev if p in self.depths), default=0) + 1
        event: dict[str, Any] = {
            "room_id": self.room_id,
            "type": event_type,
            "sender": sender,
            "content": content,
            "prev_events": list(prev),
            "depth": depth,
            "origin_server_ts": 1_600_000_000_000 + depth % 10**9,
            "auth_events": self._auth_events(event_type, sender, state_key),
        }
        if state_key is not None:
            event["state_key"] = state_key
        if redacts is not None:
            event["redacts"] = redacts
        try:
            event["hashes"] = {"sha256": content_hash(event)}
        except CanonicalJsonError:  # a float or a large integer in the content: hashed as sent instead
            digest = hashlib.sha256(write(event)).digest()
            event["hashes"] = {"sha256": base64.b64encode(digest).decode().rstrip("=")}
        raw = write(event)
        try:
            event_id = event_id_for(event, ROOM_VERSION)
        except CanonicalJsonError:  # its pruned form keeps such a number: an ID to give beside it
            event_id = "$" + base64.urlsafe_b64encode(hashlib.sha256(raw).digest()).decode().rstrip("=")
        built = Built(event, event_id, raw)
        self.depths[event_id] = depth
        if append:
            self.events.append(built)
            if state_key is not None:
                self.state[(event_type, state_key)] = built.event_id
        return built

    def _auth_events(self, event_type: str, sender: str, state_key: str | None) -> list[str]:
        keys = [("m.room.create", ""), ("m.room.power_levels", ""), ("m.room.member", sender)]
        if event_type == "m.room.member" and state_key is not None:
            keys += [("m.room.member", state_key), ("m.room.join_rules", "")]
        return list(dict.fromkeys(self.state[k] for k in keys if k in self.state))

    def create(self, creator: str, *, history_visibility: str = "shared", write: Writer = compact) -> None:
        """The room's first events: create, the creator's join, power levels, public join rules and
        ``history_visibility``."""
        self.add(
            "m.room.create", creator, {"room_version": ROOM_VERSION, "creator": creator}, state_key="", write=write
        )
        self.add("m.room.member", creator, {"membership": "join"}, state_key=creator, write=write)
        levels = {"users": {creator: 100}, "users_default": 0, "events_default": 0, "state_default": 50}
        self.add("m.room.power_levels", creator, levels, state_key="", write=write)
        self.add("m.room.join_rules", creator, {"join_rule": "public"}, state_key="", write=write)
        self.add(
            "m.room.history_visibility",
            creator,
            {"history_visibility": history_visibility},
            state_key="",
            write=write,
        )


async def persist(
    store: EventsStore, room_id: str, events: Sequence[Built], *, batch: int = 100, backfill: bool = False
) -> None:
    """Persist ``events`` through the Python API in batches of ``batch``, checking each is stored."""
    for start in range(0, len(events), batch):
        chunk = events[start : start + batch]
        outcome = await store.persist_remote(
            room_id, [RemoteEvent(b.raw) for b in chunk], backfill=backfill, room_version=ROOM_VERSION
        )
        assert sorted(outcome.stored) == sorted(b.event_id for b in chunk), outcome
