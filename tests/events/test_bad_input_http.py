"""Every kind of bad input of issue 18, through the HTTP routes against real PostgreSQL: each answered
with a 4xx whose message names the field at fault, and nothing stored (the row count of every table of
the plugin is the same before and after)."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import pytest

from factstream.host.app import Host
from tests.events import scenario
from tests.events.scenario import (
    ALICE,
    BOB,
    MEMBER,
    Clients,
    RoomDriver,
    error_of,
    remote_body,
    remote_event,
    table_counts,
)

REMOTE = "!bad:elsewhere"
ZED = "@zed:elsewhere"


@pytest.fixture
async def main(host_cluster) -> Host:
    host_cluster.configure(http={"tokens": scenario.TOKENS})
    return await host_cluster("main")


@pytest.fixture
async def rooms(main, client) -> tuple[RoomDriver, list[dict[str, Any]]]:
    """A local room (alice and bob joined, one message) and a remote room's first three events (held)."""
    room = await RoomDriver.create(client, ALICE, preset="public_chat")
    await room.member("join", BOB)
    await room.say(ALICE, "hello")
    create, c = remote_event(REMOTE, "m.room.create", ZED, {"room_version": "10"}, [], 1, state_key="")
    join, j = remote_event(REMOTE, MEMBER, ZED, {"membership": "join"}, [c], 2, state_key=ZED)
    message, _ = remote_event(REMOTE, "m.room.message", ZED, {"body": "hi"}, [j], 3)
    r = await client("server").post(f"/rooms/{REMOTE}/remote_events", content=remote_body([create, join]))
    assert r.status_code == 200, r.text
    return room, [create, join, message]


async def refused(main: Host, request, status: int, *fields: str) -> str:
    """Make the request (a coroutine function), check the answer and that nothing was stored."""
    before = await table_counts(main)
    r = await request()
    assert r.status_code == status, (fields, r.status_code, r.text[:300])
    message = error_of(r)
    for name in fields:
        assert name in message, (name, message)
    assert await table_counts(main) == before, message
    return message


def put(client: Clients, user: str, path: str, body: bytes | Any):
    kw = {"content": body} if isinstance(body, bytes) else {"json": body}
    return lambda: client(user).put(path, **kw)


def post(client: Clients, user: str, path: str, body: bytes | Any):
    kw = {"content": body} if isinstance(body, bytes) else {"json": body}
    return lambda: client(user).post(path, **kw)


# -- malformed JSON, non-objects -------------------------------------------------------------------------------

BAD_BODIES = [
    (b'{"body": ', "request body"),  # cut short
    (b"[1, 2]", "object"),  # not an object
    (b'"text"', "object"),
    (b"\xff\xfe{}", "UTF-8"),
    (b'{"body": "a", "body": "b"}', "duplicate key 'body'"),
    (b'{"n": NaN}', "NaN"),
]


async def test_malformed_json_and_non_objects(main, client, rooms):
    room, _ = rooms
    rid = room.room_id
    for body, field in BAD_BODIES:
        for request in (
            put(client, ALICE, f"/rooms/{rid}/send/m.room.message/j1", body),
            put(client, ALICE, f"/rooms/{rid}/state/m.room.topic", body),
            post(client, ALICE, "/createRoom", body),
            post(client, ALICE, f"/rooms/{rid}/invite", body),
            put(client, ALICE, f"/rooms/{rid}/redact/$x/j2", body),
        ):
            await refused(main, request, 400, field)


async def test_malformed_remote_batches(main, client, rooms):
    _, (_, _, message) = rooms
    good = json.dumps(message).encode()
    cases = [
        (b'{"events": ', "request body"),
        (b"[]", "object"),
        (b'{"events": {}}', "events"),
        (b'{"event": []}', "event"),
        (b'{"events": [1]}', "events[0]"),
        (b'{"events": [' + good + b', "text"]}', "events[1]"),
        (b'{"events": [' + good + b'], "outlier": "yes"}', "outlier"),
        (b'{"events": [' + good + b'], "event_ids": [null, null]}', "event_ids"),
        (b'{"events": [' + good + b'], "outlier": true, "backfill": true}', "backfill"),
        (b'{"events": [' + good[:-1] + b', "type": "again"}]}', "duplicate key 'type'"),
    ]
    for body, field in cases:
        await refused(main, post(client, "server", f"/rooms/{REMOTE}/remote_events", body), 400, field)


