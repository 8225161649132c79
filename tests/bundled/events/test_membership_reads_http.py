"""Who reads what of a room, by membership history, through every route that serves events to users.

Table-driven: a room under each history visibility where each user goes through one membership
history (never in the room, invited, rejected an invite, joined, left, rejoined, kicked, banned,
unbanned, re-invited after leaving ...), with a message after each step; then every user's view
through ``GET /events`` (from before the room), ``/rooms/{room}/messages`` (both ways),
``/rooms/{room}/event/{id}`` (every event), ``/rooms/{room}/state`` and ``GET /recent`` is compared
with the model: ``scenario.expect`` (the rules of docs/plugins/events.md, Who sees what, with the
reference's read rules, which the recorded Synapse histories confirm: a user who left now, after a
join or after an invite, reads up to their last member event, not peeking), and for ``/events`` the
documented rule: the rooms a user is joined to, or was joined to and left within the range (up to the
leave, kick or ban that ended their join).
A user who never joined (who only rejected an invite) gets no timeline from ``/events``.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import httpx
import pytest

from factstream.host.app import Host
from tests.bundled.events import scenario
from tests.bundled.events.conftest import SERVER_TOKEN, token_of
from tests.bundled.events.scenario import (
    ALICE,
    VISIBILITIES,
    Clients,
    RoomDriver,
    Seen,
    describe,
    expect,
    history,
    meet,
    walk,
)

#: Each user's membership history, one step per phase (alice invites, kicks, bans and unbans).
HISTORIES: dict[str, tuple[str, ...]] = {
    "never": (),
    "invited": ("invite",),
    "rejected": ("invite", "leave"),
    "withdrawn": ("invite", "kick"),
    "invited_banned": ("invite", "ban"),
    "invited_joined": ("invite", "join"),
    "invited_joined_left": ("invite", "join", "leave"),
    "joined": ("join",),
    "joined_left": ("join", "leave"),
    "rejoined": ("join", "leave", "join"),
    "kicked": ("join", "kick"),
    "banned": ("join", "ban"),
    "unbanned": ("join", "ban", "unban"),
    "left_reinvited": ("join", "leave", "invite"),
    "left_rejected_again": ("join", "leave", "invite", "leave"),
    "rejected_then_joined": ("invite", "leave", "invite", "join"),
}
USERS = {name: f"@{name}:hs" for name in HISTORIES}
TOKENS = {token_of(u): {"user": u} for u in (*USERS.values(), ALICE)} | {
    SERVER_TOKEN: {"user": "@server:hs", "write": True}
}


@pytest.fixture
async def main(host_cluster) -> Host:
    host_cluster.configure(http={"tokens": TOKENS})
    return await host_cluster("main")


async def play(client: Clients, visibility: str) -> RoomDriver:
    """The room: every user's history, step by step, a message after each phase."""
    room = await RoomDriver.create(client, ALICE, preset="public_chat", history_visibility=visibility)
    await room.say(ALICE, "before anyone")
    for phase in range(max(len(h) for h in HISTORIES.values())):
        for name, steps in HISTORIES.items():
            if phase < len(steps):
                user, verb = USERS[name], steps[phase]
                if verb in ("join", "leave"):
                    await room.member(verb, user, label=f"{name} {phase} {verb}")
                else:
                    await room.member(verb, ALICE, user, label=f"{name} {phase} {verb}")
        await room.say(ALICE, f"after phase {phase}")
    return room


# -- the model of GET /events, /state and /recent ---------------------------------------------------------


def events_model(seen: Sequence[Seen], user: str) -> tuple[str, list[tuple[str, str]]] | None:
    """The room in ``GET /events`` from before the room: its ``membership`` and its events with
    their ``unsigned.membership`` (None: the room is not there). Joined now: every event; joined and
    then left: up to the leave, kick or ban that ended their last join; never joined: nothing."""
    end: int | None = None
    membership = "join"
    for i, s in enumerate(seen):
        if not s.own(user):
            continue
        if s.after == "join":
            end, membership = len(seen) - 1, "join"
        elif s.before == "join":
            end, membership = i, str(s.after)
    if end is None:
        return None
    shown = [(s.event["event_id"], s.annotation(user)) for s in seen[: end + 1] if s.visible(user, peeking=False)]
    return membership, shown


def state_after(events: Sequence[Mapping[str, Any]], last: int) -> set[str]:
    state: dict[tuple[str, str], str] = {}
    for event in events[: last + 1]:
        if "state_key" in event:
            state[event["type"], event["state_key"]] = event["event_id"]
    return set(state.values())


