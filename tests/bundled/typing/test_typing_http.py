"""``PUT /rooms/{room_id}/typing/{user_id}`` and ``GET /rooms/{room_id}/typing`` over HTTP on a real host
(docs/plugins/typing.md, Routes): every refusal a 4xx with the API's error shape and nothing changed,
timeouts (the default, the cap, expiry waking a member's long poll), typing again is no change, and the
``plugins.typing`` settings refused at start when they make no sense."""

from __future__ import annotations

import time

import pytest
from factstream_typing import TypingView, TypingWriter

from factstream.errors import ConfigError
from factstream.host.app import Host
from factstream.testing import HostCluster
from tests.bundled.events.conftest import store_of, token_of
from tests.bundled.typing.conftest import ALICE, BOB, CAROL, TYPING_TOKENS, Clients, put_typing, sync, typing_of


async def room_of_alice_and_bob(main: Host) -> str:
    store = store_of(main)
    room = await store.create_room(ALICE, preset="public_chat")
    await store.change_membership(room, BOB, BOB, "join")
    return room


def position(host: Host) -> int:
    return host.api.state(TypingWriter).stream.current_token()


def seconds_left(main: Host, room: str, user: str) -> float:
    writer = main.api.state(TypingWriter)
    return writer.deadlines[(room, user)] - writer.clock()


async def test_each_refusal_is_a_4xx_with_the_error_shape_and_changes_nothing(main: Host, client: Clients) -> None:
    room = await room_of_alice_and_bob(main)
    alice, bob, carol = client(ALICE), client(BOB), client(CAROL)
    before = position(main)
    cases = [
        (bob, room, ALICE, {"typing": True}, 403, "M_FORBIDDEN"),  # another user's typing
        (carol, room, CAROL, {"typing": True}, 403, "M_FORBIDDEN"),  # not joined
        (carol, "!unknown:hs", CAROL, {"typing": True}, 404, "M_NOT_FOUND"),  # no such room
        (bob, "!" + "r" * 300, BOB, {"typing": True}, 400, "M_INVALID_PARAM"),
        (bob, room, BOB, ["a list"], 400, "M_BAD_JSON"),
        (bob, room, BOB, {}, 400, "M_BAD_JSON"),  # no "typing"
        (bob, room, BOB, {"typing": "yes"}, 400, "M_BAD_JSON"),
        (bob, room, BOB, {"typing": True, "timeout": "long"}, 400, "M_BAD_JSON"),
        (bob, room, BOB, {"typing": True, "timeout": 1.5}, 400, "M_BAD_JSON"),
        (bob, room, BOB, {"typing": True, "timeout": -1}, 400, "M_INVALID_PARAM"),
        (bob, room, BOB, {"typing": True, "timeout": 10**30}, 400, "M_BAD_JSON"),  # beyond 64 bits
    ]
    for http, room_id, user, body, status, errcode in cases:
        response = await put_typing(http, room_id, user, body)
        assert response.status_code == status, (room_id, user, body, response.text)
        assert response.json()["errcode"] == errcode and response.json()["error"], response.text
    for content, status, errcode in [
        (b"{not json", 400, "M_NOT_JSON"),
        (b"", 400, "M_NOT_JSON"),
        (b'{"typing": true, "pad": "' + b"x" * 4096 + b'"}', 413, "M_TOO_LARGE"),  # over 4 KiB
    ]:
        response = await put_typing(bob, room, BOB, content=content)
        assert response.status_code == status, (content[:20], response.text)
        assert response.json()["errcode"] == errcode and response.json()["error"], response.text
    response = await carol.get(f"/rooms/{room}/typing")
    assert response.status_code == 403 and response.json()["errcode"] == "M_FORBIDDEN"
    assert position(main) == before and main.api.state(TypingWriter).deadlines == {}
    assert (await alice.get(f"/rooms/{room}/typing")).json() == {"user_ids": []}
    assert (await put_typing(bob, room, BOB)).status_code == 200
    assert (await alice.get(f"/rooms/{room}/typing")).json() == {"user_ids": [BOB]}


