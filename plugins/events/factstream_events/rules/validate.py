"""Checking one event's JSON before anything is stored: every refusal names the field that was wrong.

:func:`check_event` takes the parsed JSON of an event (remote, or built locally) and returns the
fields the store indexes (:class:`EventFields`); :class:`BadEvent` says what was wrong and where
(``events[3].depth: must be an integer from 0 to 2**63-1, not -1``).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

#: The largest event, as the reference's federation limit: 65,536 bytes of JSON.
MAX_EVENT_BYTES = 65_536
MAX_DEPTH = 2**63 - 1
MAX_PREV_EVENTS = 20
MAX_ID_LENGTH = 255
MEMBER = "m.room.member"
CREATE = "m.room.create"
REDACTION = "m.room.redaction"
HISTORY_VISIBILITY = "m.room.history_visibility"
POWER_LEVELS = "m.room.power_levels"
JOIN_RULES = "m.room.join_rules"
#: Event types a client is never shown (docs/plugins/events.md, Who sees what, rule 1).
NEVER_SHOWN = frozenset({"m.room.dummy", "m.room.aliases"})
MEMBERSHIPS = frozenset({"join", "invite", "knock", "leave", "ban"})


class BadEvent(ValueError):
    """An event that cannot be stored; the message names the field."""


@dataclass(frozen=True, slots=True)
class EventFields:
    """What the store indexes of one event (the JSON itself is kept as received)."""

    room_id: str
    type: str
    sender: str
    state_key: str | None
    depth: int
    origin_server_ts: int
    prev_events: tuple[str, ...]
    content: Mapping[str, Any]
    membership: str | None
    relates_to: str | None

    @property
    def is_state(self) -> bool:
        return self.state_key is not None


def _string(
    event: Mapping[str, Any], key: str, where: str, *, required: bool = True, limit: int = MAX_ID_LENGTH
) -> Any:
    value = event.get(key)
    if value is None:
        if required or key in event:
            raise BadEvent(f"{where}.{key}: {'is missing' if key not in event else 'must be a string, not null'}")
        return None
    if not isinstance(value, str):
        raise BadEvent(f"{where}.{key}: must be a string, not {type(value).__name__}")
    if required and not value:
        raise BadEvent(f"{where}.{key}: must not be empty")
    if len(value) > limit:
        raise BadEvent(f"{where}.{key}: is {len(value)} characters long; at most {limit} are allowed")
    return value


def _integer(event: Mapping[str, Any], key: str, where: str, low: int, high: int) -> int:
    if key not in event:
        raise BadEvent(f"{where}.{key}: is missing")
    value = event[key]
    if not isinstance(value, int) or isinstance(value, bool) or not low <= value <= high:
        raise BadEvent(f"{where}.{key}: must be an integer from {low} to {high}, not {value!r}")
    return value


def check_event(event: Mapping[str, Any], where: str = "event") -> EventFields:
    """The indexed fields of ``event``; :class:`BadEvent` naming the first field that is wrong."""
    room_id = _string(event, "room_id", where)
    if not room_id.startswith("!"):
        raise BadEvent(f"{where}.room_id: must start with '!', not {room_id[:40]!r}")
    event_type = _string(event, "type", where)
    sender = _string(event, "sender", where)
    if not sender.startswith("@"):
        raise BadEvent(f"{where}.sender: must be a user ID starting with '@', not {sender[:40]!r}")
    state_key = event.get("state_key")
    if "state_key" in event and not isinstance(state_key, str):
        raise BadEvent(f"{where}.state_key: must be a string, not {type(state_key).__name__}")
    if isinstance(state_key, str) and len(state_key) > MAX_ID_LENGTH:
        raise BadEvent(f"{where}.state_key: is {len(state_key)} characters long; at most {MAX_ID_LENGTH} are allowed")
    depth = _integer(event, "depth", where, 0, MAX_DEPTH)
    ts = _integer(event, "origin_server_ts", where, 0, MAX_DEPTH)
    content = event.get("content")
    if not isinstance(content, dict):
        raise BadEvent(
            f"{where}.content: must be an object, not {type(content).__name__ if 'content' in event else 'missing'}"
        )
    prev = event.get("prev_events")
    if not isinstance(prev, list):
        got = type(prev).__name__ if "prev_events" in event else "missing"
        raise BadEvent(f"{where}.prev_events: must be a list of event IDs, not {got}")
    if len(prev) > MAX_PREV_EVENTS:
        raise BadEvent(f"{where}.prev_events: has {len(prev)} entries; at most {MAX_PREV_EVENTS} are allowed")
    prev_ids: list[str] = []
    for i, item in enumerate(prev):
        # Room versions 1 and 2 list [event_id, {hashes}] pairs; later versions bare IDs.
        value = item[0] if isinstance(item, list) and item else item
        if not isinstance(value, str) or not value.startswith("$") or len(value) > MAX_ID_LENGTH:
            raise BadEvent(
                f"{where}.prev_events[{i}]: must be an event ID (a string starting with '$'), not {item!r:.60}"
            )
        prev_ids.append(value)
    membership = None
    if event_type == MEMBER:
        if state_key is None:
            raise BadEvent(f"{where}.state_key: a m.room.member event needs the user ID it is about")
        membership = content.get("membership")
        if membership not in MEMBERSHIPS:
            raise BadEvent(
                f"{where}.content.membership: must be one of {', '.join(sorted(MEMBERSHIPS))}, not {membership!r:.40}"
            )
    return EventFields(
        room_id=room_id,
        type=event_type,
        sender=sender,
        state_key=state_key,
        depth=depth,
        origin_server_ts=ts,
        prev_events=tuple(dict.fromkeys(prev_ids)),
        content=content,
        membership=membership,
        relates_to=relation_target(content),
    )


def relation_target(content: Mapping[str, Any]) -> str | None:
    """The event a ``content`` relates to: ``m.relates_to.event_id`` when ``m.relates_to`` is an object
    with a string ``rel_type`` and a string ``event_id``; anything else is no relation (a reply's
    ``m.in_reply_to`` alone, a ``rel_type`` that is not a string), as the Matrix spec reads it."""
    relates = content.get("m.relates_to")
    if not isinstance(relates, dict) or not isinstance(relates.get("rel_type"), str):
        return None
    target = relates.get("event_id")
    return target if isinstance(target, str) else None