def state_model(events: Sequence[Mapping[str, Any]], user: str) -> set[str] | None:
    """``/state`` (None: 403): joined now, or the room world_readable now: the current state; a user
    who left now: the state at their last member event; anyone else: 403."""
    now, now_visibility = scenario.standing(events, user)
    if now == "join":
        return state_after(events, len(events) - 1)
    if now == "leave":
        return state_after(events, max(i for i, e in enumerate(events) if _own(e, user)))
    return state_after(events, len(events) - 1) if now_visibility == "world_readable" else None


def recent_model(events: Sequence[Mapping[str, Any]], user: str) -> list[str] | None:
    """``/recent`` (None: the room is not listed): joined now, every event they may see; invited
    now, their invite; anyone else: not listed."""
    now, _ = scenario.standing(events, user)
    seen = meet(events, user)
    if now == "join":
        return [s.event["event_id"] for s in seen if s.visible(user, peeking=False)]
    if now == "invite":
        return [next(s.event["event_id"] for s in reversed(seen) if s.own(user))]
    return None


def _own(event: Mapping[str, Any], user: str) -> bool:
    return event["type"] == scenario.MEMBER and event.get("state_key") == user


# -- the sweep ------------------------------------------------------------------------------------------------


async def one_users_mismatches(
    c: httpx.AsyncClient, room: RoomDriver, events: list[dict[str, Any]], user: str, since: str
) -> list[str]:
    names = describe(events, room.sent)
    want = expect(events, user)
    out: list[str] = []

    def differ(route: str, got: object, expected: object) -> None:
        if got != expected:
            out.append(f"{user} {route}: got {got}, expected {expected}")

    for direction in ("b", "f"):
        got = await walk(c, room.room_id, direction=direction, limit=20)
        expected = None if want.messages is None else list(want.messages.items())
        if direction == "b" and expected is not None:
            expected.reverse()
        pairs = [(e["event_id"], e["unsigned"]["membership"]) for e in got.events] if got.status == 200 else None
        differ(f"/messages dir={direction}", _named(pairs, names), _named(expected, names))
    for event_id, membership in want.by_id.items():
        r = await c.get(f"/rooms/{room.room_id}/event/{event_id}")
        got_membership = r.json()["unsigned"]["membership"] if r.status_code == 200 else None
        differ(f"/event {names[event_id]}", (r.status_code, got_membership), (200 if membership else 404, membership))

    r = await c.get("/events", params={"from": since, "limit": 100})
    assert r.status_code == 200, r.text
    entry = r.json()["rooms"].get(room.room_id)
    got_entry = None if entry is None else (entry["membership"], _pairs(entry["events"]))
    model = events_model(meet(events, user), user)
    differ("/events", _named_entry(got_entry, names), _named_entry(model, names))
    own = [e["event_id"] for e in events if _own(e, user)]
    mine = [e["event_id"] for e in r.json()["memberships"] if e["room_id"] == room.room_id]
    differ("/events memberships", mine, own)

    r = await c.get(f"/rooms/{room.room_id}/state")
    got_state = {e["event_id"] for e in r.json()} if r.status_code == 200 else None
    differ("/state", r.status_code, 403 if state_model(events, user) is None else 200)
    differ("/state", _names(got_state, names), _names(state_model(events, user), names))

    r = await c.get("/recent", params={"rooms": 1000, "limit": 100})
    listed = {e["room_id"]: e for e in r.json()["rooms"]}
    got_recent = [e["event_id"] for e in listed[room.room_id]["events"]] if room.room_id in listed else None
    differ("/recent", _names(got_recent, names), _names(recent_model(events, user), names))
    return out


def _pairs(events: Sequence[Mapping[str, Any]]) -> list[tuple[str, str]]:
    return [(e["event_id"], e["unsigned"]["membership"]) for e in events]


def _named(pairs: Sequence[tuple[str, str]] | None, names: Mapping[str, str]) -> list[tuple[str, str]] | None:
    return None if pairs is None else [(names[e], m) for e, m in pairs]


def _named_entry(entry: tuple[str, list[tuple[str, str]]] | None, names: Mapping[str, str]) -> object:
    return None if entry is None else (entry[0], _named(entry[1], names))


def _names(ids: set[str] | list[str] | None, names: Mapping[str, str]) -> object:
    if ids is None:
        return None
    return sorted(names[e] for e in ids) if isinstance(ids, set) else [names[e] for e in ids]


@pytest.mark.parametrize("visibility", VISIBILITIES)
async def test_every_membership_history_reads_what_the_rules_allow_through_every_route(main, client, visibility):
    since = {user: (await client(user).get("/events")).json()["next"] for user in USERS.values()}
    room = await play(client, visibility)
    events = await history(main, room.room_id)
    wrong: list[str] = []
    for user in USERS.values():
        wrong += await one_users_mismatches(client(user), room, events, user, since[user])
    assert wrong == [], "\n".join(wrong)
