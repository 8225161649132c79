"""References between events never cross rooms (issue 30, points 1 and 10).

A remote event's ``prev_events`` that name an event the server holds in another room are refused (400
naming the field, nothing of the batch stored), whatever the batch (normal, backfill, outliers, a new
room's first) and whatever the other room's event (its create, a state event, a membership, a message).
A ``prev_event`` not held when its event arrives, that later arrives in another room, stays a backward
extremity of its own room and is never followed. A remote redaction of another room's event is stored
and never applied, whichever arrives first. No read (state, visibility, ``/recent``) ever shows one
room's state in another.
"""

from __future__ import annotations

import itertools

import httpx
from factstream_events.rules.validate import MEMBER, REDACTION

from factstream.host.app import Host
from tests.bundled.events.conftest import reads_of
from tests.bundled.events.scenario import (
    ALICE,
    BOB,
    CAROL,
    Clients,
    RoomDriver,
    error_of,
    post_remote,
    remote_body,
    remote_event,
    table_counts,
)

ZED = "@zed:elsewhere"
SECRET = "the secret plans"


def remote_start(room_id: str) -> list[tuple[dict, str]]:
    """create (zed), zed joins, bob (a local user) joins, a message: the start of a remote room."""
    create = remote_event(room_id, "m.room.create", ZED, {"room_version": "10"}, [], 1, state_key="")
    zed_join = remote_event(room_id, MEMBER, ZED, {"membership": "join"}, [create[1]], 2, state_key=ZED)
    bob_join = remote_event(room_id, MEMBER, BOB, {"membership": "join"}, [zed_join[1]], 3, state_key=BOB)
    hello = remote_event(room_id, "m.room.message", ZED, {"msgtype": "m.text", "body": "hi"}, [bob_join[1]], 4)
    return [create, zed_join, bob_join, hello]


async def post(client: Clients, room_id: str, events: list[dict], **extra) -> httpx.Response:
    return await client("server").post(f"/rooms/{room_id}/remote_events", content=remote_body(events, **extra))


async def private_room(client: Clients) -> tuple[RoomDriver, dict[str, str]]:
    """Room Y: alice's private room with a name, carol joined by invite, a message."""
    room = await RoomDriver.create(client, ALICE, preset="private_chat", name=SECRET, history_visibility="joined")
    await room.member("invite", ALICE, CAROL)
    await room.member("join", CAROL)
    message = await room.say(ALICE, "only for carol")
    state = await client(ALICE).get(f"/rooms/{room.room_id}/state")
    assert state.status_code == 200, state.text
    ids = {(e["type"], e.get("state_key")): e["event_id"] for e in state.json()}
    return room, {
        "create": ids[("m.room.create", "")],
        "name": ids[("m.room.name", "")],
        "join_rules": ids[("m.room.join_rules", "")],
        "member": ids[(MEMBER, CAROL)],
        "message": message,
    }


async def rooms_of(host: Host, event_ids: list[str]) -> set[str]:
    rows = await host.api.database().fetchall(
        "SELECT DISTINCT room_id FROM events WHERE event_id = ANY(%(ids)s)", {"ids": event_ids}
    )
    return {str(r[0]) for r in rows}


