"""``PUT`` / ``GET /presence/{user_id}/status`` and the writer's state machine, on a real host
(docs/plugins/presence.md): every refusal a 4xx with the API's error shape and nothing written; the
rule, driven with the writer's clock set by the test (``PresenceWriter.clock``): syncing comes online,
idle becomes unavailable, not syncing becomes offline, ``currently_active`` within the minute; a row
only when the state, the message or ``currently_active`` changes; a writer that starts again takes over
the users its last run left online."""

from __future__ import annotations

import asyncio

from factstream_presence import PresenceWriter
from factstream_presence.writer import ACTIVE_WINDOW_MS, now_ms

from factstream.host.app import Host
from factstream.testing import HostCluster
from tests.bundled.events.conftest import USERS
from tests.bundled.presence.conftest import Clients, get_status, put_status, shared_room, sync

ALICE, BOB, CAROL = USERS[:3]


class Clock:
    """The writer's clock, moved by the test (milliseconds)."""

    def __init__(self) -> None:
        self.now = now_ms()

    def __call__(self) -> int:
        return self.now


async def stored(main: Host) -> list[tuple[object, ...]]:
    sql = "SELECT user_id, state, status_msg, currently_active FROM presence_stream ORDER BY stream_id"
    return [tuple(r) for r in await main.database().fetchall(sql, {})]


def position(main: Host) -> int:
    return main.id_generator("presence").get_current_token()


async def test_each_refusal_is_a_4xx_with_the_error_shape_and_stores_nothing(
    host_cluster: HostCluster, main: Host, client: Clients
) -> None:
    await shared_room(main, ALICE, BOB)
    bob = client(BOB)
    worker = await host_cluster("worker1")
    on_worker = host_cluster.client(worker, "tok-bob-hs")
    cases = [
        (bob, ALICE, {"presence": "online"}, 403, "M_FORBIDDEN"),  # another user's
        (bob, BOB, {"presence": "busy"}, 400, "M_INVALID_PARAM"),
        (bob, BOB, {"presence": "online", "status_msg": "x" * 1001}, 400, "M_INVALID_PARAM"),
        (bob, BOB, {"presence": "online", "status_msg": "a\x00b"}, 400, "M_BAD_JSON"),  # the host refuses NUL
        (bob, BOB, {"status_msg": "no state"}, 400, "M_BAD_JSON"),
        (bob, BOB, {"presence": "online", "status_msg": 7}, 400, "M_BAD_JSON"),
        (bob, BOB, ["online"], 400, "M_BAD_JSON"),
        (bob, BOB, b"{not json", 400, "M_NOT_JSON"),
        (on_worker, BOB, {"presence": "online"}, 421, "M_MISDIRECTED"),  # main writes presence
    ]
    for http, user, body, status, errcode in cases:
        response = await put_status(http, user, body)
        assert response.status_code == status, (user, body, response.text)
        assert response.json()["errcode"] == errcode and response.json()["error"], response.text
    assert "main" in (await put_status(on_worker, BOB, {"presence": "online"})).json()["error"]
    for user in (CAROL, "@nobody:hs"):  # shares no room with bob / nobody knows
        response = await get_status(bob, user)
        assert response.status_code == 404 and response.json()["errcode"] == "M_NOT_FOUND", response.text
    assert await stored(main) == []
    # oneself and a room-mate: 200, offline before they ever had a presence (as the reference says)
    for user in (BOB, ALICE):
        response = await get_status(bob, user)
        assert response.status_code == 200 and response.json() == {"presence": "offline", "currently_active": False}
    response = await put_status(bob, BOB, {"presence": "online", "status_msg": "x" * 1000})
    assert response.status_code == 200 and response.json() == {}
    assert await stored(main) == [(BOB, "online", "x" * 1000, True)]
    got = (await get_status(client(ALICE), BOB)).json()
    assert got["presence"] == "online" and got["status_msg"] == "x" * 1000 and got["currently_active"] is True
    assert 0 <= got["last_active_ago"] < 5_000
    assert (await get_status(on_worker, BOB)).json()["presence"] == "online"  # any instance reads it


