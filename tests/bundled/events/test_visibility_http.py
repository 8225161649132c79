"""History visibility end to end (docs/plugins/events.md, Who sees what): rooms built through the public routes, read
back through ``/rooms/{room}/messages``, ``/rooms/{room}/event/{id}`` and ``/rooms/{room}/state`` by
every kind of user, against real PostgreSQL.

Two kinds of tests:

* sweeps: a room with a member of every kind (joined, joined late, invited and never joined, left,
  kicked, banned, rejected an invite, left and came back, never in the room) under each visibility,
  and a room that goes through all twelve changes between the four values, each user's view compared
  with ``scenario.expect`` (the rules written from their text, with the reference's read rules), including
  ``unsigned.membership`` on every event shown;
* one test per rule and per consequence observed in the reference (listed after the rules), with the events named.

The named tests at the end were found as leaks (a departed, banned or invited user reading by ID,
and peeking invited or banned readers of a world_readable room); the sweeps now cover those cases too.
"""

from __future__ import annotations

import pytest

from factstream.host.app import Host
from tests.bundled.events import scenario
from tests.bundled.events.scenario import (
    ALICE,
    BOB,
    CAROL,
    DAVE,
    EVE,
    FRED,
    GINA,
    HANK,
    HV,
    IVAN,
    JUDY,
    PEOPLE,
    VISIBILITIES,
    Clients,
    RoomDriver,
    expect,
    history,
    mismatches,
    post_remote,
    remote_event,
    walk,
)


@pytest.fixture
async def main(host_cluster) -> Host:
    """The events host, with a token for each of ``scenario.PEOPLE``."""
    host_cluster.configure(http={"tokens": scenario.TOKENS})
    return await host_cluster("main")


async def every_kind_of_member(client: Clients, visibility: str) -> RoomDriver:
    """A public room made by alice under ``visibility`` where each other user ends up a different kind
    of member: bob invited then joined, carol invited and never joined, dave joined last, eve left,
    fred kicked, gina banned, hank left and came back, judy rejected an invite, ivan never came."""
    room = await RoomDriver.create(client, ALICE, preset="public_chat", history_visibility=visibility, name="every")
    await room.say(ALICE, "first words")
    await room.member("invite", ALICE, BOB, label="bob invited")
    await room.say(ALICE, "while bob is invited")
    await room.member("invite", ALICE, CAROL, label="carol invited")
    await room.member("join", BOB, label="bob joins")
    await room.say(BOB, "bob speaks")
    for user in (EVE, FRED, GINA, HANK):
        await room.member("join", user, label=f"{user} joins")
    await room.say(ALICE, "all aboard")
    await room.member("leave", EVE, label="eve leaves")
    await room.say(ALICE, "after eve left")
    await room.member("kick", ALICE, FRED, label="fred kicked")
    await room.member("ban", ALICE, GINA, label="gina banned")
    await room.member("leave", HANK, label="hank leaves")
    await room.say(ALICE, "while hank is away")
    await room.member("invite", ALICE, JUDY, label="judy invited")
    await room.say(ALICE, "while judy is invited")
    await room.member("leave", JUDY, label="judy rejects")
    await room.member("join", HANK, label="hank is back")
    await room.member("join", DAVE, label="dave joins")
    await room.say(DAVE, "dave speaks")
    await room.say(ALICE, "last words")
    return room


@pytest.mark.parametrize("visibility", VISIBILITIES)
async def test_sweep_every_kind_of_member_sees_what_section_7_allows(main, client, visibility):
    room = await every_kind_of_member(client, visibility)
    events = await history(main, room.room_id)
    wrong = []
    for user in PEOPLE:
        wrong += await mismatches(client, room, events, user)
    assert wrong == []


#: A path through all twelve changes between two different visibilities (an Eulerian circuit).
CYCLE = ("world_readable", "shared", "invited", "joined", "world_readable", "invited", "shared", "joined",
         "shared", "world_readable", "joined", "invited", "world_readable")  # fmt: skip


