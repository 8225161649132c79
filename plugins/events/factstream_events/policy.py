"""The default policy for local events: who may send what, from the room's current state.

A small subset of Matrix's authorisation rules, enough for a room to be safe to use (a plugin that
implements the ``check_local_event`` hook replaces it; remote events are stored as given):

* only the first event of a room may be ``m.room.create``, and a room has one;
* to send anything a user must be joined, except to join (allowed when invited, when the join rule is
  ``public``, or for the creator's first join) and to leave (allowed when joined, invited or knocking);
* power levels (``m.room.power_levels``; without one the creator has 100 and everyone else 0):
  state events need ``events[type]`` or ``state_default`` (50, or 0 without a power-levels event),
  other events ``events[type]`` or ``events_default`` (0); inviting needs ``invite`` (0), kicking
  ``kick`` (50) and banning or unbanning ``ban`` (50), each also more than the target's level;
  redacting someone else's event needs ``redact`` (50); nobody may redact the create event;
* nobody may invite a user who is joined or banned, or change another user's membership to join.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from factstream_events.validate import CREATE, MEMBER, REDACTION


@dataclass(frozen=True)
class RoomFacts:
    """What the policy reads of the room's current state."""

    exists: bool
    creator: str | None = None
    power_levels: Mapping[str, Any] | None = None
    join_rule: str = "invite"
    memberships: Mapping[str, str] = field(default_factory=dict)
    #: for a redaction: the target's sender and type, if held in this room
    redaction_target: tuple[str, str] | None = None


def _int(value: object, default: int) -> int:
    if isinstance(value, bool):
        return default
    if isinstance(value, int):
        return value
    if isinstance(value, str) and value.isascii() and value.removeprefix("-").isdigit():
        try:
            return int(value)
        except ValueError:  # more digits than Python converts
            return default
    return default


def user_level(facts: RoomFacts, user: str) -> int:
    pl = facts.power_levels
    if pl is None:
        return 100 if user == facts.creator else 0
    users = pl.get("users")
    if isinstance(users, dict) and user in users:
        return _int(users[user], 0)
    return _int(pl.get("users_default"), 0)


#: The levels in force without a power-levels event (its own defaults are the ``default`` arguments).
_WITHOUT_POWER_LEVELS = {"state_default": 0, "events_default": 0, "invite": 0, "kick": 50, "ban": 50, "redact": 50}


def needed(facts: RoomFacts, key: str, default: int) -> int:
    """The level action ``key`` needs (``kick``, ``state_default`` ...)."""
    pl = facts.power_levels
    if pl is None:
        return _WITHOUT_POWER_LEVELS[key]
    return _int(pl.get(key), default)


def event_level(facts: RoomFacts, event_type: str, is_state: bool) -> int:
    pl = facts.power_levels
    events = pl.get("events") if pl is not None else None
    if isinstance(events, dict) and event_type in events:
        return _int(events[event_type], 0)
    if is_state:
        return needed(facts, "state_default", 50)
    return needed(facts, "events_default", 0)


def check(event: Mapping[str, Any], facts: RoomFacts) -> str | None:
    """Why ``event`` may not be sent (a sentence), or None when it may."""
    event_type = event["type"]
    sender = event["sender"]
    state_key = event.get("state_key")
    if event_type == CREATE:
        return "the room already exists" if facts.exists else None
    if not facts.exists:
        return "the room does not exist"
    mine = facts.memberships.get(sender)
    if event_type == MEMBER and isinstance(state_key, str):
        content = event.get("content")
        membership = content.get("membership") if isinstance(content, dict) else None
        target = facts.memberships.get(state_key)
        level = user_level(facts, sender)
        target_level = user_level(facts, state_key)
        if membership == "join":
            if state_key != sender:
                return "a user can only join for themselves"
            if mine == "ban":
                return f"{sender} is banned from the room"
            if mine in {"join", "invite"} or facts.join_rule == "public":
                return None
            if sender == facts.creator and not facts.memberships:
                return None
            return f"{sender} is not invited and the room's join rule is {facts.join_rule!r}"
        if membership == "invite":
            if mine != "join":
                return f"{sender} is not in the room"
            if target in {"join", "ban"}:
                return f"{state_key} is {'already in' if target == 'join' else 'banned from'} the room"
            if level < needed(facts, "invite", 0):
                return f"{sender} may not invite (power level {level} < {needed(facts, 'invite', 0)})"
            return None
        if membership == "leave":
            if state_key == sender:
                return None if mine in {"join", "invite", "knock"} else f"{sender} is not in the room"
            if mine != "join":
                return f"{sender} is not in the room"
            if target == "ban":
                need = needed(facts, "ban", 50)
                return None if level >= need else f"{sender} may not unban (power level {level} < {need})"
            if target not in {"join", "invite", "knock"}:
                return f"{state_key} is not in the room"
            need = needed(facts, "kick", 50)
            if level < need or level <= target_level:
                return f"{sender} may not kick {state_key} (power level {level}; needs {need}, above {target_level})"
            return None
        if membership == "ban":
            if mine != "join":
                return f"{sender} is not in the room"
            need = needed(facts, "ban", 50)
            if level < need or level <= target_level:
                return (
                    f"{sender} may not ban {state_key} (power level {level}; needs {need} and more than {target_level})"
                )
            return None
        return f"membership {membership!r} cannot be sent here"
    if mine != "join":
        return f"{sender} is not in the room"
    level = user_level(facts, sender)
    if event_type == REDACTION:
        redacted = facts.redaction_target
        if redacted is not None and redacted[1] == CREATE:
            return "the room's create event cannot be redacted"
        if redacted is not None and redacted[0] == sender:
            return None
        need = needed(facts, "redact", 50)
        return None if level >= need else f"{sender} may not redact others' events (power level {level} < {need})"
    need = event_level(facts, event_type, state_key is not None)
    if level < need:
        kind = "state event" if state_key is not None else "event"
        return f"{sender} may not send the {kind} {event_type} (power level {level} < {need})"
    return None
