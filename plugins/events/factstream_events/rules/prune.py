"""The Matrix redaction algorithm ("pruning") for room versions 1 to 11.

Redacting an event strips it down to the keys the protocol needs to keep the room's history verifiable:
the top-level keys that place the event in the room graph, and, for a few state event types, the content
keys that authorisation depends on. The same pruned form is what signatures and reference hashes (and so,
from room version 3, event IDs) are computed over, which is why the rules are fixed per room version:

* versions 1-5: the original rules (``m.room.aliases`` keeps ``aliases``);
* version 6: ``m.room.aliases`` is no longer special;
* version 8: ``m.room.join_rules`` also keeps ``allow``;
* version 9: ``m.room.member`` also keeps ``join_authorised_via_users_server``;
* version 11: the top level no longer keeps ``origin``, ``membership`` and ``prev_state``;
  ``m.room.create`` keeps all of its content; ``m.room.power_levels`` also keeps ``invite``;
  ``m.room.redaction`` keeps ``redacts``; ``m.room.member`` keeps ``third_party_invite.signed``.

Pure and dependency-free (standard library only).
"""

from __future__ import annotations

import copy
from dataclasses import dataclass
from typing import Any

__all__ = ["KNOWN_ROOM_VERSIONS", "UnknownRoomVersion", "check_room_version", "prune_event", "redacts_target"]

KNOWN_ROOM_VERSIONS: tuple[str, ...] = ("1", "2", "3", "4", "5", "6", "7", "8", "9", "10", "11")
"""The room versions whose redaction rules this module implements, oldest first."""


class UnknownRoomVersion(ValueError):
    """A room version this module has no redaction rules for."""


@dataclass(frozen=True)
class _Rules:
    """The redaction rules that differ between room versions."""

    aliases_keep_content: bool
    """``m.room.aliases`` keeps ``aliases`` (versions 1-5)."""
    join_rules_keep_allow: bool
    """``m.room.join_rules`` keeps ``allow`` (from version 8, restricted joins)."""
    member_keeps_authoriser: bool
    """``m.room.member`` keeps ``join_authorised_via_users_server`` (from version 9)."""
    updated_rules: bool
    """The version 11 rules (MSC2176, MSC3821, MSC3989)."""


def check_room_version(room_version: str) -> None:
    """Raise :class:`UnknownRoomVersion` unless ``room_version`` is one of :data:`KNOWN_ROOM_VERSIONS`."""
    if not isinstance(room_version, str) or room_version not in KNOWN_ROOM_VERSIONS:
        known = ", ".join(KNOWN_ROOM_VERSIONS)
        raise UnknownRoomVersion(f"unknown room version {room_version!r:.60}: the known versions are {known}")


def _rules(room_version: str) -> _Rules:
    """The rules for ``room_version``; :class:`UnknownRoomVersion` for versions outside 1-11."""
    check_room_version(room_version)
    number = int(room_version)
    return _Rules(
        aliases_keep_content=number <= 5,
        join_rules_keep_allow=number >= 8,
        member_keeps_authoriser=number >= 9,
        updated_rules=number >= 11,
    )


_TOP_LEVEL_KEYS = frozenset(
    {
        "event_id",
        "type",
        "room_id",
        "sender",
        "state_key",
        "content",
        "hashes",
        "signatures",
        "depth",
        "prev_events",
        "auth_events",
        "origin_server_ts",
    }
)
"""Top-level keys every room version keeps."""

_TOP_LEVEL_KEYS_BEFORE_V11 = frozenset({"origin", "membership", "prev_state"})
"""Top-level keys kept up to room version 10 only."""

_POWER_LEVELS_KEYS = frozenset(
    {"ban", "events", "events_default", "kick", "redact", "state_default", "users", "users_default"}
)


def _kept_top_level_keys(rules: _Rules) -> frozenset[str]:
    if rules.updated_rules:
        return _TOP_LEVEL_KEYS
    return _TOP_LEVEL_KEYS | _TOP_LEVEL_KEYS_BEFORE_V11