async def test_sweep_visibility_changing_mid_room_keeps_each_event_at_the_value_it_was_sent_under(main, client):
    """Each event is judged by the visibility in force when it was sent (a later change does not
    reach back), and a change by the wider of its two sides; memberships move between the changes."""
    cycle = CYCLE
    room = await RoomDriver.create(client, ALICE, preset="public_chat", history_visibility=cycle[0])
    moves = {
        1: [("invite", ALICE, BOB), ("join", EVE, None)],
        2: [("invite", ALICE, CAROL)],
        3: [("join", BOB, None)],
        4: [("leave", EVE, None), ("join", DAVE, None)],
        5: [("join", FRED, None)],
        6: [("leave", BOB, None), ("invite", ALICE, JUDY)],
        7: [("kick", ALICE, FRED)],
        8: [("leave", JUDY, None)],
        9: [("join", BOB, None), ("join", GINA, None)],
        10: [("ban", ALICE, GINA)],
    }
    for step, value in enumerate(cycle):
        if step:
            await room.visibility(ALICE, value, label=f"change {step} to {value}")
        await room.say(ALICE, f"under {value} ({step})")
        for verb, actor, target in moves.get(step, []):
            await room.member(verb, actor, target, label=f"{verb} {target or actor} ({step})")
            await room.say(ALICE, f"after {verb} {target or actor} ({step})")
    events = await history(main, room.room_id)
    wrong = []
    for user in PEOPLE:
        wrong += await mismatches(client, room, events, user)
    assert wrong == []


# -- who may read at all -----------------------------------------------------------------------------------


WHO_MAY_PAGE = {
    # /messages answers 403 to the invited-never-joined, the banned and strangers; a kicked user and one
    # who rejected an invite page up to their leave
    "shared": {ALICE: 200, BOB: 200, CAROL: 403, DAVE: 200, EVE: 200, FRED: 200, GINA: 403, HANK: 200, IVAN: 403,
               JUDY: 200},
    "joined": {CAROL: 403, GINA: 403, IVAN: 403, EVE: 200, FRED: 200, JUDY: 200},
    # ... unless the room is world_readable now
    "world_readable": {CAROL: 200, GINA: 200, IVAN: 200, EVE: 200},
}  # fmt: skip


async def test_who_may_page_messages(main, client):
    for visibility, statuses in WHO_MAY_PAGE.items():
        room = await every_kind_of_member(client, visibility)
        for user, status in statuses.items():
            r = await client(user).get(f"/rooms/{room.room_id}/messages")
            assert r.status_code == status, (visibility, user, r.text)
            if status == 403:
                assert r.json()["errcode"] == "M_FORBIDDEN"


async def test_a_stranger_and_a_peeker(main, client):
    """Nobody outside a non-world_readable room reads anything of it; a peeker of a world_readable room
    reads its world_readable events, but not the creation events before its visibility event."""
    closed = await RoomDriver.create(client, ALICE, preset="public_chat", history_visibility="shared")
    secret = await closed.say(ALICE, "members only")
    ivan = client(IVAN)
    assert (await ivan.get(f"/rooms/{closed.room_id}/messages")).status_code == 403
    assert (await ivan.get(f"/rooms/{closed.room_id}/state")).status_code == 403
    assert (await ivan.get(f"/rooms/{closed.room_id}/event/{secret}")).status_code == 404
    assert (await ivan.get(f"/rooms/{closed.room_id}/state", params={"at": secret})).status_code == 404

    open_ = await RoomDriver.create(client, ALICE, preset="public_chat", history_visibility="world_readable")
    hello = await open_.say(ALICE, "hello world")
    events = await history(main, open_.room_id)
    seen = await walk(ivan, open_.room_id, direction="f", limit=2)
    hv = next(e["event_id"] for e in events if e["type"] == HV)
    assert seen.ids == [hv, hello]
    assert [e["unsigned"]["membership"] for e in seen.events] == ["leave", "leave"]
    r = await ivan.get(f"/rooms/{open_.room_id}/event/{events[0]['event_id']}")
    assert r.status_code == 404, "the create event is read under the default shared: not for a peeker"
    r = await ivan.get(f"/rooms/{open_.room_id}/state")
    assert r.status_code == 200
    state_keys = {(e["type"], e["state_key"]) for e in events if "state_key" in e}
    assert {(e["type"], e["state_key"]) for e in r.json()} == state_keys