async def test_the_state_machine_with_the_writers_clock(main: Host) -> None:
    writer = main.api.state(PresenceWriter)
    writer.clock = clock = Clock()
    settings = writer.settings
    start = clock.now
    await writer.user_sync("main", BOB, True)
    assert await stored(main) == [(BOB, "online", None, True)]
    first = position(main)
    clock.now += 1_000
    await writer.user_sync("main", BOB, True)  # a second start: nothing visible changes, no row
    await writer.check()
    assert position(main) == first
    clock.now = start + ACTIVE_WINDOW_MS  # no activity for a minute: not currently active any more
    assert await writer.check() == 1
    assert await stored(main) == [(BOB, "online", None, False)]
    clock.now = start + settings.idle_timeout_ms - 1
    assert await writer.check() == 0
    clock.now += 1  # idle for idle_timeout_ms: unavailable, though still syncing
    assert await writer.check() == 1
    assert await stored(main) == [(BOB, "unavailable", None, False)]
    stopped = clock.now = clock.now + 5_000
    await writer.user_sync("main", BOB, False)
    assert await stored(main) == [(BOB, "unavailable", None, False)]
    clock.now = stopped + settings.sync_online_timeout_ms - 1
    assert await writer.check() == 0
    clock.now += 1  # syncing nowhere for sync_online_timeout_ms: offline
    assert await writer.check() == 1
    assert await stored(main) == [(BOB, "offline", None, False)]
    assert position(main) == first + 3  # one row per change: inactive, unavailable, offline
    clock.now += 1_000
    await writer.user_sync("worker1", BOB, True)  # syncing again (anywhere): online, active now
    assert await stored(main) == [(BOB, "online", None, True)]


async def test_a_row_only_when_the_state_the_message_or_activity_changes(main: Host, client: Clients) -> None:
    writer = main.api.state(PresenceWriter)
    writer.clock = clock = Clock()
    alice = client(ALICE)
    await writer.user_sync("main", ALICE, True)  # syncing: the sync timeout does not apply
    first = position(main)
    bodies = [
        ({"presence": "online"}, 0),  # online already, active already: nothing changes
        ({"presence": "online", "status_msg": "hi"}, 1),
        ({"presence": "online", "status_msg": "hi"}, 0),
        ({"presence": "unavailable", "status_msg": "hi"}, 1),
        ({"presence": "unavailable", "status_msg": None}, 1),
        ({"presence": "unavailable"}, 0),
        ({"presence": "online"}, 1),
    ]
    for body, rows in bodies:
        before = position(main)
        clock.now += 10
        assert (await put_status(alice, ALICE, body)).status_code == 200
        assert position(main) - before == rows, body
    assert position(main) == first + 4
    assert await stored(main) == [(ALICE, "online", None, True)]
    # PUT online is activity: a minute after the first row, alice is still currently active
    clock.now += ACTIVE_WINDOW_MS - 100
    assert (await put_status(alice, ALICE, {"presence": "online"})).status_code == 200
    clock.now += 200
    assert await writer.check() == 0


async def test_a_sync_makes_its_user_online_and_stopping_makes_them_offline(main: Host, client: Clients) -> None:
    await shared_room(main, ALICE, BOB)
    bob = client(BOB)
    since = (await sync(bob))["next_batch"]
    # bob's long poll is open while the reporter looks (every second): he is syncing here
    await sync(bob, since, timeout=1_500)
    assert (await get_status(client(ALICE), BOB)).json()["presence"] == "online"
    # after stop_syncing_delay_ms, then sync_online_timeout_ms, then a check: offline
    for _ in range(60):
        if (await get_status(client(ALICE), BOB)).json()["presence"] == "offline":
            break
        await asyncio.sleep(0.1)
    assert (await get_status(client(ALICE), BOB)).json()["presence"] == "offline"


async def test_a_writer_started_again_takes_its_users_offline_in_time(host_cluster: HostCluster, main: Host) -> None:
    await main.api.state(PresenceWriter).user_sync("worker1", CAROL, True)  # worker1 never comes back
    await main.stop()
    again = await host_cluster("main")
    assert await stored(again) == [(CAROL, "online", None, True)]
    for _ in range(40):  # sync_online_timeout_ms (1 s) since her last sync, then a check
        if await stored(again) == [(CAROL, "offline", None, False)]:
            break
        await asyncio.sleep(0.1)
    assert await stored(again) == [(CAROL, "offline", None, False)]