def _kept_content_keys(event_type: str, rules: _Rules) -> frozenset[str]:
    """The content keys an event of ``event_type`` keeps (``m.room.create`` in version 11 keeps all)."""
    keys: set[str] = set()
    if event_type == "m.room.member":
        keys.add("membership")
        if rules.member_keeps_authoriser:
            keys.add("join_authorised_via_users_server")
    elif event_type == "m.room.create":
        if not rules.updated_rules:
            keys.add("creator")
    elif event_type == "m.room.join_rules":
        keys.add("join_rule")
        if rules.join_rules_keep_allow:
            keys.add("allow")
    elif event_type == "m.room.power_levels":
        keys.update(_POWER_LEVELS_KEYS)
        if rules.updated_rules:
            keys.add("invite")
    elif event_type == "m.room.aliases":
        if rules.aliases_keep_content:
            keys.add("aliases")
    elif event_type == "m.room.history_visibility":
        keys.add("history_visibility")
    elif event_type == "m.room.redaction" and rules.updated_rules:
        keys.add("redacts")
    return frozenset(keys)


def _pruned_content(event_type: object, content: object, rules: _Rules) -> dict[str, Any]:
    """A pruned deep copy of ``content`` (a content that is not an object prunes to ``{}``)."""
    if not isinstance(content, dict) or not isinstance(event_type, str):
        return {}
    if event_type == "m.room.create" and rules.updated_rules:
        return copy.deepcopy(content)
    kept = _kept_content_keys(event_type, rules)
    pruned = {key: copy.deepcopy(value) for key, value in content.items() if key in kept}
    if event_type == "m.room.member" and rules.updated_rules:
        _keep_signed_third_party_invite(content, pruned)
    return pruned


def _keep_signed_third_party_invite(content: dict[str, Any], pruned: dict[str, Any]) -> None:
    """Version 11: keep ``third_party_invite.signed``.

    As Synapse does, an object ``third_party_invite`` without ``signed`` prunes to ``{}``, and one that is
    not an object is dropped.
    """
    invite = content.get("third_party_invite")
    if not isinstance(invite, dict):
        return
    pruned["third_party_invite"] = {"signed": copy.deepcopy(invite["signed"])} if "signed" in invite else {}


def prune_event(event: dict[str, Any], room_version: str) -> dict[str, Any]:
    """The redacted form of ``event`` under the rules of ``room_version`` ("1" to "11").

    Returns a new dict sharing nothing with ``event``, which is never modified. Keys not kept are dropped,
    including ``unsigned`` (callers add back their own). A ``content`` that is not an object becomes ``{}``;
    a missing ``content`` stays missing, and an event without a string ``type`` keeps no content keys, so
    the result's keys are always a subset of the input's. Raises :class:`UnknownRoomVersion` for other
    room versions.
    """
    rules = _rules(room_version)
    kept = _kept_top_level_keys(rules)
    pruned: dict[str, Any] = {}
    for key, value in event.items():
        if key == "content":
            pruned[key] = _pruned_content(event.get("type"), value, rules)
        elif key in kept:
            pruned[key] = copy.deepcopy(value)
    return pruned


def redacts_target(event: dict[str, Any], room_version: str) -> str | None:
    """The ID of the event that the redaction ``event`` redacts, or None.

    Up to room version 10 the target is the top-level ``redacts`` (``content.redacts`` means nothing);
    from version 11 it is ``content.redacts`` only (a top-level ``redacts`` is what clients are served,
    never what the event says). None when ``event`` is not an ``m.room.redaction`` or names no target
    as a string there. Raises :class:`UnknownRoomVersion` for room versions outside 1-11.
    """
    rules = _rules(room_version)
    if event.get("type") != "m.room.redaction":
        return None
    if rules.updated_rules:
        content = event.get("content")
        target = content.get("redacts") if isinstance(content, dict) else None
    else:
        target = event.get("redacts")
    return target if isinstance(target, str) else None
