"""Reads never cross rooms, and ``unsigned`` never tells more than the reader may read (red team of
issue 30).

* A read names its room in the path: an event of another room is unknown there, on ``/event`` and
  ``/state?at=`` alike (the same answer as an event the server does not hold: the other room's
  graph, visibility and the reader's standing in it are never consulted).
* ``unsigned.prev_content`` (with ``replaces_state`` and ``prev_sender``) comes only with a state event
  the reader may read as an event: ``/state`` lists state events the reader may not see (set before
  they joined a ``joined`` room), and their predecessors were in no state the reader could read.
  Checked over every history visibility and every standing of the reader, on every route.
* The federation format (``/backfill``, ``/state?server=true``) never carries a remote server's stored
  ``unsigned`` (another server's ``transaction_id``, ``age_ts``, ``invite_room_state``).
"""

from __future__ import annotations

from typing import Any

import pytest
from factstream_events.rules.eventid import content_hash

from tests.bundled.events.scenario import (
    ALICE,
    BOB,
    CAROL,
    MEMBER,
    VISIBILITIES,
    Clients,
    RoomDriver,
    expect,
    history,
    remote_body,
    remote_event,
)
from tests.bundled.events.test_served_view_http import PATHS, act

ZED = "@zed:elsewhere.example"
PREV_KEYS = ("prev_content", "prev_sender", "replaces_state")


# -- the path's room ----------------------------------------------------------------------------------------


@pytest.mark.parametrize("readable_in_its_room", [True, False])
async def test_an_event_of_another_room_is_unknown_in_the_paths_room(main, client, readable_in_its_room):
    x = await RoomDriver.create(client, ALICE, preset="public_chat")
    await x.member("join", BOB)
    y = await RoomDriver.create(client, ALICE, preset="public_chat", history_visibility="joined")
    y_message = await y.say(ALICE, "in room y")
    if readable_in_its_room:
        await y.member("join", BOB)
        y_message = await y.say(ALICE, "in room y, bob joined")
    assert (await client(BOB).get(f"/rooms/{y.room_id}/event/{y_message}")).status_code == (
        200 if readable_in_its_room else 404
    )
    unknown = "$" + "A" * 43
    for as_server in (False, True):
        c = client("server" if as_server else BOB)
        for path, params in (
            (f"/rooms/{x.room_id}/event/{{}}", {}),
            (f"/rooms/{x.room_id}/state", {"at": "{}"}),
        ):
            if as_server:
                params = {**params, ("server" if "at" in params else "raw"): "true"}
            answers = []
            for event_id in (y_message, unknown):
                r = await c.get(path.format(event_id), params={k: v.format(event_id) for k, v in params.items()})
                answers.append((r.status_code, r.json()["error"].replace(event_id, "EVENT")))
            # the other room's event reads exactly as one the server does not hold
            assert answers[0] == answers[1], (as_server, path, answers)
            assert answers[0][0] == 404


# -- prev_content only with an event the reader may see -------------------------------------------------------


async def room_with_history(client: Clients, visibility: str, path: str) -> RoomDriver:
    """Bob and alice change a name, bob's display name and a topic; carol stands as ``path`` says
    (``test_served_view_http.PATHS``): before the first changes, between them and the second, after."""
    before, between, after = PATHS[path]
    room = await RoomDriver.create(client, ALICE, preset="public_chat", history_visibility=visibility)
    await room.member("join", BOB)
    await act(room, before)
    await room.state(ALICE, "m.room.name", {"name": "old-name-1"})
    await room.state(BOB, MEMBER, {"membership": "join", "displayname": "old-displayname-1"}, key=BOB)
    await room.state(ALICE, "m.room.name", {"name": "name-2"})
    await room.state(BOB, MEMBER, {"membership": "join", "displayname": "displayname-2"}, key=BOB)
    await act(room, between)
    await room.state(ALICE, "m.room.topic", {"topic": "topic-1"})
    await room.state(ALICE, "m.room.topic", {"topic": "topic-2"})
    await act(room, after)
    return room


async def served(
    client: Clients, user: str, room: RoomDriver, since: str, ats: list[str]
) -> dict[str, list[dict[str, Any]]]:
    """The events each route serves ``user`` (answers other than 200 serve none); ``/state`` also at
    each event of ``ats``."""
    c, room_id = client(user), room.room_id
    out: dict[str, list[dict[str, Any]]] = {}
    r = await c.get(f"/rooms/{room_id}/state")
    out["/state"] = r.json() if r.status_code == 200 else []
    for at in ats:
        r = await c.get(f"/rooms/{room_id}/state", params={"at": at})
        assert r.status_code == 200, r.text
        out[f"/state?at={at}"] = r.json()
    r = await c.get(f"/rooms/{room_id}/messages", params={"limit": 200})
    out["/messages"] = r.json()["chunk"] if r.status_code == 200 else []
    body = (await c.get("/events", params={"from": since, "limit": 100})).json()
    out["/events memberships"] = body["memberships"]
    out["/events"] = [e for room in body["rooms"].values() for e in room["events"]]
    rooms = (await c.get("/recent", params={"limit": 100})).json()["rooms"]
    out["/recent"] = [e for room in rooms for e in room["events"]]
    return out