# -- missing and mistyped fields ----------------------------------------------------------------------------------


def without(event: dict, key: str) -> dict:
    return {k: v for k, v in event.items() if k != key}


def remote_cases(message: dict, join: dict) -> list[tuple[dict, str]]:
    return [
        *((without(message, key), key) for key in ("type", "sender", "room_id", "content", "depth", "prev_events")),
        (without(message, "origin_server_ts"), "origin_server_ts"),
        (dict(message, sender=5), "sender"),
        (dict(message, sender="zed"), "sender"),
        (dict(message, room_id="bad"), "room_id"),
        (dict(message, type=""), "type"),
        (dict(message, type=["m.room.message"]), "type"),
        (dict(message, state_key=3), "state_key"),
        (dict(message, content="text"), "content"),
        (dict(message, content=[]), "content"),
        (dict(message, prev_events="$x"), "prev_events"),
        (dict(message, prev_events=[5]), "prev_events[0]"),
        (dict(message, prev_events=["not-an-id"]), "prev_events[0]"),
        (dict(message, prev_events=[f"$p{i}" for i in range(21)]), "prev_events"),
        (dict(message, depth="3"), "depth"),
        (dict(message, depth=True), "depth"),
        (dict(message, depth=3.5), "depth"),
        (dict(message, origin_server_ts=-1), "origin_server_ts"),
        (dict(message, event_id=5), "event_id"),
        (dict(join, content={"membership": "dance"}), "content.membership"),
        (dict(join, content={}), "content.membership"),
        (without(join, "state_key"), "state_key"),
    ]


async def test_missing_and_mistyped_fields_of_remote_events(main, client, rooms):
    """The bad event comes second, after a good one: the message says which, and neither is stored."""
    _, (_, join, message) = rooms
    follow, _ = remote_event(REMOTE, "m.room.message", ZED, {"body": "good"}, [], 9)
    for bad, field in remote_cases(message, join):
        body = remote_body([follow, bad])
        await refused(main, post(client, "server", f"/rooms/{REMOTE}/remote_events", body), 400, "events[1]", field)
    # an event of another room than the route's (named by its ID)
    stray, stray_id = remote_event("!other:elsewhere", "m.room.message", ZED, {"body": "stray"}, [], 4)
    body = remote_body([follow, stray])
    await refused(main, post(client, "server", f"/rooms/{REMOTE}/remote_events", body), 400, "room_id", stray_id)
    # an ID inside the event that disagrees with the one given beside it
    body = remote_body([dict(message, event_id="$inside")], event_ids=["$beside"])
    await refused(main, post(client, "server", f"/rooms/{REMOTE}/remote_events", body), 400, "event_id")


async def test_missing_and_mistyped_fields_of_local_requests(main, client, rooms):
    room, _ = rooms
    rid = room.room_id
    cases = [
        (post(client, ALICE, "/createRoom", {"preset": 5}), "preset"),
        (post(client, ALICE, "/createRoom", {"preset": "open_bar"}), "preset"),
        (post(client, ALICE, "/createRoom", {"name": 5}), "name"),
        (post(client, ALICE, "/createRoom", {"topic": {}}), "topic"),
        (post(client, ALICE, "/createRoom", {"history_visibility": 1}), "history_visibility"),
        (post(client, ALICE, "/createRoom", {"room_version": "99"}), "room_version"),
        (post(client, ALICE, "/createRoom", {"room_version": 10}), "room_version"),
        (post(client, ALICE, "/createRoom", {"initial_state": "x"}), "initial_state"),
        (post(client, ALICE, "/createRoom", {"initial_state": [{"type": 5, "content": {}}]}), "initial_state[0]"),
        (post(client, ALICE, "/createRoom", {"invite": "@bob:hs"}), "invite"),
        (post(client, ALICE, "/createRoom", {"invite": [5]}), "invite"),
        (post(client, ALICE, f"/rooms/{rid}/invite", {}), "user_id"),
        (post(client, ALICE, f"/rooms/{rid}/invite", {"user_id": 5}), "user_id"),
        (post(client, ALICE, f"/rooms/{rid}/kick", {"user_id": "bob"}), "user_id"),
        (post(client, ALICE, f"/rooms/{rid}/ban", {"user_id": BOB, "reason": 5}), "reason"),
        (put(client, ALICE, f"/rooms/{rid}/redact/$x/k1", {"reason": ["no"]}), "reason"),
        (put(client, ALICE, f"/rooms/{rid}/state/{MEMBER}/{BOB}", {"membership": "dance"}), "membership"),
        (put(client, ALICE, f"/rooms/{rid}/send/m.room.message/k2", {"n": 1.5}), "n"),
        (put(client, ALICE, f"/rooms/{rid}/send/m.room.message/k3", {"n": 2**60}), "n"),
    ]
    for request, field in cases:
        await refused(main, request, 403 if field == "membership" else 400, field)
    reads = [
        ({"dir": "sideways"}, "dir"),
        ({"limit": "many"}, "limit"),
        ({"limit": 0}, "limit"),
        ({"limit": 1001}, "limit"),
        ({"from": "garbage"}, "from"),
        ({"to": "t-1-1"}, "to"),
    ]
    for params, field in reads:
        await refused(main, lambda p=params: client(ALICE).get(f"/rooms/{rid}/messages", params=p), 400, field)


