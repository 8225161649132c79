"""The events plugin's membership service for other plugins, ``host.state(Memberships)``
(factstream_events.read.members): current joins only, the same answers on a worker as on the writer,
and a worker's cached answers dropped by the replicated rows of a membership change."""

from __future__ import annotations

from factstream_events import Memberships

from factstream.host.app import Host
from factstream.testing import HostCluster
from tests.bundled.events.conftest import USERS, caught_up, main_and_worker, store_of

ALICE, BOB, CAROL, DAVE = USERS[:4]


def members_of(host: Host) -> Memberships:
    return host.api.state(Memberships)


async def test_joins_count_and_invites_leaves_and_bans_do_not(main: Host) -> None:
    store = store_of(main)
    room = await store.create_room(ALICE, preset="public_chat")
    other = await store.create_room(BOB, preset="public_chat")
    await store.change_membership(room, BOB, BOB, "join")
    await store.change_membership(room, ALICE, CAROL, "invite")
    await store.change_membership(room, DAVE, DAVE, "join")
    await store.change_membership(room, ALICE, DAVE, "ban")
    members = members_of(main)
    assert await members.joined_members(room) == frozenset({ALICE, BOB})
    assert await members.joined_rooms(BOB) == frozenset({room, other})
    assert await members.joined_rooms(CAROL) == frozenset()  # invited only
    assert await members.joined_rooms(DAVE) == frozenset()  # banned
    assert await members.is_joined(ALICE, room) and not await members.is_joined(ALICE, other)
    assert not await members.is_joined(CAROL, room)
    assert await members.users_sharing_a_room(ALICE) == frozenset({ALICE, BOB})
    assert await members.users_sharing_a_room(BOB) == frozenset({ALICE, BOB})
    assert await members.users_sharing_a_room(CAROL) == frozenset()
    assert await members.joined_members("!unknown:hs") == frozenset()


async def test_a_cached_answer_follows_a_join_and_a_leave_on_the_writer(main: Host) -> None:
    store = store_of(main)
    members = members_of(main)
    room = await store.create_room(ALICE, preset="public_chat")
    assert await members.joined_members(room) == frozenset({ALICE})  # cached now
    assert await members.joined_rooms(BOB) == frozenset()
    await store.change_membership(room, BOB, BOB, "join")
    assert await members.joined_members(room) == frozenset({ALICE, BOB})
    assert await members.is_joined(BOB, room)
    await store.change_membership(room, BOB, BOB, "leave")
    assert await members.joined_members(room) == frozenset({ALICE})
    assert not await members.is_joined(BOB, room)
    assert await members.users_sharing_a_room(ALICE) == frozenset({ALICE})


async def test_a_worker_sees_a_membership_change_once_its_rows_arrive(host_cluster: HostCluster) -> None:
    main, worker = await main_and_worker(host_cluster, "tcp")
    store = store_of(main)
    on_worker = members_of(worker)
    room = await store.create_room(ALICE, preset="public_chat")
    await caught_up(main, worker)
    # the worker caches the answers before the change
    assert await on_worker.joined_members(room) == frozenset({ALICE})
    assert await on_worker.joined_rooms(BOB) == frozenset()
    assert await on_worker.users_sharing_a_room(ALICE) == frozenset({ALICE})
    await store.change_membership(room, BOB, BOB, "join")
    await caught_up(main, worker)
    assert await on_worker.joined_members(room) == frozenset({ALICE, BOB})
    assert await on_worker.is_joined(BOB, room)
    assert await on_worker.users_sharing_a_room(ALICE) == frozenset({ALICE, BOB})
    await store.change_membership(room, ALICE, BOB, "ban")
    await caught_up(main, worker)
    assert await on_worker.joined_members(room) == frozenset({ALICE})
    assert await on_worker.joined_rooms(BOB) == frozenset()


async def test_the_service_is_one_object_per_host(main: Host) -> None:
    assert members_of(main) is members_of(main)
