"""Loading state groups several at a time (``StateStore.load_groups``): the groups of several rooms in
one query, each equal to a replay of its room's events, whatever the cache holds, including a cache too
small to keep what one load needs and loads that run at the same time and evict each other's groups."""

from __future__ import annotations

import asyncio
import random
from typing import Any

import pytest
from factstream_events.shared.statestore import StateGroupError, StateStore

from tests.bundled.events.conftest import store_of
from tests.bundled.events.remote_history import RemoteRoom, persist

ROOMS = 3
#: Changes per room: 70 joins (past the first levels of base links: positions 16 and 64), then
#: topic changes and leaves.
JOINS = 70


def build(n: int) -> RemoteRoom:
    rng = random.Random(n)
    room = RemoteRoom(f"!loads-{n}:elsewhere")
    room.create("@zed:elsewhere")
    users = [f"@u{i}-{n}:elsewhere" for i in range(JOINS)]
    for user in users:
        room.add("m.room.member", user, {"membership": "join"}, state_key=user)
        if rng.random() < 0.2:
            room.add("m.room.topic", "@zed:elsewhere", {"topic": f"{user} is here"}, state_key="")
    for user in rng.sample(users, JOINS // 3):
        room.add("m.room.member", user, {"membership": "leave"}, state_key=user)
    return room


def nested(state: dict[tuple[str, str], str]) -> dict[str, dict[str, str]]:
    out: dict[str, dict[str, str]] = {}
    for (event_type, state_key), event_id in state.items():
        out.setdefault(event_type, {})[state_key] = event_id
    return out


@pytest.fixture
async def rooms(main: Any) -> list[tuple[str, dict[int, dict[str, dict[str, str]]]]]:
    """The rooms, persisted: each room's ID and the state of each of its groups by a replay."""
    out = []
    db = main.api.database()
    for n in range(ROOMS):
        room = build(n)
        await persist(store_of(main), room.room_id, room.events)
        groups = dict(
            await db.fetchall("SELECT event_id, state_group FROM events WHERE room_id = %(r)s", {"r": room.room_id})
        )
        expected: dict[int, dict[str, dict[str, str]]] = {}
        state: dict[tuple[str, str], str] = {}
        for built in room.events:
            if built.state_key is not None:
                state[(built.type, built.state_key)] = built.event_id
            expected[int(groups[built.event_id])] = nested(state)
        out.append((room.room_id, expected))
    return out


@pytest.mark.parametrize("max_entries", [1, 150, 1_000_000])
async def test_groups_of_several_rooms_load_together_as_their_replays(main, rooms, max_entries) -> None:
    """Random sets of groups from every room, loaded by one store with a cache of ``max_entries``
    (1: nothing stays; 150: groups come and go), each equal to its replay."""
    states = StateStore(max_entries)
    rng = random.Random(max_entries)
    async with main.api.database().autocommit() as conn:
        for _ in range(40):
            wanted = {room_id: rng.sample(sorted(expected), rng.randint(1, 12)) for room_id, expected in rooms}
            walks = states.loads
            got = await states.load_groups(conn, wanted)
            for room_id, expected in rooms:
                for gid in wanted[room_id]:
                    assert got[gid].state == expected[gid], (room_id, gid)
                    assert got[gid].room_id == room_id
            assert states.loads - walks <= sum(len(set(ids)) for ids in wanted.values())
        # every group of every room, from whatever the cache holds now
        everything = {room_id: list(expected) for room_id, expected in rooms}
        got = await states.load_groups(conn, everything)
        assert {gid: got[gid].state for _, expected in rooms for gid in expected} == {
            gid: state for _, expected in rooms for gid, state in expected.items()
        }


async def test_loads_at_the_same_time_evicting_each_others_groups_stay_right(main, rooms) -> None:
    """Eight tasks loading at once through one store whose cache holds about one state: a group a walk
    stopped at is often evicted before its replay; every answer still equals the replay."""
    states = StateStore(60)
    db = main.api.database()

    async def worker(seed: int) -> int:
        rng = random.Random(seed)
        checked = 0
        async with db.autocommit() as conn:
            for _ in range(25):
                room_id, expected = rng.choice(rooms)
                wanted = rng.sample(sorted(expected), rng.randint(1, 4))
                got = await states.load_groups(conn, {room_id: wanted})
                for gid in wanted:
                    assert got[gid].state == expected[gid], (room_id, gid)
                    checked += 1
        return checked

    assert sum(await asyncio.gather(*(worker(seed) for seed in range(8)))) >= 8 * 25


async def test_a_group_that_does_not_exist_is_a_state_group_error(main, rooms) -> None:
    states = StateStore()
    room_id, expected = rooms[0]
    async with main.api.database().autocommit() as conn:
        with pytest.raises(StateGroupError, match="state group 987654321 "):
            await states.load_groups(conn, {room_id: [next(iter(expected)), 987_654_321]})


async def test_a_group_of_another_room_is_a_state_group_error_cold_or_cached(main, rooms) -> None:
    """No read takes another room's state: a group asked for as another room's is refused, whether it is
    read from the database or already cached."""
    (mine, groups), (other, _) = rooms[0], rooms[1]
    gid = next(iter(groups))
    async with main.api.database().autocommit() as conn:
        for states in (StateStore(), store_of(main).states):  # cold, then the writer's warm cache
            with pytest.raises(StateGroupError, match=f"state group {gid} is of room {mine}, not {other}"):
                await states.load_groups(conn, {other: [gid]})
            with pytest.raises(StateGroupError, match=f"is of room {mine}"):
                await states.load(conn, other, gid)
            assert (await states.load(conn, mine, gid)).state == groups[gid]


@pytest.mark.parametrize("max_entries", [1, 150, 1_000_000])
async def test_one_key_of_a_group_is_the_replays_whatever_the_cache_holds(main, rooms, max_entries) -> None:
    """``StateStore.entries``: random keys (present, absent, of several rooms) of random groups, each the
    event the replay has there (None where it has none), read without replaying the groups."""
    states = StateStore(max_entries)
    rng = random.Random(max_entries)
    keys = sorted({(t, k) for _, expected in rooms for state in expected.values() for t, i in state.items() for k in i})
    keys += [("m.room.member", "@nobody:elsewhere"), ("m.room.name", "")]
    async with main.api.database().autocommit() as conn:
        for _ in range(30):
            if rng.random() < 0.3:  # now and then, some groups held, so that walks stop at them
                room_id, expected = rng.choice(rooms)
                await states.load_groups(conn, {room_id: rng.sample(sorted(expected), 3)})
            asks = [
                (room_id, gid, *rng.choice(keys))
                for room_id, expected in rooms
                for gid in rng.sample(sorted(expected), rng.randint(1, 20))
            ]
            got = await states.entries(conn, asks)
            for (room_id, gid, event_type, state_key), event_id in zip(asks, got, strict=True):
                want = dict(rooms)[room_id][gid].get(event_type, {}).get(state_key)
                assert event_id == want, (room_id, gid, event_type, state_key)