# -- the rules, one by one -----------------------------------------------------------------------------------


async def test_creation_events_before_the_first_visibility_event_are_shared(main, client):
    for visibility in ("invited", "joined"):
        room = await RoomDriver.create(
            client, ALICE, preset="public_chat", history_visibility=visibility, name="named after", topic="t"
        )
        before = await room.say(ALICE, "before dave")
        await room.member("join", DAVE, label="dave joins")
        events = await history(main, room.room_id)
        types = [e["type"] for e in events]
        assert types[:5] == ["m.room.create", "m.room.member", "m.room.power_levels", "m.room.join_rules", HV]
        got = await walk(client(DAVE), room.room_id, direction="f", limit=50)
        # the five events up to the visibility event (itself judged as the wider shared), then his join;
        # the name and topic were sent after it, under the room's visibility, as was alice's message
        assert got.ids == [e["event_id"] for e in events[:5]] + [room.sent["dave joins"]], visibility
        assert before not in got.ids
        assert [e["unsigned"]["membership"] for e in got.events] == ["leave"] * 5 + ["join"]


async def test_a_change_is_visible_from_both_sides_and_old_events_keep_their_visibility(main, client):
    room = await RoomDriver.create(client, ALICE, preset="public_chat", history_visibility="joined")
    old = await room.say(ALICE, "said under joined")
    opened = await room.visibility(ALICE, "world_readable")
    new = await room.say(ALICE, "said under world_readable")
    ivan = client(IVAN)
    assert (await walk(ivan, room.room_id, limit=1)).ids == [new, opened]
    closed = await room.visibility(ALICE, "joined")
    later = await room.say(ALICE, "said under joined again")
    # the room is no longer world_readable: no paging, but what was sent world_readable stays so,
    # and so does the change that closed it (the wider side of it is world_readable)
    assert (await ivan.get(f"/rooms/{room.room_id}/messages")).status_code == 403
    for event_id, status in ((old, 404), (opened, 200), (new, 200), (closed, 200), (later, 404)):
        r = await ivan.get(f"/rooms/{room.room_id}/event/{event_id}")
        assert r.status_code == status, (room.sent, event_id, r.text)
    # a member who joins now sees the joined-era events only from his join on
    await room.member("join", DAVE)
    shown = (await walk(client(DAVE), room.room_id, limit=100)).ids
    assert old not in shown and later not in shown
    assert {opened, new, closed} <= set(shown)


async def test_shared_history_for_a_late_joiner_and_a_departed_member(main, client):
    room = await RoomDriver.create(client, ALICE, preset="public_chat", history_visibility="shared")
    early = await room.say(ALICE, "before anyone")
    await room.member("join", EVE)
    during = await room.say(ALICE, "with eve")
    leave = await room.member("leave", EVE)
    after = await room.say(ALICE, "after eve")
    await room.member("join", DAVE)
    dave = (await walk(client(DAVE), room.room_id, limit=4)).ids
    assert {early, during, leave, after} <= set(dave)
    # eve sees everything up to and including her leave, nothing after, whichever way she pages
    for direction in ("b", "f"):
        eve = await walk(client(EVE), room.room_id, direction=direction, limit=2)
        assert {early, during, leave} <= set(eve.ids) and after not in eve.ids
        assert eve.events[-1 if direction == "f" else 0]["event_id"] == leave
        assert eve.events[-1 if direction == "f" else 0]["unsigned"]["membership"] == "leave"
    # a token from past her leave (alice's newest) is clamped to her leave
    top = (await client(ALICE).get(f"/rooms/{room.room_id}/messages", params={"limit": 1})).json()
    r = await client(EVE).get(f"/rooms/{room.room_id}/messages", params={"from": top["start"], "limit": 1})
    assert [e["event_id"] for e in r.json()["chunk"]] == [leave]
    r = await client(EVE).get(f"/rooms/{room.room_id}/messages", params={"from": top["end"], "dir": "f", "limit": 10})
    assert after not in [e["event_id"] for e in r.json()["chunk"]]


