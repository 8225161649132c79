"""The reader side of the events stream (``factstream_events.invalidations``): what each row kind makes
stale, on the worker that follows the stream and on main, whose own rows they are.

For every row kind a cache entry filled on both hosts before the write is gone once the worker has
reached the write's position, and an unrelated room's (user's) entry stays; the change caches advance
on both. Real hosts (main writes, worker1 follows) over TCP and over Redis.
"""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from factstream_events.invalidations import (
    CURRENT_STATE_IDS,
    EVENT_FACTS,
    ROOM_LATEST,
    ROOM_MEMBERS,
    RoomState,
)
from factstream_events.read.timeline import ROOMS_FOR_USER
from factstream_events.shared.rows import STATE_ALL
from factstream_events.store import RemoteEvent
from factstream_events.updates import events_updates
from factstream_events.write.create import Draft, LocalWrite
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from factstream.host.app import Host
from tests.bundled.events.conftest import caught_up, main_and_worker, store_of
from tests.bundled.events.remote_history import ROOM_VERSION, RemoteRoom

pytestmark = pytest.mark.parametrize("transport", ["tcp", "redis"])

ALICE, BOB, CAROL = "@alice:hs", "@bob:hs", "@carol:hs"
ZED = "@zed:elsewhere"
MISSING = object()


def rooms_of(host: Host) -> RoomState:
    return host.api.state(RoomState)


def cached(host: Host, cache: str, *key: str) -> Any:
    """The value cached under ``key`` (MISSING: none), without loading it."""
    return host.api.caches.get(cache).get(tuple(key), MISSING)


async def two_rooms(main: Host) -> tuple[str, str]:
    store = store_of(main)
    return (
        await store.create_room(ALICE, preset="public_chat"),
        await store.create_room(ALICE, preset="public_chat"),
    )


async def remote_room(main: Host, room_id: str) -> RemoteRoom:
    room = RemoteRoom(room_id)
    room.create(ZED)
    await store_of(main).persist_remote(room_id, [RemoteEvent(b.raw) for b in room.events], room_version=ROOM_VERSION)
    return room


async def test_an_ev_row_of_a_message_drops_the_events_and_the_rooms_entries(host_cluster, transport):
    main, worker = await main_and_worker(host_cluster, transport)
    room, other = await remote_room(main, "!a:elsewhere"), await remote_room(main, "!b:elsewhere")
    message = room.add("m.room.message", ZED, {"body": "hi"})
    await caught_up(main, worker)
    for host in (main, worker):
        assert await rooms_of(host).event_facts(message.event_id) is None  # not stored yet: None cached
        await rooms_of(host).latest_event(room.room_id)
        await rooms_of(host).latest_event(other.room_id)
    await store_of(main).persist_remote(room.room_id, [RemoteEvent(message.raw)])
    token = await caught_up(main, worker)
    for host in (main, worker):
        assert cached(host, EVENT_FACTS, message.event_id) is MISSING
        assert cached(host, ROOM_LATEST, room.room_id) is MISSING
        assert cached(host, ROOM_LATEST, other.room_id) is not MISSING
        assert (await rooms_of(host).latest_event(room.room_id)).event_id == message.event_id  # type: ignore[union-attr]
        assert store_of(host).timeline.rooms.last_change(room.room_id) == token
        assert store_of(host).timeline.rooms.last_change(other.room_id) < token  # type: ignore[operator]


async def test_an_ev_row_of_a_member_event_drops_the_targets_membership_caches(host_cluster, transport):
    main, worker = await main_and_worker(host_cluster, transport)
    room, other = await two_rooms(main)
    await caught_up(main, worker)
    for host in (main, worker):
        assert (await store_of(host).timeline.rooms_for_user(BOB)).rooms == ()
        await store_of(host).timeline.rooms_for_user(CAROL)
        assert await rooms_of(host).room_members(room) == (ALICE,)
        await rooms_of(host).room_members(other)
    await store_of(main).change_membership(room, BOB, BOB, "join")
    token = await caught_up(main, worker)
    for host in (main, worker):
        assert cached(host, ROOMS_FOR_USER, BOB) is MISSING
        assert cached(host, ROOMS_FOR_USER, CAROL).rooms == ()
        assert cached(host, ROOM_MEMBERS, room) is MISSING
        assert cached(host, ROOM_MEMBERS, other) == (ALICE,)
        assert [r.room_id for r in await store_of(host).timeline.rooms_for_user(BOB)] == [room]
        assert await rooms_of(host).room_members(room) == (ALICE, BOB)
        assert store_of(host).timeline.members.last_change(BOB) == token
        assert store_of(host).timeline.members.last_change(CAROL) is None


