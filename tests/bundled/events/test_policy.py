"""The default local policy (``factstream_events.rules.policy``): who may send what.

* the power-levels rule, over random power-levels contents, senders' levels and changes: compared with
  a reference model of the rule written below, with Matrix's own rule (everything it refuses, the
  policy refuses), and checked for what it must guarantee (nobody gains a level, nobody moves a peer
  or a superior);
* the membership and level rules, table-driven over the levels of the sender and the target;
* the takeover of the issue through HTTP: a moderator at 50 cannot give themselves 100 and the creator
  0, nor ban the creator.
"""

from __future__ import annotations

import itertools
from collections.abc import Mapping
from typing import Any

import pytest
from factstream_events.rules.eventid import content_hash, event_id_for
from factstream_events.rules.policy import (
    LEVEL_DEFAULTS,
    WITHOUT_POWER_LEVELS,
    RoomFacts,
    check,
    event_level,
    power_levels_change,
    user_level,
)
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.bundled.events.conftest import reads_of, store_of

ME = "@me:hs"
CREATOR = "@creator:hs"
USERS = (ME, CREATOR, "@peer:hs", "@low:hs")
#: Someone no content names: their level is always ``users_default``.
NOBODY = "@nobody:hs"
FIELDS = tuple(LEVEL_DEFAULTS)
TYPES = ("m.room.name", "m.room.power_levels", "org.example.x")
LEVELS = (-1, 0, 1, 49, 50, 51, 99, 100, 101)


# -- a reference model of the power-levels rule ------------------------------------------------------------


def _levels(content: Mapping[str, Any] | None) -> dict[str, int | None]:
    """Every level a content writes, by a flat name (``ban``, ``users/@me:hs``, ``events/m.room.name``)."""
    if content is None:
        return {f"users/{CREATOR}": 100}
    flat: dict[str, int | None] = {f: content[f] for f in FIELDS if f in content}
    for group in ("users", "events", "notifications"):
        flat |= {f"{group}/{k}": v for k, v in content.get(group, {}).items()}
    return flat


def _in_force(content: Mapping[str, Any] | None, name: str) -> int | None:
    """The level a content puts in force for ``name`` (None: an unwritten event type, whose level
    depends on how it is sent, or an unwritten notification other than ``room``)."""
    written = _levels(content)
    if name in written:
        return written[name]
    defaults = WITHOUT_POWER_LEVELS if content is None else LEVEL_DEFAULTS
    if name in defaults:
        return defaults[name]
    if name.startswith("users/"):
        return _in_force(content, "users_default")
    if name == "notifications/room":
        return 50
    return None


def _sending(content: Mapping[str, Any] | None, name: str) -> tuple[int | None, ...]:
    """The levels in force for ``name``: for an event type, the level to send it as a state event and
    as another event (``state_default`` and ``events_default`` when it is not written)."""
    if name.startswith("events/") and name not in _levels(content):
        return _in_force(content, "state_default"), _in_force(content, "events_default")
    return (_in_force(content, name),)


def model_allows(me: str, old: Mapping[str, Any] | None, new: Mapping[str, Any]) -> bool:
    """The rule as the docs state it: a level changes when what is written or what is in force
    differs; no change may touch a level above the sender's, set one above it, or move another user
    (``users_default``: every user without an entry) who is at or above it."""
    own = _in_force(old, f"users/{me}")
    assert own is not None
    for name in {*_levels(old), *_levels(new), *FIELDS}:
        was = (_levels(old).get(name), *_sending(old, name))
        now = (_levels(new).get(name), *_sending(new, name))
        if was == now:
            continue
        if any(v is not None and v > own for v in (*was, *now)):
            return False
        someone_else = (name.startswith("users/") and name != f"users/{me}") or name == "users_default"
        if someone_else and was[1] is not None and was[1] >= own:
            return False
    return True


def matrix_refuses(me: str, own: int, old: Mapping[str, Any], new: Mapping[str, Any]) -> bool:
    """Matrix's own rule (the specification's authorisation rules for ``m.room.power_levels``), on the
    written levels only."""
    old_flat, new_flat = _levels(old), _levels(new)
    for name in {*old_flat, *new_flat}:
        was, now = old_flat.get(name), new_flat.get(name)
        if was == now:
            continue
        if name.startswith("users/") and name != f"users/{me}" and was is not None and was >= own:
            return True
        if (was is not None and was > own) or (now is not None and now > own):
            return True
    return False


# -- random contents -------------------------------------------------------------------------------------

levels = st.sampled_from(LEVELS)


