"""The served view of events (issue 30, points 3, 4, 17 and 18), end to end over HTTP.

* ``unsigned.redacted_because`` never tells a user of a redaction they may not read: over every history
  visibility and every way a reader can stand in the room when the redaction is sent, on every route
  that serves events to a user (``/event``, ``/messages``, ``/events``, ``/recent``, ``/state``);
* ``/backfill`` (and the writer's ``/state?server=true``) serve redacted events pruned, in the
  federation format; ``raw=true`` stays the one way to the stored bytes;
* users get the Matrix client format: no federation-only keys, ``unsigned.age``, ``prev_content``,
  ``prev_sender`` and ``replaces_state`` for a state event that replaced another, the top-level
  ``redacts`` of a version 11 redaction, never a remote server's own ``unsigned``;
* a writer reads the state at any event as the server holds it; a user token cannot.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from typing import Any

import httpx
import pytest
from factstream_events.rules.prune import prune_event

from factstream.host.app import Host
from tests.bundled.events.scenario import (
    ALICE,
    BOB,
    CAROL,
    FEDERATION_ONLY,
    MEMBER,
    REDACTION,
    VISIBILITIES,
    Clients,
    RoomDriver,
    client_view,
    expect,
    history,
    post_remote,
    remote_event,
)

#: What a reader who may not read a redaction gets as ``unsigned.redacted_because``.
MARKER = {"type": REDACTION, "content": {}}
REASON = "the-reason-only-members-may-read"
TOPIC = "m.room.topic"


# -- point 3: redacted_because over every visibility and every standing of the reader -------------------------

#: How carol stands in the room: what she does before bob's message, between it and its redaction, and
#: after the redaction (each a list of (verb, actor); alice acts on carol for invite, kick and ban).
PATHS: dict[str, tuple[list[tuple[str, str]], list[tuple[str, str]], list[tuple[str, str]]]] = {
    "joined throughout": ([("join", CAROL)], [], []),
    "left before the redaction": ([("join", CAROL)], [("leave", CAROL)], []),
    "left, then back after the redaction": ([("join", CAROL)], [("leave", CAROL)], [("join", CAROL)]),
    "left, then invited again": ([("join", CAROL)], [("leave", CAROL)], [("invite", ALICE)]),
    "kicked before the redaction": ([("join", CAROL)], [("kick", ALICE)], []),
    "banned before the redaction": ([("join", CAROL)], [("ban", ALICE)], []),
    "joined after the redaction": ([], [], [("join", CAROL)]),
    "invited, never joined": ([("invite", ALICE)], [], []),
    "invited, joined after the redaction": ([("invite", ALICE)], [], [("join", CAROL)]),
    "invited, rejected before the redaction": ([("invite", ALICE)], [("leave", CAROL)], []),
    "never in the room": ([], [], []),
}


async def act(room: RoomDriver, steps: list[tuple[str, str]]) -> None:
    for verb, actor in steps:
        await room.member(verb, actor, None if actor == CAROL else CAROL)


@dataclass
class Redacted:
    """A room where bob's message and alice's topic were redacted, and what carol must be told of each
    redaction: the redaction as ``/event`` serves it to her, or None where she may not read it."""

    room: RoomDriver
    message: str
    topic: str
    because: dict[str, dict[str, Any] | None]  # target -> the redaction as carol reads it, or None
    redactions: dict[str, str]  # target -> redaction ID
    message_readable: bool | None  # whether Who sees what lets carol read the message by ID (None: no opinion)


async def redacted_room(client: Clients, main: Host, visibility: str, path: str) -> Redacted:
    before, between, after = PATHS[path]
    room = await RoomDriver.create(client, ALICE, preset="public_chat", history_visibility=visibility)
    await room.member("join", BOB)
    await act(room, before)
    message = await room.say(BOB, "a message redacted later")
    topic = await room.state(ALICE, TOPIC, {"topic": "a topic redacted later"})
    await act(room, between)
    redactions = {t: await room.redact(ALICE, t, reason=REASON) for t in (message, topic)}
    await act(room, after)
    events = await history(main, room.room_id)
    want = expect(events, CAROL).by_id
    because: dict[str, dict[str, Any] | None] = {}
    for target, redaction in redactions.items():
        r = await client(CAROL).get(f"/rooms/{room.room_id}/event/{redaction}")
        assert r.status_code in (200, 404), r.text
        if redaction in want:  # the /event rule itself is Who sees what's (scenario.expect, written independently)
            assert (r.status_code == 200) == (want[redaction] is not None), (visibility, path, r.text)
        because[target] = {k: v for k, v in r.json().items() if k != "unsigned"} if r.status_code == 200 else None
    readable = None if message not in want else want[message] is not None
    return Redacted(room, message, topic, because, redactions, readable)


def check_served(case: Redacted, event: dict[str, Any], where: str) -> None:
    """A redacted target as served to carol: pruned, and its redaction told only if she may read it."""
    target = event["event_id"]
    assert event["content"] == {}, (where, event)
    got = event["unsigned"]["redacted_because"]
    want = case.because[target]
    assert got == (MARKER if want is None else want), (where, got, want)


def no_trace(case: Redacted, text: str, where: str) -> None:
    """Nothing of a redaction carol may not read is anywhere in an answer (its ID, its reason)."""
    for target, redaction in case.redactions.items():
        if case.because[target] is None:
            assert redaction not in text and REASON not in text, (where, text[:500])


async def served_to_carol(client: Clients, case: Redacted, since: str) -> dict[str, list[dict[str, Any]]]:
    """Every route's answer to carol, as the events each serves (answers other than 200 serve none)."""
    c, room_id = client(CAROL), case.room.room_id
    answers: dict[str, httpx.Response] = {
        f"/event {name}": await c.get(f"/rooms/{room_id}/event/{target}")
        for name, target in (("message", case.message), ("topic", case.topic))
    }
    answers["/messages"] = await c.get(f"/rooms/{room_id}/messages", params={"limit": 100})
    answers["/events"] = await c.get("/events", params={"from": since, "limit": 100})
    answers["/recent"] = await c.get("/recent", params={"limit": 100})
    answers["/state"] = await c.get(f"/rooms/{room_id}/state")
    answers["/state?at=message"] = await c.get(f"/rooms/{room_id}/state", params={"at": case.message})
    served: dict[str, list[dict[str, Any]]] = {}
    for where, r in answers.items():
        assert r.status_code in (200, 403, 404), (where, r.status_code, r.text)
        if r.status_code != 200:
            continue
        body = r.json()
        if where in ("/events", "/recent"):  # the user-wide routes: only the case's room (the module shares a host)
            body = _in_room(body, room_id)
        no_trace(case, json.dumps(body) if where in ("/events", "/recent") else r.text, where)
        if where.startswith("/event "):
            served[where] = [body]
        elif where == "/messages":
            served[where] = body["chunk"]
        elif where == "/events":
            rooms = body["rooms"].values()
            served[where] = body["memberships"] + [e for room in rooms for e in room["events"]]
        elif where == "/recent":
            served[where] = [e for room in body["rooms"] for e in room["events"]]
        else:
            served[where] = body
    return served


