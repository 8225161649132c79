"""Redactions end to end (docs/plugins/events.md, Redactions), through the HTTP routes against real PostgreSQL: pruned
on read with ``unsigned.redacted_because``, the stored bytes kept for the server, redactions of
redactions, loops, targets that arrive late or never, other rooms, and the power to redact.
"""

from __future__ import annotations

import hashlib

import pytest

from factstream.host.app import Host
from tests.bundled.events import scenario
from tests.bundled.events.scenario import (
    ALICE,
    BOB,
    CAROL,
    MEMBER,
    REDACTION,
    Clients,
    RoomDriver,
    error_of,
    post_remote,
    remote_event,
    table_counts,
    walk,
)

#: Top-level keys a pruned event keeps (room version 11), plus what the reads add.
KEPT = {"event_id", "type", "room_id", "sender", "state_key", "content", "hashes", "signatures", "depth",
        "prev_events", "auth_events", "origin_server_ts", "unsigned"}  # fmt: skip
#: ... and what room versions before 11 keep besides.
KEPT_BEFORE_11 = KEPT | {"prev_state", "membership", "origin"}


@pytest.fixture
async def main(host_cluster) -> Host:
    host_cluster.configure(http={"tokens": scenario.TOKENS})
    return await host_cluster("main")


async def read(client: Clients, user: str, room_id: str, event_id: str) -> dict:
    r = await client(user).get(f"/rooms/{room_id}/event/{event_id}")
    assert r.status_code == 200, (user, event_id, r.text)
    return r.json()


async def raw(client: Clients, room_id: str, event_id: str) -> bytes:
    r = await client("server").get(f"/rooms/{room_id}/event/{event_id}", params={"raw": "true"})
    assert r.status_code == 200, r.text
    return r.content


async def test_redact_through_the_route_prunes_on_read_and_keeps_the_stored_bytes(main, client):
    for version in ("10", "11"):
        room = await RoomDriver.create(client, ALICE, preset="public_chat", room_version=version)
        await room.member("join", BOB)
        target = await room.say(BOB, "regrettable", format="org.matrix.custom.html", formatted_body="<b>r</b>")
        before = await raw(client, room.room_id, target)
        redaction = await room.redact(ALICE, target, reason="spam")

        for user in (ALICE, BOB):
            event = await read(client, user, room.room_id, target)
            assert event["content"] == {}, (version, event)
            assert set(event) <= (KEPT if version == "11" else KEPT_BEFORE_11)
            assert event["event_id"] == target and event["sender"] == BOB
            because = event["unsigned"]["redacted_because"]
            assert because["event_id"] == redaction and because["type"] == REDACTION
            assert because["sender"] == ALICE and because["content"]["reason"] == "spam"
            assert (because["content"]["redacts"] if version == "11" else because["redacts"]) == target
            assert event["unsigned"]["membership"] == "join"
            # /messages shows the pruned event too, and the redaction itself
            page = await walk(client(user), room.room_id, limit=2)
            shown = {e["event_id"]: e for e in page.events}
            assert shown[target]["content"] == {}
            assert shown[target]["unsigned"]["redacted_because"]["event_id"] == redaction
            assert shown[redaction]["content"]["reason"] == "spam"

        # the stored bytes are untouched, for the server only
        after = await raw(client, room.room_id, target)
        assert hashlib.sha256(after).digest() == hashlib.sha256(before).digest()
        assert b"regrettable" in after
        r = await client(BOB).get(f"/rooms/{room.room_id}/event/{target}", params={"raw": "true"})
        assert r.status_code == 403
        rows = await main.api.database().fetchall(
            "SELECT event_id, redacts FROM redactions WHERE room_id = %(r)s", {"r": room.room_id}
        )
        assert rows == [(redaction, target)]