@st.composite
def contents(draw: st.DrawFn) -> dict[str, Any]:
    content: dict[str, Any] = {f: draw(levels) for f in draw(st.sets(st.sampled_from(FIELDS)))}
    for group, names in (("users", USERS), ("events", TYPES), ("notifications", ("room",))):
        if draw(st.booleans()):
            content[group] = {n: draw(levels) for n in draw(st.sets(st.sampled_from(names)))}
    return content


@st.composite
def changes(draw: st.DrawFn) -> tuple[dict[str, Any] | None, dict[str, Any]]:
    """An old content (None: the room has none) and a new one, often the old with a few edits."""
    old = None if draw(st.integers(0, 9)) == 0 else draw(contents())
    if old is None or draw(st.booleans()):
        return old, draw(contents())
    new = {k: (dict(v) if isinstance(v, dict) else v) for k, v in old.items()}
    for _ in range(draw(st.integers(1, 3))):
        group = draw(st.sampled_from(("", "users", "events", "notifications")))
        names = {"": FIELDS, "users": USERS, "events": TYPES, "notifications": ("room",)}[group]
        name = draw(st.sampled_from(names))
        where = new if group == "" else new.setdefault(group, {})
        if draw(st.booleans()):
            where[name] = draw(levels)
        else:
            where.pop(name, None)
    return old, new


def facts_of(old: Mapping[str, Any] | None) -> RoomFacts:
    return RoomFacts(True, CREATOR, old, "invite", {ME: "join"})


def everyone(old: Mapping[str, Any] | None, new: Mapping[str, Any]) -> set[str]:
    return {*USERS, NOBODY, *(old or {}).get("users", {}), *new.get("users", {})}


@settings(max_examples=800, deadline=None)
@given(changes())
def test_the_power_levels_rule_agrees_with_the_model(change: tuple[dict[str, Any] | None, dict[str, Any]]) -> None:
    old, new = change
    refusal = power_levels_change(ME, facts_of(old), new)
    assert (refusal is None) == model_allows(ME, old, new), refusal


@settings(max_examples=800, deadline=None)
@given(changes())
def test_the_power_levels_rule_refuses_all_that_matrix_refuses(
    change: tuple[dict[str, Any] | None, dict[str, Any]],
) -> None:
    old, new = change
    own = _in_force(old, f"users/{ME}")
    assert own is not None
    if old is not None and matrix_refuses(ME, own, old, new):
        assert power_levels_change(ME, facts_of(old), new) is not None


@settings(max_examples=800, deadline=None)
@given(changes())
def test_an_allowed_change_gives_nobody_power_and_moves_no_peer(
    change: tuple[dict[str, Any] | None, dict[str, Any]],
) -> None:
    """What the rule is for, stated on the levels in force of every user (those named and one no
    content names) and of every action."""
    old, new = change
    if power_levels_change(ME, facts_of(old), new) is not None:
        return
    own = _in_force(old, f"users/{ME}")
    assert own is not None
    for user in everyone(old, new):
        was, now = _in_force(old, f"users/{user}"), _in_force(new, f"users/{user}")
        assert was is not None and now is not None
        if was != now:
            assert now <= own, f"{user} raised above the sender's level"
            assert user == ME or was < own, f"{user}, at or above the sender's level, moved"
    for name in FIELDS:
        was, now = _in_force(old, name), _in_force(new, name)
        if was != now:
            assert was is not None and now is not None and max(was, now) <= own, name
    # sending any event type, as state or not, and notifying the room: levels as the policy reads them
    facts_old, facts_new = facts_of(old), facts_of(new)
    for event_type, is_state in itertools.product((*TYPES, "org.example.unnamed"), (True, False)):
        was, now = event_level(facts_old, event_type, is_state), event_level(facts_new, event_type, is_state)
        if was != now:
            assert max(was, now) <= own, f"the level to send {event_type} (state: {is_state}) moved beyond reach"
    was, now = _in_force(old, "notifications/room"), _in_force(new, "notifications/room")
    if was != now:
        assert was is not None and now is not None and max(was, now) <= own, "notifications.room"


@pytest.mark.parametrize(
    ("content", "field"),
    [
        ({"ban": "50"}, "ban"),
        ({"kick": True}, "kick"),
        ({"users": [ME]}, "users"),
        ({"users": {ME: 1.5}}, "users"),
        ({"events": {"m.room.name": None}}, "events"),
        ({"notifications": "all"}, "notifications"),
    ],
)
def test_a_new_power_levels_content_must_be_integers(content: dict[str, Any], field: str) -> None:
    refusal = power_levels_change(CREATOR, facts_of({"users": {CREATOR: 100}}), content)
    assert refusal is not None and refusal.startswith(f"power levels: {field}")


