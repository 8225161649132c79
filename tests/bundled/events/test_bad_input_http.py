"""Every kind of bad input of issue 18, through the HTTP routes against real PostgreSQL: each answered
with a 4xx whose message names the field at fault, and nothing stored (the row count of every table of
the plugin is the same before and after)."""

from __future__ import annotations

import asyncio
import json
from typing import Any
from urllib.parse import quote

import pytest
from factstream_events.rules.contentrules import STATE_TYPES
from factstream_events.rules.errors import InvalidEvent
from factstream_events.rules.validate import MEMBERSHIPS, REDACTION

from factstream.host.app import Host
from tests.bundled.events import scenario
from tests.bundled.events.conftest import store_of
from tests.bundled.events.remote_history import RemoteRoom, persist
from tests.bundled.events.scenario import (
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
        (put(client, ALICE, f"/rooms/{rid}/state/{MEMBER}/{BOB}", {"membership": "dance"}), "content.membership"),
        (put(client, ALICE, f"/rooms/{rid}/send/m.room.message/k2", {"msgtype": "m.text", "body": "", "n": 1.5}), "n"),
        (
            put(client, ALICE, f"/rooms/{rid}/send/m.room.message/k3", {"msgtype": "m.text", "body": "", "n": 2**60}),
            "n",
        ),
    ]
    for request, field in cases:
        await refused(main, request, 400, field)
    reads = [
        ({"dir": "sideways"}, "dir"),
        ({"limit": "many"}, "limit"),
        ({"limit": -1}, "limit"),
        ({"limit": "\u00b2"}, "limit"),
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
    big = put(
        client, ALICE, f"/rooms/{room.room_id}/send/m.room.message/big", {"msgtype": "m.text", "body": "b" * 65_500}
    )
    await refused(main, big, 400, "65536")
    # a body over the plugin's request limit (1 MiB by default) is refused before it is read
    huge = put(
        client, ALICE, f"/rooms/{room.room_id}/send/m.room.message/huge", {"msgtype": "m.text", "body": "h" * 1_100_000}
    )
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


def nested(depth: int) -> bytes:
    return b"[" * depth + b"]" * depth


async def test_a_remote_batch_nested_too_deeply_is_refused_naming_the_nesting(main, client, rooms):
    """1,000 levels deep inside an event, or an event that is itself that deep, like a user's body."""
    room, (_, _, message) = rooms
    event = json.dumps(dict(message, content={"body": "x", "deep": "here"})).encode()
    deep_event = event.replace(b'"here"', nested(1_000))
    for body in (b'{"events": [' + deep_event + b"]}", b'{"events": [' + nested(1_000) + b"]}"):
        await refused(main, post(client, "server", f"/rooms/{REMOTE}/remote_events", body), 400, "nested too deeply")
    deep_content = b'{"msgtype": "m.text", "body": "x", "deep": ' + nested(1_000) + b"}"
    send = put(client, ALICE, f"/rooms/{room.room_id}/send/m.room.message/deep", deep_content)
    await refused(main, send, 400, "nested too deeply")


# -- what a local event must be ---------------------------------------------------------------------------------


async def test_the_send_route_refuses_state_types_and_redactions_naming_event_type(main, client, rooms):
    """A type the plugin reads only as state has a state key; a redaction names its target."""
    room, _ = rooms
    for event_type in sorted(STATE_TYPES | {REDACTION}):
        content = {
            "membership": "join",
            "name": "n",
            "topic": "t",
            "join_rule": "public",
            "history_visibility": "shared",
        }
        send = put(client, ALICE, f"/rooms/{room.room_id}/send/{event_type}/st-{event_type}", content)
        message = await refused(main, send, 400, "event_type", event_type)
        assert ("state" in message) == (event_type != REDACTION), message
    # as the Python API: the field is the event's type
    for event_type in sorted(STATE_TYPES | {REDACTION}):
        with pytest.raises(InvalidEvent, match=f"^type: {event_type}"):
            await store_of(main).send(room.room_id, ALICE, event_type, {"membership": "join"})


async def test_initial_state_entries_are_checked_naming_the_entry_and_the_field(main, client):
    good = {"type": "org.example.x", "content": {}}
    cases = [
        ({"type": "", "content": {}}, "initial_state[1].type"),
        ({"type": 5, "content": {}}, "initial_state[1].type"),
        ({"content": {}}, "initial_state[1].type"),
        ({"type": "t" * 256, "content": {}}, "initial_state[1].type"),
        ({"type": "x.y", "state_key": 5, "content": {}}, "initial_state[1].state_key"),
        ({"type": "x.y", "state_key": None, "content": {}}, "initial_state[1].state_key"),
        ({"type": "x.y", "state_key": ["a"], "content": {}}, "initial_state[1].state_key"),
        ({"type": "x.y", "state_key": "k" * 256, "content": {}}, "initial_state[1].state_key"),
        ({"type": "x.y"}, "initial_state[1].content"),
        ({"type": "x.y", "content": ["a"]}, "initial_state[1].content"),
        ("x.y", "initial_state[1]"),
        ({"type": "m.room.topic", "content": {"topic": 5}}, "initial_state[1].content.topic"),
        ({"type": MEMBER, "state_key": "bob", "content": {"membership": "invite"}}, "initial_state[1].state_key"),
    ]
    for entry, field in cases:
        await refused(main, post(client, ALICE, "/createRoom", {"initial_state": [good, entry]}), 400, field)
    r = await client(ALICE).post("/createRoom", json={"initial_state": [good, dict(good, state_key="k")]})
    assert r.status_code == 200, r.text


#: Not user IDs (``@localpart:server``): each refused wherever a user ID is asked for.
NOT_USER_IDS = [
    "not-a-user",
    "",
    "@",
    "@:hs",
    "@bob",
    "@bob:",
    "bob:hs",
    "@b ob:hs",
    "@bob:h s",
    "@b\tob:hs",
    "@bob:hs:123456",
    "@bob:h_s",
    "@" + "b" * 252 + ":hs",
]
USER_IDS = [
    "@bob:hs",
    "@bob:hs:8448",
    "@bob:[::1]",
    "@bob:10.0.0.1:80",
    "@b.o_b=+-:Example.org",
    "@" + "b" * 251 + ":hs",
]


async def test_member_state_keys_and_user_ids_must_be_user_ids_on_every_route(main, client, rooms):
    room, _ = rooms
    rid = room.room_id
    for bad in NOT_USER_IDS:
        for membership in sorted(MEMBERSHIPS):
            path = f"/rooms/{rid}/state/{MEMBER}" + (f"/{quote(bad, safe='')}" if bad else "")
            await refused(main, put(client, ALICE, path, {"membership": membership}), 400, "state_key")
        for verb in ("invite", "kick", "ban", "unban"):
            await refused(main, post(client, ALICE, f"/rooms/{rid}/{verb}", {"user_id": bad}), 400, "user_id")
        await refused(main, post(client, ALICE, "/createRoom", {"invite": [bad]}), 400, "invite")
        entry = {"type": MEMBER, "state_key": bad, "content": {"membership": "invite"}}
        await refused(main, post(client, ALICE, "/createRoom", {"initial_state": [entry]}), 400, "state_key")
    for good in USER_IDS:
        r = await client(ALICE).post(f"/rooms/{rid}/invite", json={"user_id": good})
        assert r.status_code == 200 or good == BOB, (good, r.text)
        r = await client(ALICE).put(f"/rooms/{rid}/state/{MEMBER}/{quote(good, safe='')}", json={"membership": "ban"})
        assert r.status_code == 200, (good, r.text)


async def test_messages_limit_above_1000_reads_1000_and_0_reads_nothing(main, client):
    """As the reference: a larger ``limit`` is clamped to 1,000; ``limit=0`` answers no events and an
    ``end`` equal to ``start``, from which paging goes on as from ``start``."""
    room = RemoteRoom("!long:elsewhere")
    room.create(ZED, history_visibility="world_readable")
    for i in range(1_001):
        room.add("m.room.message", ZED, {"msgtype": "m.text", "body": f"m{i}"})
    await persist(store_of(main), room.room_id, room.events, batch=500)
    url = f"/rooms/{room.room_id}/messages"
    thousand = ageless((await client(ALICE).get(url, params={"limit": 1_000})).json())
    assert len(thousand["chunk"]) == 1_000
    for limit in ("1001", "5000", "9" * 40):
        r = await client(ALICE).get(url, params={"limit": limit})
        assert r.status_code == 200 and ageless(r.json()) == thousand, (limit, r.text[:200])
    for direction in ("b", "f"):
        start = (await client(ALICE).get(url, params={"limit": 3, "dir": direction})).json()["end"]
        empty = (await client(ALICE).get(url, params={"limit": 0, "dir": direction, "from": start})).json()
        assert empty == {"start": start, "end": start, "chunk": []}
        after = await client(ALICE).get(url, params={"limit": 4, "dir": direction, "from": empty["end"]})
        again = await client(ALICE).get(url, params={"limit": 4, "dir": direction, "from": start})
        assert ageless(after.json()) == ageless(again.json())

    newest = (await client(ALICE).get(url, params={"limit": 0})).json()
    assert newest["chunk"] == [] and newest["end"] == newest["start"] == thousand["start"]


def ageless(page: dict[str, Any]) -> dict[str, Any]:
    """A ``/messages`` page without ``unsigned.age``, which grows between two reads of the same events."""
    for event in page["chunk"]:
        event["unsigned"].pop("age", None)
    return page


async def test_odd_power_level_strings_of_a_remote_room_do_not_break_local_events(main, client):
    """Levels as strings (room versions before 10 allow them) that are not plain decimal integers read
    as the default, whatever Python's ``int`` would make of them."""
    room_id = "!levels:elsewhere"
    odd = {"@bob:hs": "\u00b2", "@carol:hs": "--5", "@dave:hs": "9" * 5_000, "@eve:hs": "\u0661"}
    create, c = remote_event(room_id, "m.room.create", ZED, {"room_version": "9"}, [], 1, state_key="")
    join, j = remote_event(room_id, MEMBER, ZED, {"membership": "join"}, [c], 2, state_key=ZED)
    levels = {"users": {ZED: 100, **odd}, "state_default": "\u00b2"}
    power, p = remote_event(room_id, "m.room.power_levels", ZED, levels, [j], 3, state_key="")
    rules, _ = remote_event(room_id, "m.room.join_rules", ZED, {"join_rule": "public"}, [p], 4, state_key="")
    r = await client("server").post(
        f"/rooms/{room_id}/remote_events", content=remote_body([create, join, power, rules])
    )
    assert r.status_code == 200, r.text
    for user in odd:
        assert (await client(user).post(f"/rooms/{room_id}/join")).status_code == 200
        r = await client(user).put(f"/rooms/{room_id}/state/m.room.topic", json={"topic": "mine"})
        assert r.status_code == 403 and "power level 0 < 50" in r.text, r.text


# -- unknown rooms, other rooms ------------------------------------------------------------------------------------


async def test_local_writes_to_an_unknown_room(main, client, rooms):
    nowhere = "!nowhere:hs"
    for request in (
        put(client, ALICE, f"/rooms/{nowhere}/send/m.room.message/u1", {"msgtype": "m.text", "body": "x"}),
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
        (
            put(client, ALICE, f"/rooms/{rid}/send/m.room.message/n2", {"msgtype": "m.text", "body": "a\x00b"}),
            "body",
        ),  # escaped
        (put(client, ALICE, f"/rooms/{rid}/send/m.room.message/n3", {"k\x00": 1}), "k"),
        (put(client, ALICE, f"/rooms/{rid}/send/m.room.message/n4", {"x": {"y": ["\x00"]}}), "x.y[0]"),
        (put(client, ALICE, f"/rooms/{rid}/state/m.room.topic/a%00b", {"topic": "t"}), "state_key"),
        (put(client, ALICE, "/rooms/%21a%00b/send/m.room.message/n5", {"msgtype": "m.text", "body": "x"}), "room_id"),
        (put(client, ALICE, f"/rooms/{rid}/send/m.%00x/n6", {"body": "x"}), "event_type"),
        (put(client, ALICE, f"/rooms/{rid}/send/m.room.message/n%007", {"msgtype": "m.text", "body": "x"}), "txn_id"),
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
    r = await client(ALICE).put(
        f"/rooms/{rid}/send/m.room.message/s1", json={"msgtype": "m.text", "body": "hi", "sender": BOB}
    )
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
    r = await client(ALICE).put(f"/rooms/{rid}/send/m.room.message/same", json={"msgtype": "m.text", "body": "one"})
    first = r.json()["event_id"]
    before = await table_counts(main)
    r = await client(ALICE).put(f"/rooms/{rid}/send/m.room.message/same", json={"msgtype": "m.text", "body": "one"})
    assert r.status_code == 200 and r.json()["event_id"] == first
    assert await table_counts(main) == before
    for request in (
        put(client, ALICE, f"/rooms/{rid}/send/m.room.message/same", {"msgtype": "m.text", "body": "two"}),
        put(client, ALICE, f"/rooms/{rid}/send/m.room.notice/same", {"body": "one"}),
    ):
        await refused(main, request, 409, "same")
    # another user's transaction IDs are theirs
    r = await client(BOB).put(f"/rooms/{rid}/send/m.room.message/same", json={"msgtype": "m.text", "body": "two"})
    assert r.status_code == 200 and r.json()["event_id"] != first
    # retries racing each other store one event
    answers = await asyncio.gather(
        *(
            client(ALICE).put(f"/rooms/{rid}/send/m.room.message/race", json={"msgtype": "m.text", "body": "r"})
            for _ in range(6)
        )
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
    r = await client(ALICE).put(
        f"/rooms/{rid}/send/m.room.message/shared-id", json={"msgtype": "m.text", "body": "a message"}
    )
    assert r.status_code == 200, r.text
