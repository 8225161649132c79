"""``/sync`` for rooms: what the soak against an oracle found (test_sync_soak.py), one test each.

Each one is a sequence of the user's own membership changes that falls inside one incremental sync
range (a client that was away, or a worker that restarted, gets them together).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import httpx

from factstream import SyncRequest
from factstream.host.app import Host
from tests.bundled.events.conftest import store_of
from tests.bundled.events.test_sync_rooms import ALICE, BOB, bodies, sync, text, timeline

Clients = Callable[[str], httpx.AsyncClient]


def memberships(events: list[dict[str, object]], user: str) -> list[object]:
    return [e["content"]["membership"] for e in events if e["type"] == "m.room.member" and e["state_key"] == user]  # type: ignore[index]


async def kicked_then(main: Host, client: Clients, membership: str) -> tuple[str, dict[str, Any]]:
    """Bob, joined, is kicked after a message, then after another one alice sets his ``membership``;
    all of it in one sync range: the room and that sync's answer."""
    store = store_of(main)
    room = await store.create_room(ALICE, preset="public_chat")
    await store.change_membership(room, BOB, BOB, "join")
    async with client(BOB) as bob:
        since = (await sync(bob))["next_batch"]
        await store.send(room, ALICE, "m.room.message", text("before the kick"))
        await store.change_membership(room, ALICE, BOB, "leave")
        await store.send(room, ALICE, "m.room.message", text("after the kick"))
        await store.change_membership(room, ALICE, BOB, membership)
        return room, await sync(bob, since)


async def test_kicked_then_invited_again_shows_the_room_under_leave_and_under_invite(
    main: Host, client: Clients
) -> None:
    room, body = await kicked_then(main, client, "invite")
    left = timeline(body, room, "leave")
    assert bodies(left) == ["before the kick"]
    assert memberships(left, BOB) == ["leave"]
    invite = body["rooms"]["invite"][room]["invite_state"]["events"]
    assert invite[-1]["state_key"] == BOB and invite[-1]["content"]["membership"] == "invite"
    assert room not in body["rooms"].get("join", {})


async def test_kicked_then_banned_keeps_the_timeline_up_to_the_kick_and_shows_the_ban(
    main: Host, client: Clients
) -> None:
    room, body = await kicked_then(main, client, "ban")
    left = timeline(body, room, "leave")
    assert bodies(left) == ["before the kick"], "nothing from after the user's presence ended"
    assert memberships(left, BOB) == ["leave", "ban"]


async def test_an_invite_rejected_then_renewed_shows_the_rejection_and_the_new_invite(
    main: Host, client: Clients
) -> None:
    store = store_of(main)
    room = await store.create_room(ALICE, preset="private_chat")
    async with client(BOB) as bob:
        since = (await sync(bob))["next_batch"]
        await store.change_membership(room, ALICE, BOB, "invite")
        await store.change_membership(room, BOB, BOB, "leave")
        await store.change_membership(room, ALICE, BOB, "invite")
        body = await sync(bob, since)
    assert memberships(timeline(body, room, "leave"), BOB) == ["leave"]
    assert room in body["rooms"]["invite"]


async def _stream_of(main: Host, event_id: str) -> int:
    async with main.api.database().autocommit() as conn:
        cur = await conn.execute("SELECT stream_ordering FROM events WHERE event_id = %s", (event_id,))
        row = await cur.fetchone()
    assert row is not None
    return int(row[0])


async def test_a_range_that_ends_before_a_later_kick_still_reads_the_room_as_joined(main: Host) -> None:
    """The notifier's token can lag the rows a process holds: a range ending before the user's kick
    must show the room's events of the range although the process already knows of the kick."""
    store = store_of(main)
    room = await store.create_room(ALICE, preset="public_chat")
    joined = await _stream_of(main, await store.change_membership(room, BOB, BOB, "join"))
    message = await _stream_of(main, await store.send(room, ALICE, "m.room.message", text("while bob is in")))
    await store.change_membership(room, ALICE, BOB, "leave")
    request = SyncRequest(main.api, "events", BOB, None, {"main": joined}, {"main": message})
    body = await store.sync(request)
    events = body["join"][room]["timeline"]["events"]
    assert [json.loads(bytes(e))["content"].get("body") for e in events] == ["while bob is in"]