async def test_invited_history_starts_at_the_invite(main, client):
    room = await RoomDriver.create(client, ALICE, preset="private_chat", history_visibility="invited")
    before = await room.say(ALICE, "before the invite")
    invite = await room.member("invite", ALICE, BOB)
    between = await room.say(ALICE, "bob is invited")
    join = await room.member("join", BOB)
    after = await room.say(BOB, "bob is in")
    got = await walk(client(BOB), room.room_id, direction="f", limit=2)
    assert got.ids[-4:] == [invite, between, join, after] and before not in got.ids
    assert [e["unsigned"]["membership"] for e in got.events[-4:]] == ["invite", "invite", "join", "join"]
    # invited and never joined: /messages refuses, but the events from the invite on are readable by ID
    await room.member("invite", ALICE, CAROL)
    carol_era = await room.say(ALICE, "carol is invited")
    carol = client(CAROL)
    assert (await carol.get(f"/rooms/{room.room_id}/messages")).status_code == 403
    r = await carol.get(f"/rooms/{room.room_id}/event/{carol_era}")
    assert r.status_code == 200 and r.json()["unsigned"]["membership"] == "invite"
    assert (await carol.get(f"/rooms/{room.room_id}/event/{between}")).status_code == 404


async def test_joined_history_for_a_member_who_comes_back_and_for_a_late_joiner(main, client):
    room = await RoomDriver.create(client, ALICE, preset="public_chat", history_visibility="joined")
    joined = await room.member("join", HANK)
    first = await room.say(ALICE, "first stay")
    leave = await room.member("leave", HANK)
    gap = await room.say(ALICE, "while hank is away")
    back = await room.member("join", HANK)
    second = await room.say(ALICE, "second stay")
    got = await walk(client(HANK), room.room_id, limit=3)
    assert gap not in got.ids
    assert got.ids[:5] == [second, back, leave, first, joined]
    marks = {e["event_id"]: e["unsigned"]["membership"] for e in got.events}
    assert (marks[first], marks[leave], marks[back], marks[second]) == ("join", "leave", "join", "join")
    assert (await client(HANK).get(f"/rooms/{room.room_id}/event/{gap}")).status_code == 404

    # a late joiner pages through pages that filtering left empty: they still carry an end
    for i in range(7):
        await room.say(ALICE, f"before dave {i}")
    join = await room.member("join", DAVE)
    mine = await room.say(DAVE, "dave's only message")
    got = await walk(client(DAVE), room.room_id, limit=2)
    assert 0 in got.pages, "filtering after the query leaves pages empty, and paging goes on past them"
    events = await history(main, room.room_id)
    assert got.ids == list(reversed(expect(events, DAVE).messages or {}))
    assert got.ids[:2] == [mine, join]


async def test_kicked_banned_and_rejected_see_their_own_leave(main, client):
    room = await RoomDriver.create(client, ALICE, preset="public_chat", history_visibility="joined")
    for user in (FRED, GINA):
        await room.member("join", user)
    kick = await room.member("kick", ALICE, FRED)
    ban = await room.member("ban", ALICE, GINA)
    invite = await room.member("invite", ALICE, JUDY)
    reject = await room.member("leave", JUDY)
    fred = await walk(client(FRED), room.room_id, limit=5)
    assert fred.ids[0] == kick and fred.events[0]["unsigned"]["membership"] == "leave"
    judy = await walk(client(JUDY), room.room_id, limit=5)
    # under joined she never saw the room: her rejection (a leave after an invite), then only the
    # creation events before the visibility event (shared)
    events = await history(main, room.room_id)
    assert judy.ids == [reject] + [e["event_id"] for e in reversed(events[:5])] and invite not in judy.ids
    gina = client(GINA)
    assert (await gina.get(f"/rooms/{room.room_id}/messages")).status_code == 403
    r = await gina.get(f"/rooms/{room.room_id}/event/{ban}")
    assert r.status_code == 200 and r.json()["unsigned"]["membership"] == "ban"