@pytest.mark.parametrize("stored", ["high", "1.5", "--5", None, True, 1.5, [50], {"x": 1}])
def test_a_stored_level_that_is_no_integer_counts_as_absent(stored: Any) -> None:
    """A remote room's power levels may hold anything: a value that is not a level is the default it
    stands for (``events[type]``: ``state_default`` / ``events_default``; ``users[user]``:
    ``users_default``), never 0."""
    pl = {"users": {CREATOR: 100, ME: stored}, "users_default": 20, "events": {"m.room.name": stored, "x": stored}}
    pl |= {"state_default": 60, "events_default": 30}
    facts = RoomFacts(True, CREATOR, pl, "invite", {ME: "join"})
    assert user_level(facts, ME) == 20
    assert event_level(facts, "m.room.name", True) == 60
    assert event_level(facts, "x", False) == 30
    refusal = check({"type": "m.room.name", "sender": ME, "state_key": "", "content": {"name": "n"}}, facts)
    assert refusal is not None and "20 < 60" in refusal


def test_a_stored_level_that_is_no_integer_does_not_break_the_policy() -> None:
    old = {"users": {CREATOR: "100", ME: "--5"}, "ban": "²", "events": ["x"]}
    assert power_levels_change(CREATOR, facts_of(old), {"users": {CREATOR: 100}}) is None
    assert power_levels_change(ME, facts_of(old), {"users": {CREATOR: 0, ME: 0}}) is not None


# -- the other rules, by level ------------------------------------------------------------------------------

PL = {"users": {CREATOR: 100, ME: 50, "@peer:hs": 50, "@low:hs": 10}, "kick": 50, "ban": 60, "redact": 50}
PL_EVENTS = {**PL, "events": {"m.room.redaction": 60, "m.room.topic": 40}}


def member(sender: str, target: str, membership: str) -> dict[str, Any]:
    return {"type": "m.room.member", "sender": sender, "state_key": target, "content": {"membership": membership}}


def room(pl: Mapping[str, Any], **memberships: str) -> RoomFacts:
    names = {"me": ME, "creator": CREATOR, "peer": "@peer:hs", "low": "@low:hs"}
    return RoomFacts(True, CREATOR, pl, "invite", {names[k]: v for k, v in memberships.items()})


@pytest.mark.parametrize(
    ("sender", "target", "membership", "target_now", "allowed"),
    [
        # kick needs kick (50) and a level above the target's
        ("creator", "me", "leave", "join", True),
        ("me", "low", "leave", "join", True),
        ("me", "low", "leave", "invite", True),
        ("me", "peer", "leave", "join", False),  # equal
        ("me", "creator", "leave", "join", False),  # higher
        ("low", "me", "leave", "join", False),
        # ban needs ban (60) and a level above the target's
        ("creator", "peer", "ban", "join", True),
        ("me", "low", "ban", "join", False),  # 50 < ban 60
        ("creator", "creator", "ban", "join", False),
        # unban needs ban (60), kick (50) and a level above the target's
        ("creator", "me", "leave", "ban", True),
        ("me", "low", "leave", "ban", False),
        ("creator", "creator", "leave", "ban", False),
        # invite needs invite (0); never a joined or banned user
        ("low", "peer", "invite", None, True),
        ("low", "peer", "invite", "join", False),
        ("creator", "peer", "invite", "ban", False),
        # nobody joins for someone else
        ("creator", "peer", "join", "invite", False),
    ],
)
def test_membership_changes_by_level(
    sender: str, target: str, membership: str, target_now: str | None, allowed: bool
) -> None:
    users = {"me": ME, "creator": CREATOR, "peer": "@peer:hs", "low": "@low:hs"}
    memberships = {sender: "join"} | ({target: target_now} if target_now else {})
    if sender == target and target_now:
        memberships[sender] = target_now
    facts = room(PL, **memberships)
    refusal = check(member(users[sender], users[target], membership), facts)
    assert (refusal is None) == allowed, refusal


def test_unbanning_a_higher_user_is_refused_even_with_the_ban_level() -> None:
    pl = {"users": {CREATOR: 100, ME: 60}, "ban": 60, "kick": 50}
    assert check(member(ME, CREATOR, "leave"), room(pl, me="join", creator="ban")) is not None
    assert check(member(ME, "@low:hs", "leave"), room(pl, me="join", low="ban")) is None


