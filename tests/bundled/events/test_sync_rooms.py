"""``/sync`` for rooms (issue 32): the ``rooms`` section of the core's long poll, over HTTP.

Each test drives a real host through its HTTP API (PostgreSQL underneath) and reads ``/sync`` as a
Matrix client would: an initial sync, then incremental ones with ``next_batch``.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable
from typing import Any

import httpx
import pytest

from factstream.host.app import Host
from tests.bundled.events.conftest import caught_up, main_and_worker, store_of, token_of

ALICE, BOB, CAROL, DAVE = "@alice:hs", "@bob:hs", "@carol:hs", "@dave:hs"
Clients = Callable[[str], httpx.AsyncClient]


def text(body: str) -> dict[str, str]:
    return {"msgtype": "m.text", "body": body}


async def sync(client: httpx.AsyncClient, since: str | None = None, **params: Any) -> dict[str, Any]:
    query: dict[str, Any] = {"timeout": params.pop("timeout", 0)}
    if since is not None:
        query["since"] = since
    if "filter" in params:
        query["filter"] = json.dumps(params.pop("filter"))
    response = await client.get("/sync", params=query)
    assert response.status_code == 200, response.text
    return dict(response.json())


async def long_polls(
    woken: httpx.AsyncClient, bystander: httpx.AsyncClient
) -> tuple[asyncio.Task[dict[str, Any]], asyncio.Task[dict[str, Any]]]:
    """Both clients long-poll from an initial sync: the first for up to 10 s, the second for 1.5 s."""
    since_woken = (await sync(woken))["next_batch"]
    since_bystander = (await sync(bystander))["next_batch"]
    first = asyncio.create_task(sync(woken, since_woken, timeout=10_000))
    second = asyncio.create_task(sync(bystander, since_bystander, timeout=1_500))
    await asyncio.sleep(0.3)
    assert not first.done(), "nothing happened yet: the long poll must still wait"
    return first, second


def timeline(body: dict[str, Any], room_id: str, section: str = "join") -> list[dict[str, Any]]:
    return list(body["rooms"][section][room_id]["timeline"]["events"])


def bodies(events: list[dict[str, Any]]) -> list[str]:
    return [e["content"]["body"] for e in events if e["type"] == "m.room.message" and "body" in e["content"]]


async def test_initial_sync_shows_joined_rooms_with_state_and_the_newest_events(main: Host, client: Clients) -> None:
    store = store_of(main)
    room = await store.create_room(ALICE, preset="public_chat", name="Lobby")
    for i in range(15):
        await store.send(room, ALICE, "m.room.message", text(f"m{i}"))
    async with client(ALICE) as alice:
        body = await sync(alice)
    joined = body["rooms"]["join"][room]
    assert bodies(joined["timeline"]["events"]) == [f"m{i}" for i in range(5, 15)]
    assert joined["timeline"]["limited"] is True
    assert joined["timeline"]["prev_batch"].startswith("t")
    state_types = {e["type"] for e in joined["state"]["events"]}
    assert {"m.room.create", "m.room.name", "m.room.member", "m.room.power_levels"} <= state_types
    async with client(ALICE) as alice:
        page = await alice.get(
            f"/rooms/{room}/messages", params={"from": joined["timeline"]["prev_batch"], "dir": "b", "limit": 5}
        )
    assert page.status_code == 200, page.text
    assert bodies(page.json()["chunk"]) == [f"m{i}" for i in range(4, -1, -1)]


async def test_incremental_sync_brings_new_events_and_membership_changes(main: Host, client: Clients) -> None:
    store = store_of(main)
    room = await store.create_room(ALICE, preset="public_chat")
    async with client(BOB) as bob:
        first = await sync(bob)
        assert room not in first.get("rooms", {}).get("join", {})
        await store.change_membership(room, ALICE, BOB, "invite")
        invited = await sync(bob, first["next_batch"])
        invite_state = invited["rooms"]["invite"][room]["invite_state"]["events"]
        assert invite_state[-1]["type"] == "m.room.member" and invite_state[-1]["state_key"] == BOB
        assert any(e["type"] == "m.room.create" for e in invite_state)
        await store.change_membership(room, BOB, BOB, "join")
        await store.send(room, ALICE, "m.room.message", text("hello bob"))
        joined = await sync(bob, invited["next_batch"])
        events = timeline(joined, room)
        assert [e["type"] for e in events][-2:] == ["m.room.member", "m.room.message"]
        assert joined["rooms"]["join"][room]["state"]["events"], "a room joined in the range comes with its state"
        await store.change_membership(room, ALICE, BOB, "leave", reason="bye")
        await store.send(room, ALICE, "m.room.message", text("after the kick"))
        kicked = await sync(bob, joined["next_batch"])
        left = timeline(kicked, room, "leave")
        assert left[-1]["type"] == "m.room.member" and left[-1]["content"]["membership"] == "leave"
        assert "after the kick" not in bodies(left)
        assert room not in kicked["rooms"].get("join", {})


async def test_a_long_poll_wakes_for_a_new_event_in_a_joined_room_and_nobody_else_wakes(
    main: Host, client: Clients
) -> None:
    store = store_of(main)
    room = await store.create_room(ALICE, preset="public_chat")
    other = await store.create_room(CAROL, preset="public_chat")
    await store.change_membership(room, BOB, BOB, "join")
    async with client(BOB) as bob, client(CAROL) as carol:
        waiting_bob, waiting_carol = await long_polls(bob, carol)
        await store.send(room, ALICE, "m.room.message", text("wake up"))
        woken = await asyncio.wait_for(waiting_bob, 5)
        assert bodies(timeline(woken, room)) == ["wake up"]
        carol_body = await waiting_carol
        assert carol_body.get("rooms", {}) == {}, "an event in a room carol is not in must not wake her"
    assert other


async def test_a_late_joiner_under_joined_visibility_sees_nothing_from_before_the_join(
    main: Host, client: Clients
) -> None:
    store = store_of(main)
    room = await store.create_room(ALICE, preset="public_chat", history_visibility="joined")
    for i in range(3):
        await store.send(room, ALICE, "m.room.message", text(f"secret {i}"))
    await store.change_membership(room, BOB, BOB, "join")
    await store.send(room, ALICE, "m.room.message", text("welcome"))
    async with client(BOB) as bob:
        body = await sync(bob)
    assert bodies(timeline(body, room)) == ["welcome"]


async def test_the_filter_limits_types_and_lazy_loads_members(main: Host, client: Clients) -> None:
    store = store_of(main)
    room = await store.create_room(ALICE, preset="public_chat")
    for user in (BOB, CAROL, DAVE):
        await store.change_membership(room, user, user, "join")
    await store.send(room, BOB, "m.room.message", text("from bob"))
    await store.send(room, ALICE, "m.custom", {"x": 1})
    room_filter = {
        "room": {
            "timeline": {"limit": 1, "types": ["m.room.message"]},
            "state": {"lazy_load_members": True},
        }
    }
    async with client(ALICE) as alice:
        body = await sync(alice, filter=room_filter)
    joined = body["rooms"]["join"][room]
    assert bodies(joined["timeline"]["events"]) in ([], ["from bob"])
    members = {e["state_key"] for e in joined["state"]["events"] if e["type"] == "m.room.member"}
    assert CAROL not in members and DAVE not in members


@pytest.mark.parametrize(
    "bad",
    [
        "[1]",
        "{not json",
        json.dumps({"room": {"timeline": {"limit": 0}}}),
        json.dumps({"room": {"timeline": {"types": "m.room.message"}}}),
        json.dumps({"room": {"include_leave": "yes"}}),
    ],
)
async def test_a_malformed_filter_is_a_400_naming_the_field(main: Host, client: Clients, bad: str) -> None:
    async with client(ALICE) as alice:
        response = await alice.get("/sync", params={"filter": bad})
    assert response.status_code == 400, response.text
    assert "filter" in response.json()["error"]


async def test_a_redaction_of_a_delivered_event_arrives_as_the_redaction(main: Host, client: Clients) -> None:
    store = store_of(main)
    room = await store.create_room(ALICE, preset="public_chat")
    message = await store.send(room, ALICE, "m.room.message", text("oops"))
    async with client(ALICE) as alice:
        first = await sync(alice)
        await store.redact(room, ALICE, message)
        second = await sync(alice, first["next_batch"])
    events = timeline(second, room)
    assert [e["type"] for e in events] == ["m.room.redaction"]
    assert events[0]["redacts"] == message or events[0]["content"].get("redacts") == message


async def test_an_invite_wakes_the_invitee_who_is_in_no_room_and_nobody_else(main: Host, client: Clients) -> None:
    store = store_of(main)
    room = await store.create_room(ALICE, preset="private_chat")
    async with client(BOB) as bob, client(CAROL) as carol:
        waiting_bob, waiting_carol = await long_polls(bob, carol)
        await store.change_membership(room, ALICE, BOB, "invite")
        woken = await asyncio.wait_for(waiting_bob, 5)
        assert room in woken["rooms"]["invite"]
        assert (await waiting_carol).get("rooms", {}) == {}


@pytest.mark.parametrize("transport", ["tcp", "redis"])
async def test_a_long_poll_on_a_worker_wakes_for_an_event_written_on_main(host_cluster, transport: str) -> None:
    main, worker = await main_and_worker(host_cluster, transport)
    store = store_of(main)
    room = await store.create_room(ALICE, preset="public_chat")
    await store.change_membership(room, BOB, BOB, "join")
    await caught_up(main, worker)
    async with host_cluster.client(worker, token_of(BOB)) as bob:
        first = await sync(bob)
        assert room in first["rooms"]["join"]
        waiting = asyncio.create_task(sync(bob, first["next_batch"], timeout=10_000))
        await asyncio.sleep(0.3)
        assert not waiting.done()
        await store.send(room, ALICE, "m.room.message", text("across processes"))
        woken = await asyncio.wait_for(waiting, 5)
    assert bodies(timeline(woken, room)) == ["across processes"]


async def test_a_gap_in_the_stored_history_makes_the_timeline_limited(main: Host, client: Clients) -> None:
    from tests.bundled.events.remote_history import RemoteRoom, persist

    zed = "@zed:elsewhere"
    remote = RemoteRoom("!gap:elsewhere")
    remote.create(zed)
    remote.add("m.room.member", BOB, {"membership": "join"}, state_key=BOB)
    store = store_of(main)
    await persist(store, remote.room_id, remote.events)
    async with client(BOB) as bob:
        first = await sync(bob)
        assert remote.room_id in first["rooms"]["join"]
        held = len(remote.events)
        for i in range(3):
            remote.add("m.room.message", zed, {"msgtype": "m.text", "body": f"missed {i}"})
        after_gap = remote.add("m.room.message", zed, {"msgtype": "m.text", "body": "after the gap"})
        assert len(remote.events) == held + 4
        await persist(store, remote.room_id, [after_gap])  # its prev event is not held: a gap
        body = await sync(bob, first["next_batch"])
    room = body["rooms"]["join"][remote.room_id]
    assert bodies(room["timeline"]["events"]) == ["after the gap"]
    assert room["timeline"]["limited"] is True, "the timeline follows a gap: the client must page back"
    async with client(BOB) as bob:
        later = await sync(bob, body["next_batch"], timeout=0)
    assert later.get("rooms", {}) == {}


async def test_an_incremental_prev_batch_pages_back_with_messages(main: Host, client: Clients) -> None:
    store = store_of(main)
    room = await store.create_room(ALICE, preset="public_chat")
    async with client(ALICE) as alice:
        first = await sync(alice)
        for i in range(5):
            await store.send(room, ALICE, "m.room.message", text(f"n{i}"))
        body = await sync(alice, first["next_batch"], filter={"room": {"timeline": {"limit": 2}}})
        joined = body["rooms"]["join"][room]["timeline"]
        assert bodies(joined["events"]) == ["n3", "n4"] and joined["limited"] is True
        page = await alice.get(f"/rooms/{room}/messages", params={"from": joined["prev_batch"], "dir": "b", "limit": 3})
    assert page.status_code == 200, page.text
    assert bodies(page.json()["chunk"]) == ["n2", "n1", "n0"]


async def test_a_range_read_after_a_later_leave_still_shows_the_room_as_it_was_at_the_ranges_end(main: Host) -> None:
    """A sync range ends at ``upto``; a leave written after it (while the request runs) must not hide
    the events of the range, nor a join written after it show the room early."""
    from factstream import SyncRequest

    store = store_of(main)
    room = await store.create_room(ALICE, preset="public_chat")
    await store.change_membership(room, BOB, BOB, "join")
    since = main.id_generator("events").get_current_token()
    await store.send(room, ALICE, "m.room.message", text("in range"))
    upto = main.id_generator("events").get_current_token()
    await store.change_membership(room, BOB, BOB, "leave")
    later = await store.create_room(ALICE, preset="public_chat")
    await store.send(later, ALICE, "m.room.message", text("before bob came"))
    await store.change_membership(later, BOB, BOB, "join")

    def request(low: int, high: int) -> SyncRequest:
        return SyncRequest(main.api, "events", BOB, None, {"main": low}, {"main": high})

    answer = await store.sync(request(since, upto))
    assert list(answer.get("join", {})) == [room]
    shown = [json.loads(bytes(e))["content"].get("body") for e in answer["join"][room]["timeline"]["events"]]
    assert shown == ["in range"]
    rest = await store.sync(request(upto, main.id_generator("events").get_current_token()))
    assert list(rest.get("leave", {})) == [room] and list(rest.get("join", {})) == [later]
