"""The content of local events of the types the plugin interprets, as the Matrix client-server API
requires it (``factstream_events.rules.contentrules``): every field of every such type, given every kind of
JSON value (and left out), is refused with a 400 naming it exactly when the rule says so, on the state
and send routes and in ``createRoom``'s ``initial_state``; remote events are stored as received."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import httpx
from factstream_events.rules.contentrules import LEVEL_MAPS, LEVELS

from tests.bundled.events.scenario import ALICE, BOB, MEMBER, Clients, RoomDriver, error_of, remote_event, table_counts

MISSING = object()
#: One value of each JSON kind (integers within canonical JSON's range: beyond it, any event is a 400).
KINDS: dict[str, Any] = {
    "missing": MISSING,
    "string": "text",
    "empty string": "",
    "integer": 5,
    "negative integer": -5,
    "integer string": "5",
    "boolean": True,
    "null": None,
    "list": [5],
    "object": {"k": 5},
}
MEMBERSHIPS = ("join", "invite", "leave", "ban", "knock")
VISIBILITIES = ("world_readable", "shared", "invited", "joined")
JOIN_RULES = ("public", "invite", "private", "knock", "restricted", "knock_restricted")


def string(value: Any) -> bool:
    return isinstance(value, str)


def optional_string(value: Any) -> bool:
    return value is MISSING or isinstance(value, str)


def level(value: Any) -> bool:
    return value is MISSING or (isinstance(value, int) and not isinstance(value, bool))


def one_of(*allowed: str) -> Callable[[Any], bool]:
    return lambda value: isinstance(value, str) and value in allowed


#: (type, state key or None for a message, the rest of the content, field, values beyond KINDS, the rule)
FIELDS: list[tuple[str, str | None, dict[str, Any], str, tuple[Any, ...], Callable[[Any], bool]]] = [
    (MEMBER, BOB, {"membership": "invite"}, "membership", (*MEMBERSHIPS, "dance", "JOIN"), one_of(*MEMBERSHIPS)),
    (MEMBER, BOB, {"membership": "ban"}, "reason", (), optional_string),
    *(("m.room.power_levels", "", {"users": {ALICE: 100}}, name, (0, 100), level) for name in LEVELS),
    ("m.room.join_rules", "", {}, "join_rule", (*JOIN_RULES, "open"), one_of(*JOIN_RULES)),
    ("m.room.history_visibility", "", {}, "history_visibility", (*VISIBILITIES, "all"), one_of(*VISIBILITIES)),
    ("m.room.name", "", {}, "name", ("n" * 255,), string),
    ("m.room.topic", "", {}, "topic", (), string),
    ("m.room.message", None, {"msgtype": "m.text", "body": "b"}, "msgtype", ("m.notice",), string),
    ("m.room.message", None, {"msgtype": "m.text", "body": "b"}, "body", (), string),
]


def maps(name: str) -> list[tuple[Any, bool]]:
    """Values of the power-levels map ``name`` and whether the rule allows each (alice keeps her 100
    in ``users``, which is never left out: without it she could change nothing more)."""
    key = "@bob:hs" if name == "users" else "m.room.name"
    keep = {ALICE: 100} if name == "users" else {}
    kinds = [(v, v is MISSING) for v in KINDS.values() if not isinstance(v, dict) and (name != "users" or v != MISSING)]
    levels = [(v, level(v) and v is not MISSING) for v in KINDS.values() if v is not MISSING]
    return kinds + [({**keep, key: v}, allowed) for v, allowed in levels] + [(dict(keep), True)]


def content_of(rest: dict[str, Any], name: str, value: Any) -> dict[str, Any]:
    content = {k: v for k, v in rest.items() if k != name}
    return content if value is MISSING else {**content, name: value}


def request(client: Clients, room_id: str, event_type: str, key: str | None, content: dict[str, Any]):
    if key is None:
        return client(ALICE).put(f"/rooms/{room_id}/send/{event_type}/c{len(str(content))}{id(content)}", json=content)
    return client(ALICE).put(f"/rooms/{room_id}/state/{event_type}" + (f"/{key}" if key else ""), json=content)


def judge(r: httpx.Response, allowed: bool, field: str, case: Any) -> None:
    """An allowed value is stored, or refused by the policy (bob cannot be made to join), never a 400."""
    if allowed:
        assert r.status_code == 200 or r.json()["errcode"] == "M_FORBIDDEN", (case, r.text)
    else:
        assert r.status_code == 400 and field in error_of(r), (case, r.status_code, r.text)


async def test_every_field_of_every_interpreted_type_with_every_kind_of_value(main, client):
    room = await RoomDriver.create(client, ALICE, preset="public_chat", room_version="10")
    for event_type, key, rest, name, extra, rule in FIELDS:
        for value in (*KINDS.values(), *extra):
            before = await table_counts(main)
            r = await request(client, room.room_id, event_type, key, content_of(rest, name, value))
            case = (event_type, name, value)
            judge(r, rule(value), f"content.{name}", case)
            if r.status_code == 400:
                assert await table_counts(main) == before, case
    for name in LEVEL_MAPS:
        for value, allowed in maps(name):
            content = content_of({"users": {ALICE: 100}}, name, value)
            r = await request(client, room.room_id, "m.room.power_levels", "", content)
            judge(r, allowed, f"content.{name}", (name, value))


async def test_the_keys_of_power_level_users_are_user_ids(main, client):
    room = await RoomDriver.create(client, ALICE, preset="public_chat")
    for key in ("bob", "@bob", "", "@:hs", "@bob:"):
        r = await request(client, room.room_id, "m.room.power_levels", "", {"users": {ALICE: 100, key: 50}})
        assert r.status_code == 400 and "content.users" in error_of(r) and repr(key) in error_of(r), (key, r.text)
    r = await request(client, room.room_id, "m.room.power_levels", "", {"users": {ALICE: 100, "@bob:hs": 50}})
    assert r.status_code == 200, r.text


async def test_join_rules_are_those_of_the_room_version(main, client):
    since = {"knock": 7, "restricted": 8, "knock_restricted": 10}
    for version in ("6", "7", "8", "9", "10", "11"):
        room = await RoomDriver.create(client, ALICE, preset="public_chat", room_version=version)
        for rule in JOIN_RULES:
            r = await request(client, room.room_id, "m.room.join_rules", "", {"join_rule": rule})
            judge(r, int(version) >= since.get(rule, 0), "content.join_rule", (version, rule))


async def test_initial_state_is_held_to_the_same_rules_naming_its_entry(main, client):
    good = {"type": "org.example.x", "state_key": "", "content": {}}
    for event_type, key, rest, name, extra, rule in FIELDS:
        bad = next(v for v in (*KINDS.values(), *extra) if not rule(v))
        entry = {"type": event_type, "state_key": key or "", "content": content_of(rest, name, bad)}
        r = await client(ALICE).post("/createRoom", json={"initial_state": [good, entry]})
        expected = f"initial_state[1].content.{name}"
        assert r.status_code == 400 and expected in error_of(r), (event_type, name, bad, r.text)


async def test_remote_events_are_stored_as_received(main, client):
    """A remote server's events are not held to the local rules: their bytes are kept as they came."""
    room_id, zed = "!asis:elsewhere", "@zed:elsewhere"
    create, c = remote_event(room_id, "m.room.create", zed, {"room_version": "10"}, [], 1, state_key="")
    join, j = remote_event(room_id, MEMBER, zed, {"membership": "join"}, [c], 2, state_key=zed)
    levels, p = remote_event(
        room_id, "m.room.power_levels", zed, {"users": {zed: "100"}, "ban": []}, [j], 3, state_key=""
    )
    topic, t = remote_event(room_id, "m.room.topic", zed, {"topic": 5}, [p], 4, state_key="")
    message, _ = remote_event(room_id, "m.room.message", zed, {"body": ["not", "text"]}, [t], 5)
    r = await client("server").post(
        f"/rooms/{room_id}/remote_events", json={"events": [create, join, levels, topic, message]}
    )
    assert r.status_code == 200 and len(r.json()["stored"]) == 5, r.text