# -- size, depth ---------------------------------------------------------------------------------------------------


def sized(message: dict, size: int) -> bytes:
    """``message`` padded so that its JSON is exactly ``size`` bytes (its ID: the reference hash)."""
    pad = 0
    for _ in range(3):
        event = dict(message, content={"body": "p" * pad})
        raw = json.dumps(event, separators=(",", ":")).encode()
        pad += size - len(raw)
    assert len(raw) == size
    return raw


async def test_events_over_65536_bytes(main, client, rooms):
    room, (_, _, message) = rooms
    too_big = sized(message, 65_537)
    body = b'{"events": [' + too_big + b"]}"
    await refused(main, post(client, "server", f"/rooms/{REMOTE}/remote_events", body), 400, "events[0]", "65536")
    r = await client("server").post(
        f"/rooms/{REMOTE}/remote_events", content=b'{"events": [' + sized(message, 65_536) + b"]}"
    )
    assert r.status_code == 200, r.text
    # a local event is measured as the server writes it
    big = put(client, ALICE, f"/rooms/{room.room_id}/send/m.room.message/big", {"body": "b" * 65_500})
    await refused(main, big, 400, "65536")
    # a body over the plugin's request limit (1 MiB by default) is refused before it is read
    huge = put(client, ALICE, f"/rooms/{room.room_id}/send/m.room.message/huge", {"body": "h" * 1_100_000})
    await refused(main, huge, 413)


async def test_depth_out_of_range(main, client, rooms):
    _, (_, _, message) = rooms
    for depth in (-1, 2**63, 10**30):
        body = remote_body([dict(message, depth=depth)], event_ids=["$deep"])
        await refused(main, post(client, "server", f"/rooms/{REMOTE}/remote_events", body), 400, "depth")


async def test_depth_beyond_canonical_json_is_refused_in_room_version_10(main, client, rooms):
    _, (_, _, message) = rooms
    body = remote_body([dict(message, depth=2**53)], event_ids=["$beyond"])
    await refused(main, post(client, "server", f"/rooms/{REMOTE}/remote_events", body), 400, "depth")


async def test_a_local_event_past_the_deepest_depth_is_refused_naming_depth(main, client):
    room_id = "!deepest:elsewhere"
    create, c = remote_event(room_id, "m.room.create", ZED, {"room_version": "10"}, [], 1, state_key="")
    rules, r_ = remote_event(room_id, "m.room.join_rules", ZED, {"join_rule": "public"}, [c], 2, state_key="")
    bob, b = remote_event(room_id, MEMBER, BOB, {"membership": "join"}, [r_], 3, state_key=BOB)
    last, _ = remote_event(room_id, "m.room.message", ZED, {"body": "at the bottom"}, [b], 2**53 - 1)
    r = await client("server").post(f"/rooms/{room_id}/remote_events", content=remote_body([create, rules, bob, last]))
    assert r.status_code == 200, r.text
    message = await refused(main, put(client, BOB, f"/rooms/{room_id}/send/m.room.message/d1", {"body": "x"}), 400)
    assert message.startswith("depth"), message