async def test_an_ev_row_of_a_redaction_drops_the_targets_caches(host_cluster, transport):
    main, worker = await main_and_worker(host_cluster, transport)
    store = store_of(main)
    room, _ = await two_rooms(main)
    target = await store.send(room, ALICE, "m.room.message", {"msgtype": "m.text", "body": "oops"})
    kept = await store.send(room, ALICE, "m.room.message", {"msgtype": "m.text", "body": "fine"})
    await caught_up(main, worker)
    for host in (main, worker):
        assert (await rooms_of(host).event_facts(target)).redacted_by is None  # type: ignore[union-attr]
        await rooms_of(host).event_facts(kept)
    redaction = await store.redact(room, ALICE, target)
    await caught_up(main, worker)
    for host in (main, worker):
        assert cached(host, EVENT_FACTS, target) is MISSING
        assert cached(host, EVENT_FACTS, kept) is not MISSING
        assert (await rooms_of(host).event_facts(target)).redacted_by == redaction  # type: ignore[union-attr]


async def test_a_state_row_drops_the_rooms_current_state_through_the_fan_out(host_cluster, transport):
    main, worker = await main_and_worker(host_cluster, transport)
    room, other = await two_rooms(main)
    await caught_up(main, worker)
    before = {host: await rooms_of(host).current_state_ids(room) for host in (main, worker)}
    for host in (main, worker):
        await rooms_of(host).current_state_ids(other)
    topic = await store_of(main).send(room, ALICE, "m.room.topic", {"topic": "t"}, state_key="")
    await caught_up(main, worker)
    for host in (main, worker):
        assert cached(host, CURRENT_STATE_IDS, room) is MISSING
        assert cached(host, CURRENT_STATE_IDS, other) is not MISSING
        assert await rooms_of(host).current_state_ids(room) == {**before[host], ("m.room.topic", ""): topic}


async def test_a_state_all_row_drops_the_rooms_state_and_every_users_memberships(host_cluster, transport):
    main, worker = await main_and_worker(host_cluster, transport)
    store = store_of(main)
    room, other = await two_rooms(main)
    await store.change_membership(other, BOB, BOB, "join")
    low = await caught_up(main, worker)
    for host in (main, worker):
        for r in (room, other):
            await rooms_of(host).current_state_ids(r)
            await rooms_of(host).room_members(r)
        for user in (BOB, CAROL):
            await store_of(host).timeline.rooms_for_user(user)
    drafts = [Draft("m.test", ALICE, {"n": i}, f"k{i}") for i in range(150)]
    await store._local(room, LocalWrite(tuple(drafts)))
    token = await caught_up(main, worker)
    rows, _, _ = await events_updates(main.api.database(), "main", low, token, 1000)
    assert [row.data for _, row in rows if row.kind == STATE_ALL] == [(room,)]
    for host in (main, worker):
        assert cached(host, CURRENT_STATE_IDS, room) is MISSING
        assert cached(host, ROOM_MEMBERS, room) is MISSING
        assert cached(host, CURRENT_STATE_IDS, other) is not MISSING
        assert cached(host, ROOM_MEMBERS, other) == (ALICE, BOB)
        assert cached(host, ROOMS_FOR_USER, BOB) is MISSING and cached(host, ROOMS_FOR_USER, CAROL) is MISSING
        members = store_of(host).timeline.members
        assert members.earliest >= min(t for t, row in rows if row.kind == STATE_ALL)
        assert members.has_changed_since(CAROL, low)  # unsure: any membership may have changed
        assert not members.has_changed_since(CAROL, token)
        assert await rooms_of(host).current_state_ids(room) == await database_state(main, room)


async def test_an_ex_outlier_ev_row_drops_the_events_caches_and_marks_its_room_changed(host_cluster, transport):
    main, worker = await main_and_worker(host_cluster, transport)
    store = store_of(main)
    room = await remote_room(main, "!x:elsewhere")
    message = room.add("m.room.message", ZED, {"body": "late"})
    await store.persist_remote(room.room_id, [RemoteEvent(message.raw, outlier=True)])
    await caught_up(main, worker)
    for host in (main, worker):
        assert (await rooms_of(host).event_facts(message.event_id)).outlier  # type: ignore[union-attr]
        assert (await rooms_of(host).latest_event(room.room_id)).event_id != message.event_id  # type: ignore[union-attr]
    await store.persist_remote(room.room_id, [RemoteEvent(message.raw)])
    token = await caught_up(main, worker)
    for host in (main, worker):
        assert cached(host, EVENT_FACTS, message.event_id) is MISSING
        assert cached(host, ROOM_LATEST, room.room_id) is MISSING
        assert not (await rooms_of(host).event_facts(message.event_id)).outlier  # type: ignore[union-attr]
        assert store_of(host).timeline.rooms.last_change(room.room_id) == token


