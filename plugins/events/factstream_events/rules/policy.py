"""The default policy for local events: who may send what, from the room's current state.

A subset of Matrix's authorisation rules (and, for power levels, a little more), enough for a room to
be safe to use: nobody gains a power they were not given, nor takes one from someone at or above
their level. A plugin that implements the ``check_local_event`` hook replaces it; remote events are
stored as given. The rules:

* only the first event of a room may be ``m.room.create``, and a room has one;
* to send anything a user must be joined, except to join (allowed when invited, when the join rule is
  ``public``, or for the creator's first join; never when banned; only for themselves) and to leave
  (allowed when joined, invited or knocking);
* levels (``m.room.power_levels``; without one the creator, as :func:`creator_of` reads the create event,
  has 100 and everyone else 0): a user's
  level is ``users[user]``, else ``users_default`` (0). Inviting needs ``invite`` (0), the target not
  joined or banned; kicking (the leave of a joined, invited or knocking user) needs ``kick`` (50) and
  a level above the target's; banning needs ``ban`` (50) and a level above the target's; unbanning
  (the leave of a banned user) needs both ``ban`` and ``kick`` and a level above the target's;
* any other event needs the level of its type: ``events[type]``, else ``state_default`` for a state
  event (50, or 0 without a power-levels event) and ``events_default`` (0) for the others; a
  redaction needs that too, and ``redact`` (50) unless it redacts the sender's own event; nobody
  may redact the create event;
* a state event whose state key starts with ``@`` may only be sent by that user (Matrix's user-owned
  state);
* a new ``m.room.power_levels`` (state key ``""``) is judged by :func:`power_levels_change`.

The routes that send the ``leave`` of another user name what they mean by it: ``kick`` needs the
target joined, invited or knocking, ``unban`` needs them banned (:func:`verb_refusal`); a leave that
is neither would otherwise pass as the other. This is judged with the rest, on the state under the
room's lock, so nothing can change the target's membership between the check and the write.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from factstream_events.rules.contentrules import LEVEL_MAPS, check_power_levels
from factstream_events.rules.validate import CREATE, MEMBER, POWER_LEVELS, REDACTION, BadEvent


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


_INTEGER = re.compile(r"-?[0-9]+")


def _written(value: object) -> int | None:
    """A level as a stored power-levels event writes it: an integer, or (room versions before 10) a
    string of one; None for anything else."""
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return value
    if isinstance(value, str) and _INTEGER.fullmatch(value):
        try:
            return int(value)
        except ValueError:  # more digits than Python converts
            return None
    return None


def creator_of(create: Mapping[str, Any], room_version: str) -> str | None:
    """The creator a room's create event names: its ``sender`` from room version 11 (which dropped
    ``content.creator`` and ignores one given), ``content.creator`` before; None when it names none."""
    if room_version.isdigit() and int(room_version) >= 11:
        sender = create.get("sender")
        return sender if isinstance(sender, str) else None
    content = create.get("content")
    creator = content.get("creator") if isinstance(content, dict) else None
    return creator if isinstance(creator, str) else None


def _int(value: object, default: int) -> int:
    written = _written(value)
    return default if written is None else written


def user_level(facts: RoomFacts, user: str) -> int:
    pl = facts.power_levels
    if pl is None:
        return 100 if user == facts.creator else 0
    users = pl.get("users")
    written = _written(users.get(user)) if isinstance(users, dict) else None
    return needed(facts, "users_default") if written is None else written


#: The top-level levels of a power-levels event and their values when the event leaves them out.
LEVEL_DEFAULTS = dict(users_default=0, events_default=0, state_default=50, ban=50, kick=50, redact=50, invite=0)
#: The levels in force without a power-levels event.
WITHOUT_POWER_LEVELS = {**LEVEL_DEFAULTS, "state_default": 0}
#: The notification levels the specification gives a default (``@room`` mentions).
NOTIFICATION_DEFAULTS = {"room": 50}


def needed(facts: RoomFacts, key: str) -> int:
    """The level action ``key`` needs (``kick``, ``state_default`` ...): as written, else its default."""
    pl = facts.power_levels
    if pl is None:
        return WITHOUT_POWER_LEVELS[key]
    return _int(pl.get(key), LEVEL_DEFAULTS[key])


def event_level(facts: RoomFacts, event_type: str, is_state: bool) -> int:
    pl = facts.power_levels
    events = pl.get("events") if pl is not None else None
    written = _written(events.get(event_type)) if isinstance(events, dict) else None
    if written is not None:
        return written
    if is_state:
        return needed(facts, "state_default")
    return needed(facts, "events_default")


def check(event: Mapping[str, Any], facts: RoomFacts) -> str | None:
    """Why ``event`` may not be sent (a sentence), or None when it may."""
    event_type = event["type"]
    sender = event["sender"]
    state_key = event.get("state_key")
    if event_type == CREATE:
        return "the room already exists" if facts.exists else None
    if not facts.exists:
        return "the room does not exist"
    if event_type == MEMBER and isinstance(state_key, str):
        content = event.get("content")
        return _check_membership(
            sender, state_key, content.get("membership") if isinstance(content, dict) else None, facts
        )
    if facts.memberships.get(sender) != "join":
        return f"{sender} is not in the room"
    level = user_level(facts, sender)
    need = event_level(facts, event_type, state_key is not None)
    if level < need:
        kind = "state event" if state_key is not None else "event"
        return f"{sender} may not send the {kind} {event_type} (power level {level} < {need})"
    if isinstance(state_key, str) and state_key.startswith("@") and state_key != sender:
        return f"state key {state_key!r} belongs to that user: only they may send it"
    if event_type == POWER_LEVELS and state_key == "":
        content = event.get("content")
        return power_levels_change(sender, facts, content if isinstance(content, dict) else {})
    if event_type == REDACTION:
        return _check_redaction(sender, level, facts)
    return None


def _check_redaction(sender: str, level: int, facts: RoomFacts) -> str | None:
    redacted = facts.redaction_target
    if redacted is not None and redacted[1] == CREATE:
        return "the room's create event cannot be redacted"
    if redacted is not None and redacted[0] == sender:
        return None
    need = needed(facts, "redact")
    return None if level >= need else f"{sender} may not redact others' events (power level {level} < {need})"


def _check_membership(sender: str, target: str, membership: object, facts: RoomFacts) -> str | None:
    mine = facts.memberships.get(sender)
    theirs = facts.memberships.get(target)
    level = user_level(facts, sender)
    target_level = user_level(facts, target)
    if membership == "join":
        if target != sender:
            return "a user can only join for themselves"
        if mine == "ban":
            return f"{sender} is banned from the room"
        if mine in {"join", "invite"} or facts.join_rule == "public":
            return None
        if sender == facts.creator and not facts.memberships:
            return None
        return f"{sender} is not invited and the room's join rule is {facts.join_rule!r}"
    if membership == "leave" and target == sender:
        return None if mine in {"join", "invite", "knock"} else f"{sender} is not in the room"
    if mine != "join":
        return f"{sender} is not in the room"
    if membership == "invite":
        if theirs in {"join", "ban"}:
            return f"{target} is {'already in' if theirs == 'join' else 'banned from'} the room"
        need = needed(facts, "invite")
        return None if level >= need else f"{sender} may not invite (power level {level} < {need})"
    if membership == "leave":
        if theirs == "ban":
            return _outranks(sender, level, "unban", target, target_level, needed(facts, "ban"), facts)
        if theirs not in {"join", "invite", "knock"}:
            return f"{target} is not in the room"
        return _outranks(sender, level, "kick", target, target_level, None, facts)
    if membership == "ban":
        return _outranks(sender, level, "ban", target, target_level, None, facts)
    return f"membership {membership!r} cannot be sent here"


def _outranks(
    sender: str, level: int, action: str, target: str, target_level: int, ban: int | None, facts: RoomFacts
) -> str | None:
    """Kicking, banning and unbanning: the action's level (unbanning: ``ban``, then ``kick``) and a
    level above the target's."""
    need = needed(facts, "ban" if action == "ban" else "kick")
    if ban is not None and level < ban:
        return f"{sender} may not unban {target} (power level {level} < ban level {ban})"
    if level < need or level <= target_level:
        return f"{sender} may not {action} {target} (power level {level}; needs {need} and more than {target_level})"
    return None