@pytest.mark.parametrize(
    ("sender", "target_sender", "target_type", "pl", "allowed"),
    [
        (ME, ME, "m.room.message", PL, True),  # one's own event
        (ME, CREATOR, "m.room.message", PL, True),  # redact 50
        ("@low:hs", CREATOR, "m.room.message", PL, False),
        ("@low:hs", "@low:hs", "m.room.message", PL, True),
        (CREATOR, CREATOR, "m.room.create", PL, False),
        (ME, ME, "m.room.message", PL_EVENTS, False),  # m.room.redaction needs 60
        (CREATOR, ME, "m.room.message", PL_EVENTS, True),
    ],
)
def test_redactions_by_level(
    sender: str, target_sender: str, target_type: str, pl: Mapping[str, Any], allowed: bool
) -> None:
    facts = RoomFacts(True, CREATOR, pl, "invite", {sender: "join"}, (target_sender, target_type))
    refusal = check({"type": "m.room.redaction", "sender": sender, "content": {}, "redacts": "$x"}, facts)
    assert (refusal is None) == allowed, refusal


@pytest.mark.parametrize(
    ("sender", "event_type", "state_key", "pl", "allowed"),
    [
        ("@low:hs", "m.room.name", "", PL, False),  # state_default 50
        (ME, "m.room.name", "", PL, True),
        ("@low:hs", "m.room.message", None, PL, True),  # events_default 0
        ("@low:hs", "m.room.topic", "", PL_EVENTS, False),  # events[type] 40
        (ME, "m.room.topic", "", PL_EVENTS, True),
        (ME, "org.example.profile", ME, PL, True),  # a user's own state
        (CREATOR, "org.example.profile", ME, PL, False),  # someone else's, whatever the level
        (ME, "m.room.name", "", None, True),  # without power levels: state_default 0
    ],
)
def test_sending_needs_the_level_of_the_event_type(
    sender: str, event_type: str, state_key: str | None, pl: Mapping[str, Any] | None, allowed: bool
) -> None:
    facts = RoomFacts(True, CREATOR, pl, "invite", {sender: "join"})
    event: dict[str, Any] = {"type": event_type, "sender": sender, "content": {}}
    if state_key is not None:
        event["state_key"] = state_key
    refusal = check(event, facts)
    assert (refusal is None) == allowed, refusal


def test_a_moderator_cannot_send_power_levels_beyond_their_own() -> None:
    facts = room(PL, me="join")
    event = {"type": "m.room.power_levels", "sender": ME, "state_key": ""}
    takeover = {**PL, "users": {CREATOR: 0, ME: 100}}
    assert check({**event, "content": takeover}, facts) is not None
    assert check({**event, "content": {**PL, "users": {**PL["users"], "@low:hs": 50}}}, facts) is None
    assert check({**event, "content": {**PL, "users": {**PL["users"], "@peer:hs": 0}}}, facts) is not None
    assert check({**event, "content": {**PL, "users": {**PL["users"], ME: 0}}}, facts) is None  # lowering oneself
    # another power-levels state key is not the room's power levels
    assert check({**event, "state_key": "x", "content": takeover}, facts) is None


# -- the takeover of the issue, through HTTP ----------------------------------------------------------------


async def test_a_moderator_cannot_take_over_a_room(main, client):
    alice, bob = "@alice:hs", "@bob:hs"
    room_id = await store_of(main).create_room(alice, preset="public_chat")
    await store_of(main).change_membership(room_id, bob, bob, "join")
    levels = {"users": {alice: 100, bob: 50}, "users_default": 0, "state_default": 50, "ban": 50, "kick": 50}
    r = await client(alice).put(f"/rooms/{room_id}/state/m.room.power_levels", json=levels)
    assert r.status_code == 200, r.text

    takeover = {**levels, "users": {alice: 0, bob: 100}}
    r = await client(bob).put(f"/rooms/{room_id}/state/m.room.power_levels", json=takeover)
    assert r.status_code == 403 and r.json()["errcode"] == "M_FORBIDDEN", r.text
    r = await client(bob).put(f"/rooms/{room_id}/state/m.room.power_levels", json={**levels, "users": {bob: 50}})
    assert r.status_code == 403, "removing the creator's entry lowers them to users_default"
    r = await client(bob).post(f"/rooms/{room_id}/ban", json={"user_id": alice})
    assert r.status_code == 403 and r.json()["errcode"] == "M_FORBIDDEN", r.text

    state = await reads_of(main).state_ids(room_id)
    rows = await main.api.database().fetchall(
        "SELECT membership FROM events WHERE event_id = %(e)s", {"e": state[("m.room.member", alice)]}
    )
    assert rows == [("join",)]
    r = await client(alice).get(f"/rooms/{room_id}/state")
    power = next(e for e in r.json() if e["type"] == "m.room.power_levels")
    assert power["content"] == levels
    # what stays allowed: a moderator raising a newcomer to their own level
    r = await client(bob).put(
        f"/rooms/{room_id}/state/m.room.power_levels", json={**levels, "users": {**levels["users"], "@carol:hs": 50}}
    )
    assert r.status_code == 200, r.text


