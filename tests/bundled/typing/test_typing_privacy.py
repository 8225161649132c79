"""Privacy is correctness (docs/plugins/typing.md, Privacy): a room's typing list is shown only to the
room's currently joined members, in ``/sync`` (initial and incremental), and it names exactly the users
typing.

The rule is one small model, :func:`expected`. hypothesis varies who types where and who asks, on one
real host per test: its rooms are built once, a Latin square of memberships so that each of the five
users is joined to one room, invited to one, gone from one, never in one and banned from one (and
frank is in none); each example sets who types through the writer (``TypingWriter.set_typing``, so a
user who is not joined may type too: the list still names exactly them) and asks ``/sync`` over HTTP.
Then a user who leaves stops seeing the room's typing at once, one who joins starts, and a stranger's
long poll is not woken.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Mapping

import pytest
from factstream_events import Memberships
from factstream_typing import TypingView, TypingWriter
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from factstream.host.app import Host
from tests.bundled.events.conftest import store_of
from tests.bundled.typing.conftest import ALICE, BOB, CAROL, DAVE, EVE, FRANK, Clients, put_typing, sync, typing_of

SQUARE = (ALICE, BOB, CAROL, DAVE, EVE)
USERS = (*SQUARE, FRANK)
MEMBERSHIPS = ("join", "invite", "leave", "never", "ban")


def membership(user: str, room_index: int) -> str:
    """The Latin square: ``user``'s membership of the ``room_index`` th room (frank: never in one)."""
    if user not in SQUARE:
        return "never"
    return MEMBERSHIPS[(SQUARE.index(user) + room_index) % len(MEMBERSHIPS)]


def expected(asker: str, rooms: list[str], typing: Mapping[str, set[str]], shown: set[str]) -> dict[str, list[str]]:
    """The model: the rooms of ``shown`` that ``asker`` is joined to, each with exactly its typing users."""
    return {
        room: sorted(typing[room]) for i, room in enumerate(rooms) if room in shown and membership(asker, i) == "join"
    }


@pytest.fixture
async def rooms(main: Host) -> list[str]:
    """Five rooms, memberships as :func:`membership` says (each created by the user joined to it)."""
    store = store_of(main)
    out = []
    for i in range(len(MEMBERSHIPS)):
        (creator,) = (u for u in SQUARE if membership(u, i) == "join")
        room = await store.create_room(creator, preset="public_chat")
        for user in SQUARE:
            kind = membership(user, i)
            if kind in ("leave", "ban"):
                await store.change_membership(room, user, user, "join")
            if kind in ("invite", "ban"):
                await store.change_membership(room, creator, user, kind)
            elif kind == "leave":
                await store.change_membership(room, user, user, "leave")
        out.append(room)
    members = main.api.state(Memberships)
    for user in USERS:  # the square is what the events plugin holds
        assert await members.joined_rooms(user) == {room for i, room in enumerate(out) if membership(user, i) == "join"}
    return out


who_types = st.sets(st.tuples(st.integers(0, len(MEMBERSHIPS) - 1), st.sampled_from(USERS)), max_size=10)
who_asks = st.lists(st.sampled_from(USERS), min_size=1, max_size=len(USERS), unique=True)


@settings(
    max_examples=50,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(typers=who_types, askers=who_asks)
async def test_sync_shows_each_room_s_typing_to_its_joined_members_only(
    main: Host, client: Clients, rooms: list[str], typers: set[tuple[int, str]], askers: list[str]
) -> None:
    view, writer = main.api.state(TypingView), main.api.state(TypingWriter)
    before = {room: set(view.rooms[room].users) if room in view.rooms else set() for room in rooms}
    since = {asker: (await sync(client(asker)))["next_batch"] for asker in askers}
    after = {room: {user for i, user in typers if rooms[i] == room} for room in rooms}
    for room in rooms:
        for user in sorted(before[room] - after[room]):
            writer.set_typing(room, user, False)
        for user in sorted(after[room] - before[room]):
            writer.set_typing(room, user, True, 60_000)
    typing_now = {room for room in rooms if after[room]}
    changed = {room for room in rooms if after[room] != before[room]}
    for asker in askers:
        http = client(asker)
        assert typing_of(await sync(http)) == expected(asker, rooms, after, typing_now), f"initial /sync of {asker}"
        incremental = typing_of(await sync(http, since[asker]))
        assert incremental == expected(asker, rooms, after, changed), f"incremental /sync of {asker}"


async def test_leaving_hides_the_room_s_typing_and_joining_shows_it(main: Host, client: Clients) -> None:
    store = store_of(main)
    room = await store.create_room(ALICE, preset="public_chat")
    await store.change_membership(room, BOB, BOB, "join")
    alice, bob, carol = client(ALICE), client(BOB), client(CAROL)
    since = {user: (await sync(http))["next_batch"] for user, http in ((BOB, bob), (CAROL, carol))}
    assert (await put_typing(alice, room, ALICE, {"typing": True, "timeout": 60_000})).status_code == 200
    assert typing_of(await sync(bob, since[BOB])) == {room: [ALICE]}
    assert typing_of(await sync(carol, since[CAROL])) == {}
    await store.change_membership(room, BOB, BOB, "leave")
    await store.change_membership(room, CAROL, CAROL, "join")
    for answer in (await sync(bob), await sync(bob, since[BOB])):
        assert typing_of(answer) == {}, "bob left the room: its typing is not his to see"
    assert typing_of(await sync(carol)) == {room: [ALICE]}
    assert typing_of(await sync(carol, since[CAROL])) == {room: [ALICE]}
    response = await put_typing(bob, room, BOB)
    assert response.status_code == 403 and response.json()["errcode"] == "M_FORBIDDEN"
    assert (await bob.get(f"/rooms/{room}/typing")).status_code == 403


async def test_a_stranger_s_long_poll_is_not_woken_by_a_room_s_typing(main: Host, client: Clients) -> None:
    room = await store_of(main).create_room(ALICE, preset="public_chat")
    frank = client(FRANK)
    frank.timeout = 30
    since = (await sync(frank))["next_batch"]
    started = time.monotonic()
    poll = asyncio.create_task(sync(frank, since, timeout=1_500))
    await asyncio.sleep(0.3)
    assert (await put_typing(client(ALICE), room, ALICE)).status_code == 200
    body = await poll
    assert typing_of(body) == {}
    assert time.monotonic() - started >= 1.4, "a stranger's long poll answered before its timeout"