# -- unknown rooms, other rooms ------------------------------------------------------------------------------------


async def test_local_writes_to_an_unknown_room(main, client, rooms):
    nowhere = "!nowhere:hs"
    for request in (
        put(client, ALICE, f"/rooms/{nowhere}/send/m.room.message/u1", {"body": "x"}),
        put(client, ALICE, f"/rooms/{nowhere}/state/m.room.topic", {"topic": "x"}),
        post(client, ALICE, f"/rooms/{nowhere}/join", {}),
        post(client, ALICE, f"/rooms/{nowhere}/leave", {}),
        post(client, ALICE, f"/rooms/{nowhere}/invite", {"user_id": BOB}),
        post(client, ALICE, f"/rooms/{nowhere}/ban", {"user_id": BOB}),
        put(client, ALICE, f"/rooms/{nowhere}/redact/$x/u2", {}),
    ):
        await refused(main, request, 404, nowhere)
    # a remote batch for a room not held needs its create event or its version
    _, (_, _, message) = rooms
    body = remote_body([dict(message, room_id="!unheld:elsewhere")])
    await refused(main, post(client, "server", "/rooms/!unheld:elsewhere/remote_events", body), 400, "room_version")


async def test_a_redaction_of_an_event_in_another_room(main, client, rooms):
    room, _ = rooms
    other = await RoomDriver.create(client, ALICE, preset="public_chat")
    target = await other.say(ALICE, "over there")
    request = put(client, ALICE, f"/rooms/{room.room_id}/redact/{target}/o1", {"reason": "no"})
    await refused(main, request, 400, "redacts", target)


# -- NUL characters ----------------------------------------------------------------------------------------------------


async def test_nul_characters(main, client, rooms):
    room, (_, join, message) = rooms
    rid = room.room_id
    local = [
        (put(client, ALICE, f"/rooms/{rid}/send/m.room.message/n1", b'{"body": "a\x00b"}'), "body"),  # a raw NUL
        (put(client, ALICE, f"/rooms/{rid}/send/m.room.message/n2", {"body": "a\x00b"}), "body"),  # escaped
        (put(client, ALICE, f"/rooms/{rid}/send/m.room.message/n3", {"k\x00": 1}), "k"),
        (put(client, ALICE, f"/rooms/{rid}/send/m.room.message/n4", {"x": {"y": ["\x00"]}}), "x.y[0]"),
        (put(client, ALICE, f"/rooms/{rid}/state/m.room.topic/a%00b", {"topic": "t"}), "state_key"),
        (put(client, ALICE, "/rooms/%21a%00b/send/m.room.message/n5", {"body": "x"}), "room_id"),
        (put(client, ALICE, f"/rooms/{rid}/send/m.%00x/n6", {"body": "x"}), "event_type"),
        (put(client, ALICE, f"/rooms/{rid}/send/m.room.message/n%007", {"body": "x"}), "txn_id"),
        (put(client, ALICE, f"/rooms/{rid}/redact/$a%00b/n8", {}), "event_id"),
        (post(client, ALICE, f"/rooms/{rid}/invite", {"user_id": "@b\x00b:hs"}), "user_id"),
        (post(client, ALICE, "/createRoom", {"name": "n\x00"}), "name"),
        (lambda: client(ALICE).get(f"/rooms/{rid}/messages", params={"from": "t1\x00"}), "from"),
        (lambda: client(ALICE).get(f"/rooms/{rid}/state", params={"at": "$\x00"}), "at"),
        (lambda: client(ALICE).get(f"/rooms/{rid}/event/$%00"), "event_id"),
    ]
    for request, field in local:
        await refused(main, request, 400, field)
    remote = [
        (dict(message, sender="@z\x00:elsewhere"), "sender"),
        (dict(message, type="m.\x00"), "type"),
        (dict(message, content={"body": "\x00"}), "content.body"),
        (dict(message, content={"\x00": "k"}), "content"),
        (dict(join, state_key="@z\x00:elsewhere"), "state_key"),
    ]
    for bad, field in remote:
        body = remote_body([bad])
        await refused(main, post(client, "server", f"/rooms/{REMOTE}/remote_events", body), 400, field)