def _in_room(body: dict[str, Any], room_id: str) -> dict[str, Any]:
    """An ``/events`` or ``/recent`` answer with only what it says of ``room_id``."""
    rooms = body["rooms"]
    if isinstance(rooms, dict):  # /events
        memberships = [e for e in body["memberships"] if e["room_id"] == room_id]
        return {**body, "memberships": memberships, "rooms": {k: v for k, v in rooms.items() if k == room_id}}
    return {**body, "rooms": [room for room in rooms if room["room_id"] == room_id]}


@pytest.mark.parametrize("path", list(PATHS))
@pytest.mark.parametrize("visibility", VISIBILITIES)
async def test_redacted_because_tells_only_what_the_reader_may_read(module_main, module_client, visibility, path):
    # One host for the module's sweep: each case makes its room and reads only it (served_to_carol keeps
    # only the case's room of the user-wide routes), so the rooms of the cases before change nothing.
    main, client = module_main, module_client
    since = (await client(CAROL).get("/events")).json()["next"]
    case = await redacted_room(client, main, visibility, path)
    checked = 0
    served = await served_to_carol(client, case, since)
    for where, events in served.items():
        for event in events:
            if event["event_id"] in case.because:
                check_served(case, event, where)
                checked += 1
    # Who sees what decides whether carol reads the message at all; where she does, the checks above ran
    if case.message_readable is not None:
        assert ("/event message" in served) == case.message_readable, (visibility, path)
    assert checked or not case.message_readable


async def test_the_rule_is_exercised_both_ways(main, client):
    """The sweep above meets both answers: the issue's case (left before the redaction) gets the marker,
    a member who stayed gets the redaction."""
    left = await redacted_room(client, main, "shared", "left before the redaction")
    stayed = await redacted_room(client, main, "shared", "joined throughout")
    back = await redacted_room(client, main, "joined", "left, then back after the redaction")
    assert left.because[left.message] is None and back.because[back.message] is None
    assert stayed.because[stayed.message] is not None
    assert stayed.because[stayed.message]["content"]["reason"] == REASON
    r = await client(CAROL).get(f"/rooms/{left.room.room_id}/event/{left.message}")
    assert r.json()["unsigned"]["redacted_because"] == MARKER and REASON not in r.text