#: content before redaction -> what a redacted state event of the type keeps (room version 11; docs/plugins/events.md,
#: What pruning keeps)
PRUNED = {
    "m.room.join_rules": ({"join_rule": "public", "allow": [], "note": "x"}, {"join_rule": "public", "allow": []}),
    "m.room.history_visibility": ({"history_visibility": "shared", "note": "x"}, {"history_visibility": "shared"}),
    "m.room.topic": ({"topic": "gone"}, {}),
    "m.room.name": ({"name": "gone"}, {}),
}


async def test_what_each_type_keeps_and_a_redacted_member_event_stays_current(main, client):
    room = await RoomDriver.create(client, ALICE, preset="public_chat", room_version="11")
    for event_type, (content, kept) in PRUNED.items():
        event_id = await room.state(ALICE, event_type, content)
        redaction = await room.redact(ALICE, event_id)
        event = await read(client, ALICE, room.room_id, event_id)
        assert event["content"] == kept, event_type
        assert event["unsigned"]["redacted_because"]["event_id"] == redaction
    levels = {"users": {ALICE: 100}, "users_default": 0, "events_default": 0, "state_default": 50, "ban": 50,
              "kick": 50, "redact": 50, "invite": 0, "events": {}, "notifications": {"room": 50}}  # fmt: skip
    pl = await room.state(ALICE, "m.room.power_levels", levels)
    await room.redact(ALICE, pl)
    assert (await read(client, ALICE, room.room_id, pl))["content"] == {
        k: v for k, v in levels.items() if k != "notifications"
    }

    # a redacted member event keeps only its membership, and remains the user's current membership
    join = await room.member("join", BOB, label="bob joins")
    r = await client(BOB).put(
        f"/rooms/{room.room_id}/state/{MEMBER}/{BOB}", json={"membership": "join", "displayname": "B"}
    )
    assert r.status_code == 200, r.text
    profile = r.json()["event_id"]
    await room.redact(ALICE, profile)
    assert (await read(client, BOB, room.room_id, profile))["content"] == {"membership": "join"}
    state = (await client(ALICE).get(f"/rooms/{room.room_id}/state")).json()
    mine = next(e for e in state if e["type"] == MEMBER and e["state_key"] == BOB)
    assert mine["event_id"] == profile and mine["content"] == {"membership": "join"}
    assert "redacted_because" in mine["unsigned"]
    await room.say(BOB, "still in the room")
    assert join


async def test_the_create_event_cannot_be_redacted(main, client):
    room = await RoomDriver.create(client, ALICE, preset="public_chat")
    create = (await walk(client(ALICE), room.room_id, direction="f", limit=1)).ids[0]
    before = await table_counts(main)
    r = await client(ALICE).put(f"/rooms/{room.room_id}/redact/{create}/c1", json={})
    assert r.status_code == 403, r.text
    assert "create" in error_of(r)
    assert await table_counts(main) == before
    assert "redacted_because" not in (await read(client, ALICE, room.room_id, create)).get("unsigned", {})


async def test_an_event_redacted_twice_names_the_first_redaction(main, client):
    room = await RoomDriver.create(client, ALICE, preset="public_chat")
    target = await room.say(ALICE, "twice")
    first = await room.redact(ALICE, target, reason="one")
    second = await room.redact(ALICE, target, reason="two")
    assert first != second
    event = await read(client, ALICE, room.room_id, target)
    assert event["unsigned"]["redacted_because"]["event_id"] == first
    assert event["unsigned"]["redacted_because"]["content"]["reason"] == "one"


async def test_a_redaction_of_a_redaction(main, client):
    """A redacted redaction keeps only its ``redacts`` (room version 11: in its content; before 11 the
    top-level ``redacts`` is not a kept key), and its target stays redacted by it."""
    for version in ("11", "10"):
        room = await RoomDriver.create(client, ALICE, preset="public_chat", room_version=version)
        target = await room.say(ALICE, "first")
        first = await room.redact(ALICE, target, reason="why one")
        second = await room.redact(ALICE, first, reason="why two")
        event = await read(client, ALICE, room.room_id, target)
        assert event["content"] == {}
        assert event["unsigned"]["redacted_because"]["event_id"] == first
        redacted = await read(client, ALICE, room.room_id, first)
        assert redacted["content"] == ({"redacts": target} if version == "11" else {}), version
        assert "redacts" not in redacted or version == "11"
        assert redacted["unsigned"]["redacted_because"]["event_id"] == second
        assert b"why one" in await raw(client, room.room_id, first)
        # the second redaction is an ordinary, unredacted event
        assert (await read(client, ALICE, room.room_id, second))["content"]["reason"] == "why two"