async def assert_isolated(main: Host, client: Clients, x_room: str, y_room: str) -> None:
    """Nothing of room Y is in room X's state, and no one's reads carry Y's state into X or X into Y's."""
    current = await reads_of(main).state_ids(x_room)
    assert await rooms_of(main, list(current.values())) <= {x_room}
    crossing = await main.api.database().fetchall(
        "SELECT x.event_id FROM events x JOIN state_groups g ON g.id = x.state_group"
        " WHERE x.room_id = %(x)s AND g.room_id <> %(x)s"
        " UNION ALL SELECT g.id::text FROM state_groups g JOIN state_groups p ON p.id IN (g.parent, g.base)"
        " WHERE g.room_id = %(x)s AND p.room_id <> %(x)s",
        {"x": x_room},
    )
    assert crossing == []
    for event_id in [str(r[0]) for r in await main.api.database().fetchall(
        "SELECT event_id FROM events WHERE room_id = %(x)s AND NOT outlier", {"x": x_room}
    )]:  # fmt: skip
        at = await reads_of(main).state_ids(x_room, event_id)
        assert await rooms_of(main, list(at.values())) <= {x_room}, event_id
    state = await client(BOB).get(f"/rooms/{x_room}/state")
    assert state.status_code == 200, state.text
    assert SECRET not in state.text and all(e["room_id"] == x_room for e in state.json())
    # bob is a stranger to Y; carol, a member of Y, is a stranger to X
    recent = {r["room_id"]: r for r in (await client(BOB).get("/recent")).json()["rooms"]}
    assert y_room not in recent and SECRET not in str(recent)
    recent = {r["room_id"]: r for r in (await client(CAROL).get("/recent")).json()["rooms"]}
    assert set(recent) == {y_room}
    assert (await client(CAROL).get(f"/rooms/{x_room}/messages")).status_code == 403
    assert (await client(BOB).get(f"/rooms/{y_room}/state")).status_code == 403


# -- prev_events ------------------------------------------------------------------------------------------


async def test_prev_events_naming_another_rooms_event_are_refused_in_every_kind_of_batch(main, client):
    y_room, y = await private_room(client)
    x_room = "!x:elsewhere"
    start = remote_start(x_room)
    await post_remote(client, x_room, [e for e, _ in start])
    head = start[-1][1]
    before = await table_counts(main)
    cases = itertools.product(y, ("alone", "second"), ("normal", "backfill", "outlier"))
    for depth, (kind, where, batch) in enumerate(cases, start=10):
        prev = [y[kind]] if where == "alone" else [head, y[kind]]
        event, _ = remote_event(x_room, "m.room.message", ZED, {"msgtype": "m.text", "body": kind}, prev, depth)
        extra = {batch: True} if batch != "normal" else {}
        r = await post(client, x_room, [event], **extra)
        assert r.status_code == 400, (kind, where, batch, r.status_code, r.text)
        message = error_of(r)
        assert r.json()["errcode"] == "M_BAD_JSON"
        assert "events[0].prev_events" in message and y[kind] in message and y_room.room_id in message, message
        assert await table_counts(main) == before, (kind, where, batch)
    await assert_isolated(main, client, x_room, y_room.room_id)


async def test_a_new_rooms_first_batch_naming_another_rooms_event_stores_nothing(main, client):
    _, y = await private_room(client)
    before = await table_counts(main)
    for i, (kind, event_id) in enumerate(y.items()):
        x_room = f"!new{i}:elsewhere"
        start = remote_start(x_room)
        # the third event follows bob's join and Y's event: refused, and the whole batch with it
        leak, _ = remote_event(x_room, "m.room.message", ZED, {"msgtype": "m.text", "body": "x"}, [
            start[2][1], event_id
        ], 4)  # fmt: skip
        r = await post(client, x_room, [start[0][0], start[1][0], start[2][0], leak])
        assert r.status_code == 400, (kind, r.text)
        assert "events[3].prev_events" in error_of(r)
        assert await table_counts(main) == before, kind
        assert (await client(BOB).get(f"/rooms/{x_room}/state")).status_code == 404


