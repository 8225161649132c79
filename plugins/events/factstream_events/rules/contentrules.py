"""What the Matrix client-server API requires of a local event of a type the plugin interprets.

:func:`check_local_content` runs on every event this server creates (``send``, ``state``, the
membership routes, ``redact``, ``createRoom``), before the local policy, and raises
:class:`~factstream_events.rules.validate.BadEvent` naming the field at fault. It checks shape and type
only; who may send what is the policy's (``factstream_events.rules.policy``). Remote events are stored as
received: a remote server's event may hold anything :func:`~factstream_events.rules.validate.check_event`
accepts.

The rules (the reference checks the same for the types it validates; this plugin adds the types it
reads itself):

* the state types the plugin reads (create, member, power levels, join rules, history visibility, name,
  topic) are state events: sent without a state key they would be stored but never read;
  ``m.room.redaction`` is never a state event and always names its target (the ``redact`` route);
* ``m.room.member``: the state key is a user ID, ``membership`` one of the five memberships;
* ``m.room.power_levels``: ``ban``, ``events_default``, ``invite``, ``kick``, ``redact``,
  ``state_default``, ``users_default`` integers; ``events``, ``notifications`` and ``users`` objects of
  integers, the keys of ``users`` user IDs (integers as JSON numbers, not strings, in every room version);
* ``m.room.join_rules``: ``join_rule`` one the room version knows; ``m.room.history_visibility``:
  ``history_visibility`` one of the four visibilities;
* ``m.room.name`` ``name``, ``m.room.topic`` ``topic``, ``m.room.message`` ``msgtype`` and ``body``:
  present and strings; a ``reason`` (member events, redactions) is a string.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Mapping
from typing import Any

from factstream_events.rules.canonical import MAX_CANONICAL_INT, MIN_CANONICAL_INT
from factstream_events.rules.validate import (
    CREATE,
    HISTORY_VISIBILITY,
    JOIN_RULES,
    MAX_ID_LENGTH,
    MEMBER,
    MEMBERSHIPS,
    POWER_LEVELS,
    REDACTION,
    BadEvent,
)

NAME = "m.room.name"
TOPIC = "m.room.topic"
MESSAGE = "m.room.message"
#: The types the plugin reads only as state: each needs a state key.
STATE_TYPES = frozenset({CREATE, MEMBER, POWER_LEVELS, JOIN_RULES, HISTORY_VISIBILITY, NAME, TOPIC})
HISTORY_VISIBILITIES = ("world_readable", "shared", "invited", "joined")
#: The power-levels fields that are one level each, and those that map names to levels.
LEVELS = ("ban", "events_default", "invite", "kick", "redact", "state_default", "users_default")
LEVEL_MAPS = ("events", "notifications", "users")

#: A user ID: ``@``, a localpart (no ``:``, whitespace or control characters), ``:`` and a server name
#: (a DNS name, IPv4 address or bracketed IPv6 address, and an optional port).
_USER_ID = re.compile(r"@[^:\s\x00-\x1f\x7f]+:(?:\[[0-9A-Fa-f:.]+\]|[A-Za-z0-9.-]+)(?::[0-9]{1,5})?")


def is_user_id(value: object) -> bool:
    """Whether ``value`` is a user ID (``@localpart:server.name``, at most 255 characters)."""
    return isinstance(value, str) and len(value) <= MAX_ID_LENGTH and _USER_ID.fullmatch(value) is not None


def join_rules_of(room_version: str) -> tuple[str, ...]:
    """The join rules ``room_version`` knows: ``knock`` from version 7, ``restricted`` from 8,
    ``knock_restricted`` from 10."""
    number = int(room_version) if room_version.isdigit() else 0
    later = (("knock", 7), ("restricted", 8), ("knock_restricted", 10))
    return ("invite", "private", "public", *(rule for rule, since in later if number >= since))


REDACT_ROUTE = "redact with PUT /rooms/{room_id}/redact/{event_id}/{txn_id}"


def state_route(event_type: str) -> str:
    """How a client sets state of ``event_type`` (for refusals of it elsewhere)."""
    key = "/{user_id}" if event_type == MEMBER else ""
    return f"set it with PUT /rooms/{{room_id}}/state/{event_type}{key}"


def check_local_content(event: Mapping[str, Any], room_version: str, where: str = "") -> None:
    """Raise :class:`BadEvent` for the first field of local ``event`` the rules (module docstring)
    refuse; ``where`` prefixes the field names (``initial_state[2].``)."""
    event_type = event["type"]
    content = event["content"]
    state_key = event.get("state_key")
    if event_type in STATE_TYPES and state_key is None:
        raise BadEvent(f"{where}type: {event_type} is a state event: {state_route(event_type)}")
    if event_type == REDACTION and (state_key is not None or event.get("redacts") is None):
        raise BadEvent(f"{where}type: {REDACTION} names the event it redacts: {REDACT_ROUTE}")
    check = _CHECKS.get(event_type)
    if check is not None:
        check(content, f"{where}content.", room_version)
    if event_type == MEMBER and not is_user_id(state_key):
        raise BadEvent(f"{where}state_key: an m.room.member event's state key must be a user ID, not {state_key!r:.60}")


def _strings(content: Mapping[str, Any], where: str, *names: str) -> None:
    for name in names:
        if name not in content:
            raise BadEvent(f"{where}{name}: is missing")
        if not isinstance(content[name], str):
            raise BadEvent(f"{where}{name}: must be a string, not {_kind(content[name])}")


def _optional_string(content: Mapping[str, Any], where: str, name: str) -> None:
    if name in content and not isinstance(content[name], str):
        raise BadEvent(f"{where}{name}: must be a string, not {_kind(content[name])}")


def _one_of(content: Mapping[str, Any], where: str, name: str, allowed: tuple[str, ...] | frozenset[str]) -> None:
    value = content.get(name)
    if not isinstance(value, str) or value not in allowed:
        got = f"{value!r:.40}" if isinstance(value, str) else _kind(value) if name in content else "missing"
        raise BadEvent(f"{where}{name}: must be one of {', '.join(sorted(allowed))}, not {got}")


def _level(value: object, where: str) -> None:
    if not isinstance(value, int) or isinstance(value, bool) or not MIN_CANONICAL_INT <= value <= MAX_CANONICAL_INT:
        raise BadEvent(f"{where}: must be an integer from -(2**53)+1 to 2**53-1 (a power level), not {_kind(value)}")


def check_power_levels(content: Mapping[str, Any], where: str = "") -> None:
    """:class:`BadEvent` naming the first field of a power-levels ``content`` that is not a level (an
    integer in canonical JSON's range), an object of levels, or (``users``) keyed by user IDs."""
    for name in LEVELS:
        if name in content:
            _level(content[name], f"{where}{name}")
    for name in LEVEL_MAPS:
        if name not in content:
            continue
        levels = content[name]
        if not isinstance(levels, dict):
            raise BadEvent(f"{where}{name}: must be an object of power levels, not {_kind(levels)}")
        for key, value in levels.items():
            if name == "users" and not is_user_id(key):
                raise BadEvent(f"{where}users: the key {key!r:.60} is not a user ID")
            _level(value, f"{where}{name}.{key:.60}")


def _member(content: Mapping[str, Any], where: str, room_version: str) -> None:
    _one_of(content, where, "membership", MEMBERSHIPS)
    _optional_string(content, where, "reason")


def _kind(value: object) -> str:
    """A JSON value as messages show it: ``a string``, ``a list``, ``an object``, or the number,
    boolean or null itself."""
    kinds: dict[type, str] = {str: "a string", list: "a list", dict: "an object"}
    return kinds.get(type(value)) or json.dumps(value)[:40]


_CHECKS: dict[str, Callable[[Mapping[str, Any], str, str], None]] = {
    MEMBER: _member,
    POWER_LEVELS: lambda c, w, v: check_power_levels(c, w),
    JOIN_RULES: lambda c, w, v: _one_of(c, w, "join_rule", join_rules_of(v)),
    HISTORY_VISIBILITY: lambda c, w, v: _one_of(c, w, "history_visibility", HISTORY_VISIBILITIES),
    NAME: lambda c, w, v: _strings(c, w, "name"),
    TOPIC: lambda c, w, v: _strings(c, w, "topic"),
    MESSAGE: lambda c, w, v: _strings(c, w, "msgtype", "body"),
    REDACTION: lambda c, w, v: _optional_string(c, w, "reason"),
}