# -- point 4: /backfill serves redacted events pruned ------------------------------------------------------------


@pytest.mark.parametrize("version", ["10", "11"])
async def test_backfill_serves_redacted_events_pruned_in_the_federation_format(main, client, version):
    room = await RoomDriver.create(client, ALICE, preset="public_chat", room_version=version)
    secret = await room.say(ALICE, "my password is hunter2")
    topic = await room.state(ALICE, TOPIC, {"topic": "hunter2 too"})
    kept = await room.say(ALICE, "kept")
    redactions = [await room.redact(ALICE, e, reason="oops") for e in (secret, topic)]
    server = client("server")
    r = await server.get(f"/rooms/{room.room_id}/backfill", params={"v": redactions[-1], "limit": 100})
    assert r.status_code == 200, r.text
    assert b"hunter2" not in r.content
    # a linear room: every event, newest first, as stored, or pruned where redacted
    want = []
    for event in reversed(await history(main, room.room_id)):
        event_id = event.pop("event_id")
        want.append(prune_event(event, version) if event_id in (secret, topic) else event)
    assert r.json()["pdus"] == want
    pruned = [p for p in r.json()["pdus"] if p["content"] == {} and p["type"] in ("m.room.message", TOPIC)]
    assert len(pruned) == 2
    # the federation keys stay (a local event carries no signatures)
    assert all({"hashes", "auth_events", "prev_events", "depth"} <= p.keys() for p in pruned)
    assert not [p for p in r.json()["pdus"] if "unsigned" in p]
    assert any(p["content"].get("body") == "kept" for p in r.json()["pdus"]), kept
    # the stored bytes stay for the server that asks for them explicitly
    raw = await server.get(f"/rooms/{room.room_id}/event/{secret}", params={"raw": "true"})
    assert b"hunter2" in raw.content


# -- point 17: the client format -------------------------------------------------------------------------------


async def every_served_event(client: Clients, user: str, room_id: str, since: str) -> list[dict[str, Any]]:
    c = client(user)
    out: list[dict[str, Any]] = []
    r = await c.get(f"/rooms/{room_id}/messages", params={"limit": 100})
    out += r.json()["chunk"]
    out += (await c.get(f"/rooms/{room_id}/state")).json()
    body = (await c.get("/events", params={"from": since, "limit": 100})).json()
    out += body["memberships"] + [e for room in body["rooms"].values() for e in room["events"]]
    out += [e for room in (await c.get("/recent", params={"limit": 100})).json()["rooms"] for e in room["events"]]
    for e in list(out):
        out.append((await c.get(f"/rooms/{room_id}/event/{e['event_id']}")).json())
    return out


@pytest.mark.parametrize("version", ["10", "11"])
async def test_users_get_the_client_format_on_every_route(main, client, version):
    since = (await client(BOB).get("/events")).json()["next"]
    start = int(time.time() * 1000)
    room = await RoomDriver.create(client, ALICE, preset="public_chat", room_version=version)
    await room.member("join", BOB)
    first = await room.state(ALICE, TOPIC, {"topic": "first"})
    second = await room.state(ALICE, TOPIC, {"topic": "second"})
    await room.state(BOB, MEMBER, {"membership": "join", "displayname": "Bob"}, key=BOB, label="named")
    target = await room.say(BOB, "to redact")
    redaction = await room.redact(ALICE, target)
    stored = {e["event_id"]: e for e in await history(main, room.room_id)}
    served = await every_served_event(client, BOB, room.room_id, since)
    end = int(time.time() * 1000)
    assert len({e["event_id"] for e in served}) == len(stored)
    for event in served:
        assert not set(FEDERATION_ONLY) & event.keys(), event
        original = stored[event["event_id"]]
        unsigned = event["unsigned"]
        assert 0 <= unsigned["age"] <= end - original["origin_server_ts"], event
        assert original["origin_server_ts"] + unsigned["age"] >= start
        if event["event_id"] != target:
            want = {k: v for k, v in client_view(original).items() if k != "event_id"}
            if original["type"] == REDACTION and version == "11":
                want["redacts"] = original["content"]["redacts"]  # the client finds it where it always did
            assert {k: v for k, v in event.items() if k not in ("event_id", "unsigned")} == want
    by_id = {e["event_id"]: e for e in served}
    # a state event that replaced another: the replaced one's ID, content and sender
    assert by_id[second]["unsigned"]["replaces_state"] == first
    assert by_id[second]["unsigned"]["prev_content"] == {"topic": "first"}
    assert by_id[second]["unsigned"]["prev_sender"] == ALICE
    assert "prev_content" not in by_id[first]["unsigned"] and "replaces_state" not in by_id[first]["unsigned"]
    named = by_id[room.sent["named"]]["unsigned"]
    assert named["prev_content"] == {"membership": "join"} and named["prev_sender"] == BOB
    assert by_id[redaction]["redacts"] == target
    # the same events as the server holds them still have every key (raw=true)
    raw = await client("server").get(f"/rooms/{room.room_id}/event/{second}", params={"raw": "true"})
    assert {"hashes", "auth_events", "prev_events", "depth"} <= raw.json().keys() and "unsigned" not in raw.json()