async def test_a_prev_event_that_arrives_later_in_another_room_is_never_followed(main, client):
    x_room, z_room = "!x:elsewhere", "!z:elsewhere"
    x_start, z_start = remote_start(x_room), remote_start(z_room)
    await post_remote(client, x_room, [e for e, _ in x_start])
    named = z_start[-1][1]  # Z's message: not held yet
    e, e_id = remote_event(x_room, "m.room.message", ZED, {"msgtype": "m.text", "body": "e"}, [
        x_start[-1][1], named
    ], 5)  # fmt: skip
    await post_remote(client, x_room, [e])
    backward = "SELECT event_id FROM event_backward_extremities WHERE room_id = %(r)s"
    assert await main.api.database().fetchall(backward, {"r": x_room}) == [(named,)]
    # Z arrives (with a name): the event stays Z's, X's reference to it is never followed
    name = remote_event(z_room, "m.room.name", ZED, {"name": SECRET}, [named], 5, state_key="")
    await post_remote(client, z_room, [ev for ev, _ in z_start] + [name[0]])
    assert await main.api.database().fetchall(backward, {"r": x_room}) == [(named,)]
    assert await main.api.database().fetchall(backward, {"r": z_room}) == []
    # naming it now that it is held is refused; X goes on from its own events
    f, _ = remote_event(x_room, "m.room.message", ZED, {"msgtype": "m.text", "body": "f"}, [e_id, named], 6)
    r = await post(client, x_room, [f])
    assert r.status_code == 400 and "events[0].prev_events" in error_of(r), r.text
    g, g_id = remote_event(x_room, "m.room.message", ZED, {"msgtype": "m.text", "body": "g"}, [e_id], 6)
    await post_remote(client, x_room, [g])
    state = await reads_of(main).state_ids(x_room, g_id)
    assert ("m.room.name", "") not in state and await rooms_of(main, list(state.values())) == {x_room}
    # backfilling it into X is refused: it is Z's
    r = await post(client, x_room, [z_start[-1][0]], backfill=True)
    assert r.status_code == 400, r.text
    recent = (await client(BOB).get("/recent")).json()["rooms"]
    for room in recent:
        assert all(event["room_id"] == room["room_id"] for event in room["events"])
        if room["room_id"] == x_room:
            assert SECRET not in str(room)


# -- redactions ---------------------------------------------------------------------------------------------


async def test_a_remote_redaction_of_another_rooms_event_is_stored_and_never_applied(main, client):
    y_room, y = await private_room(client)
    x_room, z_room = "!x:elsewhere", "!z:elsewhere"
    x_start, z_start = remote_start(x_room), remote_start(z_room)
    await post_remote(client, x_room, [e for e, _ in x_start])
    # one redaction of a held event of Y, one of Z's message, not held yet
    held, held_id = remote_event(x_room, REDACTION, ZED, {}, [x_start[-1][1]], 5, redacts=y["message"])
    early, early_id = remote_event(x_room, REDACTION, ZED, {}, [held_id], 6, redacts=z_start[-1][1])
    answer = await post_remote(client, x_room, [held, early])
    assert answer == {"stored": [held_id, early_id], "already_stored": []}
    await post_remote(client, z_room, [e for e, _ in z_start])
    rows = await main.api.database().fetchall(
        "SELECT event_id, redacted_by FROM events WHERE event_id = ANY(%(ids)s)",
        {"ids": [y["message"], z_start[-1][1]]},
    )
    assert {r[1] for r in rows} == {None}
    message = await client(CAROL).get(f"/rooms/{y_room.room_id}/event/{y['message']}")
    assert message.json()["content"]["body"] == "only for carol"
    z_message = await client(BOB).get(f"/rooms/{z_room}/event/{z_start[-1][1]}")
    assert z_message.json()["content"]["body"] == "hi" and "redacted_because" not in z_message.json()["unsigned"]
    # stored, and never shown: no target in its room (as a redaction whose target never arrives)
    assert (await client(BOB).get(f"/rooms/{x_room}/event/{held_id}")).status_code == 404
    raw = await client("server").get(f"/rooms/{x_room}/event/{held_id}", params={"raw": "true"})
    assert raw.status_code == 200
    page = (await client(BOB).get(f"/rooms/{x_room}/messages", params={"limit": 50})).json()["chunk"]
    assert {held_id, early_id}.isdisjoint(e["event_id"] for e in page)
    await assert_isolated(main, client, x_room, y_room.room_id)