async def test_a_write_on_an_instance_that_does_not_write_typing_is_misdirected(host_cluster: HostCluster) -> None:
    host_cluster.configure(http={"tokens": TYPING_TOKENS})
    main = await host_cluster("main")
    worker = await host_cluster("worker1")
    room = await room_of_alice_and_bob(main)
    response = await put_typing(host_cluster.client(worker, token_of(BOB)), room, BOB)
    assert response.status_code == 421, response.text
    assert response.json()["errcode"] == "M_MISDIRECTED" and "send writes to: main" in response.json()["error"]
    assert main.api.state(TypingView).rooms == {} and worker.api.state(TypingView).rooms == {}


async def test_the_timeout_defaults_to_30_s_and_is_cut_to_120_s(main: Host, client: Clients) -> None:
    room = await room_of_alice_and_bob(main)
    alice, bob = client(ALICE), client(BOB)
    assert (await put_typing(alice, room, ALICE)).status_code == 200
    assert 29 < seconds_left(main, room, ALICE) <= 30
    assert (await put_typing(bob, room, BOB, {"typing": True, "timeout": 3_600_000})).status_code == 200
    assert 119 < seconds_left(main, room, BOB) <= 120
    assert (await put_typing(bob, room, BOB, {"typing": True, "timeout": 0})).status_code == 200
    assert seconds_left(main, room, BOB) <= 0  # stops at the next expiry
    assert (await put_typing(alice, room, ALICE, {"typing": False, "timeout": 5})).status_code == 200
    assert (room, ALICE) not in main.api.state(TypingWriter).deadlines


async def test_typing_again_is_no_change_and_stopping_twice_neither(main: Host, client: Clients) -> None:
    room = await room_of_alice_and_bob(main)
    alice, bob = client(ALICE), client(BOB)
    assert (await put_typing(alice, room, ALICE, {"typing": True, "timeout": 10_000})).status_code == 200
    first = position(main)
    since = (await sync(bob))["next_batch"]
    assert (await put_typing(alice, room, ALICE, {"typing": True, "timeout": 60_000})).status_code == 200
    assert position(main) == first  # no second row
    assert seconds_left(main, room, ALICE) > 59  # only the deadline moved on
    assert typing_of(await sync(bob, since)) == {}
    assert (await put_typing(alice, room, ALICE, {"typing": False})).status_code == 200
    assert position(main) == first + 1
    assert (await put_typing(alice, room, ALICE, {"typing": False})).status_code == 200
    assert position(main) == first + 1


async def test_a_timeout_that_expires_wakes_the_members_long_poll_with_nobody_typing(
    main: Host, client: Clients
) -> None:
    room = await room_of_alice_and_bob(main)
    alice, bob = client(ALICE), client(BOB)
    bob.timeout = 30
    assert (await put_typing(alice, room, ALICE, {"typing": True, "timeout": 200})).status_code == 200
    body = await sync(bob)
    assert typing_of(body) == {room: [ALICE]}
    started = time.monotonic()
    woken = await sync(bob, body["next_batch"], timeout=10_000)
    took = time.monotonic() - started
    assert typing_of(woken) == {room: []}
    assert took < 2.5, f"the long poll answered after {took:.2f} s"
    assert main.api.state(TypingWriter).deadlines == {}
    assert typing_of(await sync(bob)) == {}  # an initial sync shows rooms where someone types only


@pytest.mark.parametrize(
    ("section", "key"),
    [
        ({"default_timeout_ms": 200_000}, "default_timeout_ms must be at most max_timeout_ms"),
        ({"max_timeout_ms": 1_000}, "default_timeout_ms must be at most max_timeout_ms"),
        ({"max_timeout_ms": 0}, "plugins.typing.max_timeout_ms"),
        ({"default_timeout_ms": -5}, "plugins.typing.default_timeout_ms"),
        ({"timeout_ms": 5}, "plugins.typing.timeout_ms (env FACTSTREAM_PLUGINS__TYPING__TIMEOUT_MS): unknown key"),
    ],
)
async def test_settings_that_make_no_sense_stop_the_host_naming_the_key(
    host_cluster: HostCluster, section: dict[str, int], key: str
) -> None:
    with pytest.raises(ConfigError) as refused:
        await host_cluster("main", plugins={"typing": section})
    assert "plugins.typing" in str(refused.value) and key in str(refused.value)