# -- m.room.power_levels ----------------------------------------------------------------------------

#: A level of a power-levels event: ``("", field)`` for a top-level one, ``(map, name)`` for an entry
#: of ``users``, ``events`` or ``notifications``.
Slot = tuple[str, str]


@dataclass(frozen=True)
class Levels:
    """A power-levels content read as levels: those it writes, and the defaults it falls back to."""

    written: Mapping[Slot, int]
    defaults: Mapping[str, int]

    @classmethod
    def of(cls, content: Mapping[str, Any] | None, creator: str | None) -> Levels:
        """The levels of a stored content (a value that is not a level counts as absent); of a room
        without a power-levels event (None): the creator at 100, the defaults of such a room."""
        if content is None:
            return cls({("users", creator): 100} if creator else {}, WITHOUT_POWER_LEVELS)
        written: dict[Slot, int] = {}
        for name in LEVEL_DEFAULTS:
            value = _written(content.get(name))
            if value is not None:
                written["", name] = value
        for group in LEVEL_MAPS:
            entries = content.get(group)
            for name, raw in entries.items() if isinstance(entries, dict) else ():
                value = _written(raw)
                if value is not None:
                    written[group, name] = value
        return cls(written, LEVEL_DEFAULTS)

    def in_force(self, slot: Slot) -> int | None:
        """The level in force at ``slot``: the written one, else its default (a user's is
        ``users_default``, ``notifications.room`` 50); None for an unwritten event type (its level
        depends on how it is sent: :meth:`sending`) or other notification."""
        if slot in self.written:
            return self.written[slot]
        group, name = slot
        if group == "":
            return self.defaults[name]
        if group == "users":
            return self.in_force(("", "users_default"))
        return NOTIFICATION_DEFAULTS.get(name) if group == "notifications" else None

    def sending(self, slot: Slot) -> tuple[int | None, ...]:
        """The levels in force at ``slot``: for an unwritten event type, those to send it as a state
        event and as another event (``state_default``, ``events_default``); else :meth:`in_force`."""
        if slot[0] == "events" and slot not in self.written:
            return self.in_force(("", "state_default")), self.in_force(("", "events_default"))
        return (self.in_force(slot),)