async def test_prev_content_of_a_redacted_predecessor_is_pruned(main, client):
    room = await RoomDriver.create(client, ALICE, preset="public_chat", room_version="11")
    first = await room.state(ALICE, TOPIC, {"topic": "a secret topic"})
    await room.redact(ALICE, first)
    second = await room.state(ALICE, TOPIC, {"topic": "second"})
    r = await client(ALICE).get(f"/rooms/{room.room_id}/event/{second}")
    assert r.json()["unsigned"]["prev_content"] == {} and "secret" not in r.text


async def test_a_remote_servers_own_unsigned_is_never_served(main, client):
    room_id = "!unsigned:elsewhere.example"
    zed = "@zed:elsewhere.example"
    create, create_id = remote_event(room_id, "m.room.create", zed, {"creator": zed, "room_version": "10"}, [], 1,
                                     state_key="")  # fmt: skip
    join, join_id = remote_event(room_id, MEMBER, zed, {"membership": "join"}, [create_id], 2, state_key=zed)
    hv, hv_id = remote_event(room_id, "m.room.history_visibility", zed, {"history_visibility": "world_readable"},
                             [join_id], 3, state_key="")  # fmt: skip
    message, message_id = remote_event(room_id, "m.room.message", zed, {"body": "hi"}, [hv_id], 4)
    message["unsigned"] = {"redacted_because": {"sender": "@liar:elsewhere.example"}, "membership": "join"}
    await post_remote(client, room_id, [create, join, hv, message], event_ids=[None, None, None, message_id])
    r = await client(ALICE).get(f"/rooms/{room_id}/event/{message_id}")
    assert r.status_code == 200, r.text
    assert "liar" not in r.text
    assert set(r.json()["unsigned"]) == {"membership", "age"}


# -- point 18: the state as the server sees it, for writers only ---------------------------------------------


async def test_a_writer_reads_the_state_at_any_event_as_the_server_holds_it(main, client):
    room = await RoomDriver.create(client, ALICE, preset="private_chat", history_visibility="joined")
    early = await room.say(ALICE, "before carol")
    topic = await room.state(ALICE, TOPIC, {"topic": "to redact"})
    await room.redact(ALICE, topic)
    server = client("server")
    states = {}
    for at in (None, early, topic):
        params = {"server": "true"} | ({"at": at} if at else {})
        r = await server.get(f"/rooms/{room.room_id}/state", params=params)
        assert r.status_code == 200, r.text
        states[at] = r.json()
        # every event of the server's state, in the federation format, redacted ones pruned
        assert all({"hashes", "auth_events", "prev_events"} <= e.keys() and "unsigned" not in e for e in r.json())
    ids = await main.api.database().fetchall(
        "SELECT e.event_id FROM events e WHERE e.room_id = %(r)s AND e.state_key IS NOT NULL", {"r": room.room_id}
    )
    assert len(states[None]) == len(ids) and len(states[topic]) == len(ids)
    assert len(states[early]) == len(ids) - 1  # the topic came after
    redacted = next(e for e in states[None] if e["type"] == TOPIC)
    assert redacted["content"] == {}
    # the server user is in no room: without server=true the same reads are refused
    assert (await server.get(f"/rooms/{room.room_id}/state", params={"at": early})).status_code == 404
    assert (await server.get(f"/rooms/{room.room_id}/state")).status_code == 403
    # a user token cannot ask for the server's view, even of a room it is joined to
    for params in ({"server": "true"}, {"server": "1", "at": early}):
        r = await client(ALICE).get(f"/rooms/{room.room_id}/state", params=params)
        assert r.status_code == 403 and "server=true" in r.json()["error"], r.text
        r = await client(CAROL).get(f"/rooms/{room.room_id}/state", params=params)
        assert r.status_code == 403, r.text