async def test_who_may_redact(main, client):
    room = await RoomDriver.create(client, ALICE, preset="public_chat")
    await room.member("join", BOB)
    hers = await room.say(ALICE, "alice's")
    his = await room.say(BOB, "bob's")
    before = await table_counts(main)
    r = await client(BOB).put(f"/rooms/{room.room_id}/redact/{hers}/x1", json={})
    assert r.status_code == 403 and "redact" in error_of(r)
    r = await client(CAROL).put(f"/rooms/{room.room_id}/redact/{his}/x2", json={})  # not in the room
    assert r.status_code == 403, r.text
    assert await table_counts(main) == before
    assert "redacted_because" not in (await read(client, ALICE, room.room_id, hers)).get("unsigned", {})
    # his own event: no power needed
    own = await room.redact(BOB, his)
    assert (await read(client, ALICE, room.room_id, his))["unsigned"]["redacted_because"]["event_id"] == own
    # given the level "redact" asks for, he may redact hers
    levels = {"users": {ALICE: 100, BOB: 50}, "users_default": 0, "events_default": 0, "state_default": 50,
              "ban": 50, "kick": 50, "redact": 50, "invite": 0, "events": {}}  # fmt: skip
    await room.state(ALICE, "m.room.power_levels", levels)
    await room.redact(BOB, hers)
    assert (await read(client, ALICE, room.room_id, hers))["content"] == {}


async def test_a_redaction_of_an_event_in_another_room_is_refused(main, client):
    here = await RoomDriver.create(client, ALICE, preset="public_chat")
    there = await RoomDriver.create(client, ALICE, preset="public_chat")
    target = await there.say(ALICE, "in the other room")
    before = await table_counts(main)
    r = await client(ALICE).put(f"/rooms/{here.room_id}/redact/{target}/o1", json={"reason": "wrong room"})
    assert r.status_code == 400, r.text
    assert "redacts" in error_of(r)
    assert await table_counts(main) == before
    assert (await read(client, ALICE, there.room_id, target))["content"]["body"] == "in the other room"


async def test_a_redaction_whose_target_never_arrives_is_stored_but_never_shown(main, client):
    room = await RoomDriver.create(client, ALICE, preset="public_chat")
    ghost = "$" + "g" * 43
    redaction = await room.redact(ALICE, ghost, reason="nothing there")
    rows = await main.api.database().fetchall("SELECT redacts FROM redactions WHERE event_id = %(e)s", {"e": redaction})
    assert rows == [(ghost,)]
    assert b"nothing there" in await raw(client, room.room_id, redaction)
    await room.say(ALICE, "after")
    assert redaction not in (await walk(client(ALICE), room.room_id)).ids
    assert (await client(ALICE).get(f"/rooms/{room.room_id}/event/{redaction}")).status_code == 404


# -- remote redactions ----------------------------------------------------------------------------------------


def remote_room(room_id: str) -> list[tuple[dict, str]]:
    """create (zed), zed joins, bob (a local user) joins: the start of a remote room."""
    zed = "@zed:elsewhere"
    create = remote_event(room_id, "m.room.create", zed, {"room_version": "10"}, [], 1, state_key="")
    zed_join = remote_event(room_id, MEMBER, zed, {"membership": "join"}, [create[1]], 2, state_key=zed)
    bob_join = remote_event(room_id, MEMBER, BOB, {"membership": "join"}, [zed_join[1]], 3, state_key=BOB)
    return [create, zed_join, bob_join]


