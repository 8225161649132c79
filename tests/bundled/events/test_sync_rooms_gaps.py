"""``/sync`` marks a room ``limited`` when its timeline holds an event that follows a gap in the stored
history (a prev event the room does not hold: a backward extremity), and only then."""

from __future__ import annotations

import json
from typing import Any

from factstream_events.rules.eventid import content_hash, event_id_for
from factstream_events.store import RemoteEvent

from factstream.host.app import Host
from tests.bundled.events.conftest import store_of
from tests.bundled.events.test_sync_rooms import ALICE, Clients, sync

ZED = "@zed:elsewhere"


def make(room: str, event_type: str, content: dict[str, Any], prev: list[str], depth: int, **kw: Any) -> tuple:
    event = {
        "room_id": room,
        "type": event_type,
        "sender": kw.pop("sender", ZED),
        "content": content,
        "prev_events": prev,
        "depth": depth,
        "origin_server_ts": 1_000 + depth,
        "auth_events": [],
        **kw,
    }
    event["hashes"] = {"sha256": content_hash(event)}
    return event, event_id_for(event, "10")


async def remote_room(main: Host, room: str) -> str:
    """A remote room that ALICE joined, with one message; returns the message's ID."""
    create, c = make(room, "m.room.create", {"room_version": "10", "creator": ZED}, [], 1, state_key="")
    zed, z = make(room, "m.room.member", {"membership": "join"}, [c], 2, state_key=ZED)
    rules, r = make(room, "m.room.join_rules", {"join_rule": "public"}, [z], 3, state_key="")
    alice, a = make(room, "m.room.member", {"membership": "join"}, [r], 4, state_key=ALICE, sender=ALICE)
    message, m = make(room, "m.room.message", {"body": "before"}, [a], 5)
    raws = [RemoteEvent(json.dumps(e).encode()) for e in (create, zed, rules, alice, message)]
    await store_of(main).persist_remote(room, raws, room_version="10")
    return m


async def test_a_timeline_after_a_gap_is_limited_and_one_without_is_not(main: Host, client: Clients) -> None:
    gapped, whole = "!gapped:elsewhere", "!whole:elsewhere"
    last = {room: await remote_room(main, room) for room in (gapped, whole)}
    room_filter = {"room": {"timeline": {"limit": 50}}}
    async with client(ALICE) as alice:
        first = await sync(alice, filter=room_filter)
        assert first["rooms"]["join"][gapped]["timeline"]["limited"] is False
        # the gapped room gets an event whose prev event this server never received
        unknown = make(gapped, "m.room.message", {"body": "missed"}, [last[gapped]], 6)[1]
        after_gap, _ = make(gapped, "m.room.message", {"body": "after the gap"}, [unknown], 7)
        next_in_whole, _ = make(whole, "m.room.message", {"body": "next"}, [last[whole]], 6)
        store = store_of(main)
        await store.persist_remote(gapped, [RemoteEvent(json.dumps(after_gap).encode())])
        await store.persist_remote(whole, [RemoteEvent(json.dumps(next_in_whole).encode())])
        incremental = await sync(alice, first["next_batch"], filter=room_filter)
        initial = await sync(alice, filter=room_filter)
    for body in (incremental, initial):
        joined = body["rooms"]["join"]
        assert joined[gapped]["timeline"]["events"][-1]["content"]["body"] == "after the gap"
        assert joined[gapped]["timeline"]["limited"] is True, "an event after a gap makes the timeline limited"
        assert joined[whole]["timeline"]["events"][-1]["content"]["body"] == "next"
        assert joined[whole]["timeline"]["limited"] is False