async def test_dummy_and_aliases_events_are_never_shown(main, client):
    room = await RoomDriver.create(client, ALICE, preset="public_chat", history_visibility="world_readable")
    dummy = await room.send(ALICE, "m.room.dummy", {})
    aliases = await room.state(ALICE, "m.room.aliases", {"aliases": ["#x:hs"]}, key="hs")
    shown = await room.say(ALICE, "visible")
    for user in (ALICE, IVAN):  # a member, a peeker
        got = await walk(client(user), room.room_id, limit=5)
        assert shown in got.ids and dummy not in got.ids and aliases not in got.ids
        for event_id in (dummy, aliases):
            assert (await client(user).get(f"/rooms/{room.room_id}/event/{event_id}")).status_code == 404


async def test_state_for_each_kind_of_member(main, client):
    room = await RoomDriver.create(client, ALICE, preset="public_chat", history_visibility="shared", name="one")
    for user in (EVE, FRED, GINA, HANK):
        await room.member("join", user)
    await room.member("invite", ALICE, CAROL)
    eve_leave = await room.member("leave", EVE)
    await room.member("kick", ALICE, FRED, label="kick")
    await room.member("ban", ALICE, GINA)
    await room.member("leave", HANK)
    name_two = await room.state(ALICE, "m.room.name", {"name": "two"})
    await room.member("join", HANK)

    async def state_of(user: str) -> tuple[int, dict[tuple[str, str], dict]]:
        r = await client(user).get(f"/rooms/{room.room_id}/state")
        if r.status_code != 200:
            return r.status_code, {}
        return 200, {(e["type"], e["state_key"]): e for e in r.json()}

    for user in (ALICE, HANK):  # joined, and joined again
        status, state = await state_of(user)
        assert status == 200 and state[("m.room.name", "")]["event_id"] == name_two
        assert state[("m.room.member", HANK)]["content"]["membership"] == "join"
    # departed: the state at their leave (the room's name then, their own leave)
    status, state = await state_of(EVE)
    eve_state = {e["event_id"] for e in state.values()}
    assert status == 200 and state[("m.room.name", "")]["content"]["name"] == "one"
    assert state[("m.room.member", EVE)]["event_id"] == eve_leave
    assert ("m.room.member", GINA) in state and state[("m.room.member", GINA)]["content"]["membership"] == "join"
    status, state = await state_of(FRED)
    assert status == 200 and state[("m.room.member", FRED)]["event_id"] == room.sent["kick"]
    assert state[("m.room.name", "")]["content"]["name"] == "one"
    for user in (CAROL, GINA, IVAN):  # invited, banned, stranger
        assert (await state_of(user))[0] == 403, user

    # the state after an event the user may see; an event they may not see answers 404
    r = await client(EVE).get(f"/rooms/{room.room_id}/state", params={"at": eve_leave})
    assert r.status_code == 200
    assert {e["event_id"] for e in r.json()} == eve_state
    r = await client(IVAN).get(f"/rooms/{room.room_id}/state", params={"at": name_two})
    assert r.status_code == 404, "a stranger reads no state of a shared room"