# -- a property: cached current state equals the database's, whatever was written --------------------------

USERS = (BOB, CAROL, "@dave:hs")
op = st.one_of(
    st.tuples(st.just("topic"), st.integers(0, 1), st.text(max_size=5)),
    st.tuples(st.just("state"), st.integers(0, 1), st.sampled_from(["a", "b", "c"])),
    st.tuples(st.just("join"), st.integers(0, 1), st.sampled_from(USERS)),
    st.tuples(st.just("leave"), st.integers(0, 1), st.sampled_from(USERS)),
    st.tuples(st.just("read"), st.integers(0, 1), st.booleans()),
)


async def database_state(host: Host, room: str) -> dict[tuple[str, str], str]:
    rows = await host.api.database().fetchall(
        "SELECT type, state_key, event_id FROM current_state_events WHERE room_id = %(r)s", {"r": room}
    )
    return {(str(t), str(k)): str(e) for t, k, e in rows}


async def test_cached_current_state_on_the_worker_equals_the_databases_after_any_writes(host_cluster, transport):
    main, worker = await main_and_worker(host_cluster, transport)
    loop = asyncio.get_running_loop()
    store = store_of(main)
    rooms = await two_rooms(main)
    joined: set[tuple[str, str]] = set()
    checked: list[int] = []

    async def run(ops: list[tuple[str, int, Any]]) -> None:
        for kind, r, arg in ops:
            room = rooms[r]
            if kind == "topic":
                await store.send(room, ALICE, "m.room.topic", {"topic": arg}, state_key="")
            elif kind == "state":
                await store.send(room, ALICE, "m.test", {"v": len(checked)}, state_key=arg)
            elif kind == "join" and (room, arg) not in joined:
                await store.change_membership(room, arg, arg, "join")
                joined.add((room, arg))
            elif kind == "leave" and (room, arg) in joined:
                await store.change_membership(room, arg, arg, "leave")
                joined.discard((room, arg))
            elif kind == "read":  # fill the caches mid-stream, the worker possibly behind
                await rooms_of(worker).current_state_ids(room)
                await rooms_of(worker).room_members(room)
                if arg:
                    await rooms_of(main).current_state_ids(room)
        await caught_up(main, worker)
        for room in rooms:
            truth = await database_state(main, room)
            joined_now = tuple(sorted(u for (t, u), _ in truth.items() if t == "m.room.member" and (room, u) in joined))
            for host in (main, worker):
                value = cached(host, CURRENT_STATE_IDS, room)
                assert value is MISSING or value == truth
                members = cached(host, ROOM_MEMBERS, room)
                assert members is MISSING or members == tuple(sorted((ALICE, *joined_now)))
        checked.append(len(ops))

    @settings(max_examples=12, deadline=None, suppress_health_check=list(HealthCheck), derandomize=True)
    @given(st.lists(op, min_size=1, max_size=10))
    def writes(ops: list[tuple[str, int, Any]]) -> None:
        asyncio.run_coroutine_threadsafe(run(ops), loop).result(60)

    await asyncio.to_thread(writes)
    assert len(checked) >= 10


async def test_rooms_read_from_a_database_ahead_of_the_worker_are_those_of_the_range_end(host_cluster, transport):
    """The user's rooms come from the database, which may hold a membership change this process has not
    received yet (a worker just restarted, its caches cold, main already wrote a ban). A sync or an
    ``/events`` read up to the worker's position must still show the rooms the user was in there: the
    messages before the ban, which the soak found missing once (their timeline skipped for good)."""
    main, worker = await main_and_worker(host_cluster, transport)
    store = store_of(main)
    room = await store.create_room(ALICE, preset="public_chat")
    await store.change_membership(room, BOB, BOB, "join")
    await caught_up(main, worker)
    async with host_cluster.client(worker, "tok-bob-hs") as bob:
        since = (await bob.get("/sync", params={"timeout": 0})).json()["next_batch"]
        start = (await bob.get("/events")).json()["next"]
        sent = [await store.send(room, ALICE, "m.room.message", {"msgtype": "m.text", "body": i}) for i in "ab"]
        await caught_up(main, worker)
        await worker.disconnect_replication()
        await store.change_membership(room, ALICE, BOB, "ban")  # in the database, not on the worker
        worker.api.caches.get(ROOMS_FOR_USER).invalidate_all()  # cold, as after a restart
        body = (await bob.get("/sync", params={"since": since, "timeout": 0})).json()
        shown = [e["event_id"] for e in body["rooms"]["join"][room]["timeline"]["events"]]
        assert shown == sent, body
        worker.api.caches.get(ROOMS_FOR_USER).invalidate_all()
        events = (await bob.get("/events", params={"from": start})).json()
        assert [e["event_id"] for e in events["rooms"][room]["events"]] == sent, events