# -- a sender the token does not own ----------------------------------------------------------------------------------


async def test_a_sender_the_token_does_not_own(main, client, rooms):
    room, (_, _, message) = rooms
    rid = room.room_id
    # a remote batch (any sender) needs the writer token; a user's token may not write one, even for
    # events naming that user as sender
    own = dict(message, sender=ALICE)
    await refused(main, post(client, ALICE, f"/rooms/{REMOTE}/remote_events", remote_body([own])), 403)
    await refused(main, post(client, ALICE, f"/rooms/{REMOTE}/remote_events", remote_body([message])), 403)
    r = await client("server").post(f"/rooms/{REMOTE}/remote_events", content=remote_body([message]))
    assert r.status_code == 200, r.text
    # a local event's sender is the token's user: a "sender" in the content changes nothing
    r = await client(ALICE).put(f"/rooms/{rid}/send/m.room.message/s1", json={"body": "hi", "sender": BOB})
    assert r.status_code == 200, r.text
    event = (await client(ALICE).get(f"/rooms/{rid}/event/{r.json()['event_id']}")).json()
    assert event["sender"] == ALICE and event["content"]["sender"] == BOB
    # nobody joins (or sets the membership of) another user in their name
    other = "@someone:hs"
    for request in (
        put(client, ALICE, f"/rooms/{rid}/state/{MEMBER}/{other}", {"membership": "join"}),
        put(client, BOB, f"/rooms/{rid}/state/{MEMBER}/{ALICE}", {"membership": "leave"}),
    ):
        await refused(main, request, 403)
    # no token at all
    await refused(main, lambda: client("nobody-has-this").put(f"/rooms/{rid}/send/m.room.message/s2", json={}), 401)


# -- transaction IDs ---------------------------------------------------------------------------------------------------


async def test_a_transaction_id_reused(main, client, rooms):
    room, _ = rooms
    rid = room.room_id
    r = await client(ALICE).put(f"/rooms/{rid}/send/m.room.message/same", json={"body": "one"})
    first = r.json()["event_id"]
    before = await table_counts(main)
    r = await client(ALICE).put(f"/rooms/{rid}/send/m.room.message/same", json={"body": "one"})
    assert r.status_code == 200 and r.json()["event_id"] == first
    assert await table_counts(main) == before
    for request in (
        put(client, ALICE, f"/rooms/{rid}/send/m.room.message/same", {"body": "two"}),
        put(client, ALICE, f"/rooms/{rid}/send/m.room.notice/same", {"body": "one"}),
    ):
        await refused(main, request, 409, "same")
    # another user's transaction IDs are theirs
    r = await client(BOB).put(f"/rooms/{rid}/send/m.room.message/same", json={"body": "two"})
    assert r.status_code == 200 and r.json()["event_id"] != first
    # retries racing each other store one event
    answers = await asyncio.gather(
        *(client(ALICE).put(f"/rooms/{rid}/send/m.room.message/race", json={"body": "r"}) for _ in range(6))
    )
    assert {a.status_code for a in answers} == {200}
    assert len({a.json()["event_id"] for a in answers}) == 1
    rows = await main.api.database().fetchall(
        "SELECT count(*) FROM event_txn_ids WHERE user_id = %(u)s AND txn_id = 'send/race'", {"u": ALICE}
    )
    assert rows == [(1,)]
    # redactions are idempotent by transaction ID too
    target = await room.say(ALICE, "to redact")
    one = await client(ALICE).put(f"/rooms/{rid}/redact/{target}/red", json={})
    two = await client(ALICE).put(f"/rooms/{rid}/redact/{target}/red", json={})
    assert one.json() == two.json()


async def test_a_transaction_id_is_scoped_to_its_endpoint(main, client, rooms):
    room, _ = rooms
    rid = room.room_id
    target = await room.say(ALICE, "redact me")
    r = await client(ALICE).put(f"/rooms/{rid}/redact/{target}/shared-id", json={})
    assert r.status_code == 200, r.text
    r = await client(ALICE).put(f"/rooms/{rid}/send/m.room.message/shared-id", json={"body": "a message"})
    assert r.status_code == 200, r.text