async def test_an_outlier_is_shown_only_as_its_users_own_membership(main, client):
    room_id = "!faraway:elsewhere"
    create, c = remote_event(room_id, "m.room.create", "@zed:elsewhere", {"room_version": "10"}, [], 1, state_key="")
    await post_remote(client, room_id, [create])
    invite, i = remote_event(
        room_id, "m.room.member", "@zed:elsewhere", {"membership": "invite"}, ["$unknown1"], 9, state_key=BOB
    )
    note, n = remote_event(room_id, "m.room.message", "@zed:elsewhere", {"body": "out of band"}, ["$unknown2"], 9)
    await post_remote(client, room_id, [invite, note], outlier=True)
    r = await client(BOB).get(f"/rooms/{room_id}/event/{i}")
    assert r.status_code == 200, r.text
    assert r.json()["unsigned"]["membership"] == "invite" and r.json()["content"] == {"membership": "invite"}
    for user, event_id in ((BOB, n), (CAROL, i), (CAROL, n)):
        assert (await client(user).get(f"/rooms/{room_id}/event/{event_id}")).status_code == 404, (user, event_id)
    assert c


# -- leaks found once, kept as named tests --------------------------------------------------


async def test_a_departed_user_cannot_read_events_after_their_leave_by_id(main, client):
    room = await RoomDriver.create(client, ALICE, preset="public_chat", history_visibility="shared")
    for user in (EVE, FRED):
        await room.member("join", user)
    await room.member("invite", ALICE, JUDY)
    await room.member("leave", EVE)
    await room.member("kick", ALICE, FRED)
    await room.member("leave", JUDY)
    secret = await room.say(ALICE, "said after they all left")
    renamed = await room.state(ALICE, "m.room.name", {"name": "renamed after they left"})
    for user in (EVE, FRED, JUDY):
        assert secret not in (await walk(client(user), room.room_id)).ids  # /messages stops at the leave
        r = await client(user).get(f"/rooms/{room.room_id}/event/{secret}")
        assert r.status_code == 404, (user, r.text)
        # nor the state after such an event (GET /state?at= checks the event with the same read)
        r = await client(user).get(f"/rooms/{room.room_id}/state", params={"at": renamed})
        assert r.status_code == 404, (user, r.text)


async def test_a_banned_user_cannot_read_events_after_the_ban_by_id(main, client):
    room = await RoomDriver.create(client, ALICE, preset="public_chat", history_visibility="shared")
    await room.member("join", GINA)
    await room.member("ban", ALICE, GINA)
    secret = await room.say(ALICE, "said after the ban")
    assert (await client(GINA).get(f"/rooms/{room.room_id}/messages")).status_code == 403
    r = await client(GINA).get(f"/rooms/{room.room_id}/event/{secret}")
    assert r.status_code == 404, r.text


async def test_an_invited_user_reads_no_shared_history_before_joining(main, client):
    room = await RoomDriver.create(client, ALICE, preset="private_chat", history_visibility="shared")
    history_ = await room.say(ALICE, "before carol was invited")
    await room.member("invite", ALICE, CAROL)
    r = await client(CAROL).get(f"/rooms/{room.room_id}/event/{history_}")
    assert r.status_code == 404, r.text
    await room.member("join", CAROL)
    r = await client(CAROL).get(f"/rooms/{room.room_id}/event/{history_}")
    assert r.status_code == 200 and r.json()["unsigned"]["membership"] == "leave"


async def test_invited_and_banned_readers_of_a_world_readable_room_are_peekers(main, client):
    room = await RoomDriver.create(client, ALICE, preset="public_chat", history_visibility="shared")
    own = {GINA: [await room.member("join", GINA), await room.member("ban", ALICE, GINA)]}
    await room.member("invite", ALICE, CAROL)  # sent under shared: a peeker does not see even their invite
    own[CAROL] = []
    secret = await room.say(ALICE, "said under shared after the ban")
    await room.visibility(ALICE, "world_readable")
    public = await room.say(ALICE, "said under world_readable")
    stranger = (await walk(client(IVAN), room.room_id)).ids
    assert public in stranger and secret not in stranger
    for user in (GINA, CAROL):
        shown = (await walk(client(user), room.room_id)).ids
        assert secret not in shown, user
        # a peeker like the stranger, who also sees their own member events (Who sees what, rule 4)
        assert [e for e in shown if e not in own[user]] == stranger, user
        assert set(own[user]) <= set(shown), user