def _slot_name(slot: Slot) -> str:
    group, name = slot
    return name if group == "" else f"{group}[{name!r}]"


def power_levels_change(sender: str, facts: RoomFacts, content: Mapping[str, Any]) -> str | None:
    """Why ``sender`` may not replace the room's power levels with ``content`` (a sentence), or None.

    Every level the old or the new content writes, and every top-level level, is compared before and
    after, both as written and as in force (a level left out falls back to its default: a user's to
    ``users_default``, an event type's to ``state_default`` and ``events_default``, as it is sent as
    state or not, ``notifications.room`` to 50). A level changes when one of these differs. The
    sender's level is ``own``. A change is refused when:

    * the old level (written or in force) is above ``own``: nobody changes, or removes, a level
      beyond their reach;
    * the new level (written or in force) is above ``own``: nobody sets a level beyond their own,
      themselves included;
    * it is another user's level, and that user's level in force is at least ``own``: nobody changes
      the level of a peer or a superior (a user may lower their own);
    * it is ``users_default`` and that is at least ``own``: it is the level of every user without an
      entry, peers of the sender among them.

    This holds Matrix's rule for ``m.room.power_levels`` (the authorisation rules of the specification,
    the reference's ``_check_power_levels``) on the written levels, ``notifications`` included, and
    closes what it leaves open through defaults: removing a level that then falls back to a default
    above ``own``, writing a level for an event type (or ``notifications.room``) whose default is above
    ``own``, changing a user who has no entry but is at or above ``own`` by ``users_default``.
    """
    try:
        check_power_levels(content, "power levels: ")  # levels it can compare, as the content rules say
    except BadEvent as exc:
        return str(exc)
    own = user_level(facts, sender)
    old = Levels.of(facts.power_levels, facts.creator)
    new = Levels.of(content, None)
    slots = sorted({*old.written, *new.written, *(("", name) for name in LEVEL_DEFAULTS)})
    for slot in slots:
        before = (old.written.get(slot), *old.sending(slot))
        after = (new.written.get(slot), *new.sending(slot))
        if before == after:
            continue
        name = _slot_name(slot)
        if any(v is not None and v > own for v in before):
            return f"{sender} may not change {name}, now {_shown(before)}: above their power level {own}"
        if any(v is not None and v > own for v in after):
            return f"{sender} may not set {name} to {_shown(after)}: above their power level {own}"
        level_now = old.in_force(slot)
        peer = (slot[0] == "users" and slot[1] != sender) or slot == ("", "users_default")
        if peer and level_now is not None and level_now >= own:
            return f"{sender} may not change {name}, now {level_now}: not below their power level {own}"
    return None


def _shown(levels: tuple[int | None, ...]) -> str:
    written, *in_force = levels
    return "/".join(dict.fromkeys(str(v) for v in in_force)) if written is None else str(written)


#: The target's current membership each verb that sends ``leave`` about another user needs.
VERB_NEEDS = {"kick": ("join", "invite", "knock"), "unban": ("ban",)}


def verb_refusal(verb: str, target: str, facts: RoomFacts) -> str | None:
    """Why ``verb`` (``kick``, ``unban``) of ``target`` is refused given the room's ``facts``; None: it is
    not (any other verb is not judged here)."""
    needs = VERB_NEEDS.get(verb)
    current = facts.memberships.get(target)
    if needs is None or current in needs:
        return None
    done = "kicked" if verb == "kick" else "unbanned"
    now = current or "no membership"
    return f"user_id: {target} cannot be {done}: their membership is {now}, not {' or '.join(needs)}"