async def test_a_remote_redaction_arriving_before_its_target(main, client):
    room_id = "!early:elsewhere"
    start = remote_room(room_id)
    await post_remote(client, room_id, [e for e, _ in start])
    before_target = remote_event(room_id, "m.room.message", "@zed:elsewhere", {"body": "m0"}, [start[-1][1]], 4)
    target = remote_event(
        room_id, "m.room.message", "@zed:elsewhere", {"body": "to be redacted"}, [before_target[1]], 5
    )
    redaction = remote_event(
        room_id, REDACTION, "@zed:elsewhere", {"reason": "early"}, [target[1]], 6, redacts=target[1]
    )
    await post_remote(client, room_id, [redaction[0]])
    rows = await main.api.database().fetchall(
        "SELECT event_id FROM event_backward_extremities WHERE room_id = %(r)s", {"r": room_id}
    )
    assert rows == [(target[1],)]
    # the target (and what came before it) arrives later, by backfill
    await post_remote(client, room_id, [before_target[0], target[0]], backfill=True)
    event = await read(client, BOB, room_id, target[1])
    assert event["content"] == {}
    assert event["unsigned"]["redacted_because"]["event_id"] == redaction[1]
    assert b"to be redacted" in await raw(client, room_id, target[1])
    page = await walk(client(BOB), room_id, limit=2)
    assert {e["event_id"]: e for e in page.events}[target[1]]["content"] == {}


async def test_a_remote_redaction_loop(main, client):
    """Two redactions that redact each other, arriving together or one by one: both stored, both read
    back pruned naming the other, and reads terminate."""
    for together in (True, False):
        room_id = f"!loop{int(together)}:elsewhere"
        start = remote_room(room_id)
        await post_remote(client, room_id, [e for e, _ in start])
        parent = start[-1][1]
        # the IDs are reference hashes, so each names the other's ID as given beside it instead
        one_id, two_id = "$loop-one-" + room_id[1:6], "$loop-two-" + room_id[1:6]
        one, _ = remote_event(room_id, REDACTION, "@zed:elsewhere", {"reason": "1"}, [parent], 4, redacts=two_id)
        two, _ = remote_event(room_id, REDACTION, "@zed:elsewhere", {"reason": "2"}, [one_id], 5, redacts=one_id)
        if together:
            await post_remote(client, room_id, [one, two], event_ids=[one_id, two_id])
        else:
            await post_remote(client, room_id, [one], event_ids=[one_id])
            await post_remote(client, room_id, [two], event_ids=[two_id])
        for mine, other in ((one_id, two_id), (two_id, one_id)):
            event = await read(client, BOB, room_id, mine)
            assert event["content"] == {}, (together, event)
            assert event["unsigned"]["redacted_because"]["event_id"] == other
        page = await walk(client(BOB), room_id, limit=1)
        assert {one_id, two_id} <= set(page.ids)


async def test_a_remote_redaction_does_not_reach_into_another_room(main, client):
    local = await RoomDriver.create(client, ALICE, preset="public_chat")
    target = await local.say(ALICE, "safe here")
    room_id = "!reach:elsewhere"
    start = remote_room(room_id)
    await post_remote(client, room_id, [e for e, _ in start])
    reach = remote_event(room_id, REDACTION, "@zed:elsewhere", {}, [start[-1][1]], 4, redacts=target)
    # ... and one naming an event of a third room that only arrives afterwards
    later_room = "!later:elsewhere"
    later_start = remote_room(later_room)
    later = remote_event(later_room, "m.room.message", "@zed:elsewhere", {"body": "mine"}, [later_start[-1][1]], 4)
    early = remote_event(room_id, REDACTION, "@zed:elsewhere", {}, [reach[1]], 5, redacts=later[1])
    await post_remote(client, room_id, [reach[0], early[0]])
    await post_remote(client, later_room, [e for e, _ in later_start] + [later[0]])
    assert (await read(client, ALICE, local.room_id, target))["content"]["body"] == "safe here"
    assert (await read(client, BOB, later_room, later[1]))["content"]["body"] == "mine"