async def test_a_moderator_cannot_open_an_event_type_beyond_their_level(main, client):
    """In a room whose ``state_default`` (or ``events_default``) is above a moderator's level, the
    moderator who may change power levels cannot write a level for an event type it does not name:
    that type's level in force is the default, beyond their reach (the reference allows it: the type
    has no written level before)."""
    alice, bob = "@alice:hs", "@bob:hs"
    room_id = await store_of(main).create_room(alice, preset="public_chat")
    await store_of(main).change_membership(room_id, bob, bob, "join")
    levels = {"users": {alice: 100, bob: 50}, "state_default": 100, "events_default": 100}
    levels |= {"events": {"m.room.power_levels": 50}}
    r = await client(alice).put(f"/rooms/{room_id}/state/m.room.power_levels", json=levels)
    assert r.status_code == 200, r.text
    for event_type in ("m.room.name", "m.room.message", "m.room.join_rules"):
        opened = {**levels, "events": {**levels["events"], event_type: 50}}
        r = await client(bob).put(f"/rooms/{room_id}/state/m.room.power_levels", json=opened)
        assert r.status_code == 403 and "above their power level 50" in r.json()["error"], r.text
    r = await client(bob).put(f"/rooms/{room_id}/state/m.room.name", json={"name": "mine"})
    assert r.status_code == 403, r.text
    # what stays allowed: a type already at or below the moderator's level, moved within it
    r = await client(bob).put(
        f"/rooms/{room_id}/state/m.room.power_levels", json={**levels, "events": {"m.room.power_levels": 40}}
    )
    assert r.status_code == 200, r.text


# -- the creator, as the room version names it --------------------------------------------------------------

ZED = "@zed:elsewhere"


def _remote(
    room_id: str,
    version: str,
    event_type: str,
    sender: str,
    content: dict[str, Any],
    prev: list[str],
    state_key: str | None = None,
) -> tuple[dict[str, Any], str]:
    """A complete remote event of ``version`` (hashed) and its ID."""
    event: dict[str, Any] = {"room_id": room_id, "type": event_type, "sender": sender, "content": content}
    event |= {"prev_events": prev, "depth": len(prev) + 1, "origin_server_ts": 1, "auth_events": []}
    if state_key is not None:
        event["state_key"] = state_key
    event["hashes"] = {"sha256": content_hash(event)}
    return event, event_id_for(event, version)


@pytest.mark.parametrize(
    ("version", "sender", "named", "creator"),
    [
        ("11", "@alice:hs", None, "@alice:hs"),  # version 11: the create's sender
        ("11", ZED, "@alice:hs", None),  # ... whatever its content says
        ("10", ZED, "@alice:hs", "@alice:hs"),  # before 11: content.creator
        ("10", "@alice:hs", None, None),
    ],
)
async def test_the_creator_is_the_one_the_room_version_names(main, client, version, sender, named, creator):
    """A room without power levels (a remote one): its creator has 100, everyone else 0. The creator is
    the create event's sender in room version 11, ``content.creator`` before."""
    room_id = f"!v{version}{sender[1:4]}:elsewhere"
    content: dict[str, Any] = {"room_version": version} | ({"creator": named} if named else {})
    create, create_id = _remote(room_id, version, "m.room.create", sender, content, [], "")
    events, prev = [create], [create_id]
    for user in ("@alice:hs", "@bob:hs", ZED):
        event, event_id = _remote(room_id, version, "m.room.member", user, {"membership": "join"}, prev, user)
        events.append(event)
        prev = [event_id]
    r = await client("server").post(f"/rooms/{room_id}/remote_events", json={"events": events})
    assert r.status_code == 200, r.text
    # the creator has 100 (kicks anyone); anyone else 0 (kicks nobody)
    r = await client("@alice:hs").post(f"/rooms/{room_id}/kick", json={"user_id": "@bob:hs"})
    assert (r.status_code == 200) == (creator == "@alice:hs"), r.text
    if creator is None:
        assert r.json()["errcode"] == "M_FORBIDDEN"