@pytest.mark.parametrize("path", list(PATHS))
@pytest.mark.parametrize("visibility", VISIBILITIES)
async def test_prev_content_comes_only_with_an_event_the_reader_may_see(module_main, module_client, visibility, path):
    # One host for the module's sweep: each case makes its room and reads only it (the answers of the
    # user-wide routes are filtered to it below), so the rooms of the cases before change nothing.
    main, client = module_main, module_client
    since = (await client(CAROL).get("/events")).json()["next"]
    room = await room_with_history(client, visibility, path)
    events = await history(main, room.room_id)
    want = expect(events, CAROL).by_id
    may_see: dict[str, bool] = {}
    replaced: set[str] = set()
    for event in events:
        r = await client(CAROL).get(f"/rooms/{room.room_id}/event/{event['event_id']}")
        assert r.status_code in (200, 404), r.text
        may_see[event["event_id"]] = r.status_code == 200
        if want.get(event["event_id"], "no opinion") != "no opinion":  # /event itself follows Who sees what
            assert may_see[event["event_id"]] == (want[event["event_id"]] is not None)
        if r.status_code == 200 and "replaces_state" in r.json()["unsigned"]:
            replaced.add(event["event_id"])
    checked = 0
    ats = [e for e, seen in may_see.items() if seen]
    for where, answer in (await served(client, CAROL, room, since, ats)).items():
        for event in answer:
            if event.get("room_id") != room.room_id:
                continue
            told = [k for k in PREV_KEYS if k in event["unsigned"]]
            if where in ("/events memberships", "/recent") and event.get("state_key") == CAROL:
                pass  # the reader's own membership, shown whatever the visibility (with what it replaced)
            elif not may_see[event["event_id"]]:
                assert not told, (visibility, path, where, event)
            else:  # the rule takes nothing from a reader who may see the event
                assert (event["event_id"] in replaced) == bool(told), (visibility, path, where, event)
            checked += bool(told)
    assert checked or not replaced


async def test_a_later_joiner_does_not_read_what_the_state_was_before_they_could_see_it(main, client):
    """The issue's shape: a ``joined`` room renamed, and a member's display name changed, before carol
    joins; ``/state`` lists both events (they are the current state) but not what they replaced."""
    room = await room_with_history(client, "joined", "joined after the redaction")
    r = await client(CAROL).get(f"/rooms/{room.room_id}/state")
    assert r.status_code == 200 and "old-" not in r.text, r.text
    # a member who saw the changes reads them with what they replaced
    r = await client(BOB).get(f"/rooms/{room.room_id}/state")
    by_key = {(e["type"], e["state_key"]): e["unsigned"] for e in r.json()}
    assert by_key[("m.room.name", "")]["prev_content"] == {"name": "old-name-1"}
    assert by_key[(MEMBER, BOB)]["prev_content"]["displayname"] == "old-displayname-1"


# -- the federation format ------------------------------------------------------------------------------------


@pytest.mark.parametrize("spelling", ['"unsigned"', '"\\u0075nsigned"'])
async def test_the_federation_format_never_carries_a_stored_unsigned(main, client, spelling):
    room_id = "!unsigned-fed:elsewhere.example"
    create, create_id = remote_event(room_id, "m.room.create", ZED, {"room_version": "10"}, [], 1, state_key="")
    join, join_id = remote_event(room_id, MEMBER, ZED, {"membership": "join"}, [create_id], 2, state_key=ZED)
    invite, invite_id = remote_event(room_id, MEMBER, ZED, {"membership": "invite"}, [join_id], 3, state_key=BOB)
    message, message_id = remote_event(room_id, "m.room.message", ZED, {"msgtype": "m.text", "body": "x"},
                                       [invite_id], 4)  # fmt: skip
    invite["unsigned"] = {"invite_room_state": [{"type": "m.room.name", "content": {"name": "stripped"}}]}
    message["unsigned"] = {"transaction_id": "zeds-own-txn", "age_ts": 5}
    ids = [None, None, invite_id, message_id]  # the IDs as given: the stored unsigned is not hashed
    body = remote_body([create, join, invite, message], event_ids=ids).replace(b'"unsigned"', spelling.encode())
    server = client("server")
    r = await server.post(f"/rooms/{room_id}/remote_events", content=body)
    assert r.status_code == 200, r.text
    answers = {
        "/backfill": (await server.get(f"/rooms/{room_id}/backfill", params={"v": message_id})).json()["pdus"],
        "/state?server=true": (await server.get(f"/rooms/{room_id}/state", params={"server": "true"})).json(),
    }
    for where, pdus in answers.items():
        assert pdus and not [p for p in pdus if "unsigned" in p], (where, pdus)
        for pdu in pdus:  # the rest as stored: the content hash still holds
            assert pdu["hashes"]["sha256"] == content_hash(pdu), (where, pdu)
    assert len(answers["/backfill"]) == 4
    # raw=true stays the stored bytes exactly
    raw = await server.get(f"/rooms/{room_id}/event/{message_id}", params={"raw": "true"})
    assert raw.json()["unsigned"] == {"transaction_id": "zeds-own-txn", "age_ts": 5}
