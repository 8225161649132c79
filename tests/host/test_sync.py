"""``GET /sync``: long polls over every synced stream with one token (in-process hosts, real PostgreSQL)."""

from __future__ import annotations

import asyncio
import string

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from factstream.errors import ConfigError
from factstream.sync.service import check_sync_keys
from tests.host.conftest import post_messages
from tests.plugin_projects.inbox.factstream_inbox import InboxRow


def bodies(response) -> list[str]:
    return [item["body"] for item in response.json()["streams"].get("inbox", [])]


async def test_a_first_sync_returns_only_the_users_own_rows(inbox_cluster, client):
    host = await inbox_cluster()
    await post_messages(host, client, ("@alice:hs", "a1"), ("@bob:hs", "b1"), ("@alice:hs", "a2"))
    response = await client(host, "alice-token").get("/sync")
    assert response.status_code == 200
    items = response.json()["streams"]["inbox"]
    assert [i["body"] for i in items] == ["a1", "a2"]
    assert all(i["user_id"] == "@alice:hs" and i["instance"] == "main" for i in items)
    assert [i["stream_id"] for i in items] == sorted(i["stream_id"] for i in items)
    assert "limited" not in response.json()


async def test_another_users_rows_are_never_returned(inbox_cluster, client):
    host = await inbox_cluster()
    alice = client(host, "alice-token")
    first = await alice.get("/sync")
    since = first.json()["next_batch"]
    # Bob's rows move the token but never appear in Alice's responses, before or after her own.
    for round_ in range(3):
        await post_messages(host, client, ("@bob:hs", f"b{round_}"), ("@bob:hs", f"b{round_}'"))
        empty = await alice.get("/sync", params={"since": since, "timeout": 50})
        assert empty.json()["streams"] == {}
        since = empty.json()["next_batch"]
        await post_messages(host, client, ("@bob:hs", "x"), ("@alice:hs", f"a{round_}"))
        mine = await alice.get("/sync", params={"since": since, "timeout": 1000})
        assert bodies(mine) == [f"a{round_}"]
        since = mine.json()["next_batch"]
    everything = await alice.get("/sync")
    assert bodies(everything) == ["a0", "a1", "a2"]


@pytest.mark.serial  # asserts a time bound: run alone
async def test_a_long_poll_wakes_on_a_local_write_with_exactly_the_new_rows(inbox_cluster, client):
    host = await inbox_cluster()
    await post_messages(host, client, ("@alice:hs", "old"))
    alice = client(host, "alice-token")
    since = (await alice.get("/sync")).json()["next_batch"]
    poll = asyncio.ensure_future(alice.get("/sync", params={"since": since, "timeout": 20000}))
    await asyncio.sleep(0.2)
    assert not poll.done()
    loop = asyncio.get_running_loop()
    written = loop.time()
    await post_messages(host, client, ("@alice:hs", "new1"), ("@alice:hs", "new2"))
    response = await asyncio.wait_for(poll, 5)
    assert loop.time() - written < 1.0
    assert bodies(response) == ["new1", "new2"]
    # next_batch as since: nothing new until the next write.
    since = response.json()["next_batch"]
    again = await alice.get("/sync", params={"since": since, "timeout": 300})
    assert again.json() == {"next_batch": since, "streams": {}}
    await post_messages(host, client, ("@alice:hs", "new3"))
    assert bodies(await alice.get("/sync", params={"since": since, "timeout": 5000})) == ["new3"]


async def test_a_write_for_another_user_does_not_answer_the_poll(inbox_cluster, client):
    host = await inbox_cluster()
    alice = client(host, "alice-token")
    since = (await alice.get("/sync")).json()["next_batch"]
    poll = asyncio.ensure_future(alice.get("/sync", params={"since": since, "timeout": 1500}))
    await asyncio.sleep(0.2)
    await post_messages(host, client, ("@bob:hs", "not for alice"))
    await asyncio.sleep(0.3)
    assert not poll.done()
    response = await poll
    assert response.json()["streams"] == {}
    again = await client(host, "alice-token").get("/sync", params={"since": response.json()["next_batch"]})
    assert again.json()["streams"] == {}


@pytest.mark.serial  # asserts a time bound: run alone
async def test_timeout_zero_answers_at_once(inbox_cluster, client):
    host = await inbox_cluster()
    alice = client(host, "alice-token")
    since = (await alice.get("/sync")).json()["next_batch"]
    loop = asyncio.get_running_loop()
    started = loop.time()
    response = await alice.get("/sync", params={"since": since, "timeout": 0})
    assert loop.time() - started < 0.5
    assert response.json() == {"next_batch": since, "streams": {}}


@pytest.mark.parametrize("timeout", ["-1", "1.5", "abc", " 5", "٣"])
async def test_a_bad_timeout_is_400(inbox_cluster, client, timeout):
    host = await inbox_cluster()
    response = await client(host, "alice-token").get("/sync", params={"timeout": timeout})
    assert response.status_code == 400
    assert response.json()["errcode"] == "M_INVALID_PARAM"
    assert "timeout must be a whole number of milliseconds" in response.json()["error"]


async def test_a_huge_timeout_is_capped(inbox_cluster, client):
    host = await inbox_cluster(http={"sync_timeout_max_seconds": 0.3})
    alice = client(host, "alice-token")
    since = (await alice.get("/sync")).json()["next_batch"]
    loop = asyncio.get_running_loop()
    started = loop.time()
    response = await alice.get("/sync", params={"since": since, "timeout": 600000})
    assert response.status_code == 200
    assert loop.time() - started < 3


@pytest.mark.parametrize(
    ("since", "message"),
    [
        ("abc", "field 1 (inbox_key): expected an integer"),
        ("1_2_3_4_5_6_7_8_9", "this server knows only"),
        ("m5~x.6", "field 1 (inbox_key): the instance ID of writer 1 has a character other than digits"),
        ("9" * 30, "expected an integer of at most 19 digits"),
        ("m", "field 1 (inbox_key): the minimum stream position is empty"),
        ("", None),
    ],
)
async def test_a_malformed_token_is_400_with_a_message(inbox_cluster, client, since, message):
    host = await inbox_cluster()
    response = await client(host, "alice-token").get("/sync", params={"since": since})
    if message is None:  # an empty since is no since
        assert response.status_code == 200
        return
    assert response.status_code == 400
    assert response.json()["errcode"] == "M_INVALID_PARAM"
    error = response.json()["error"]
    assert error.startswith("invalid sync token: ")
    assert message in error


async def test_a_token_from_the_future_is_clamped_not_waited_for(inbox_cluster, client):
    host = await inbox_cluster(http={"catch_up_timeout_seconds": 5})
    ids = await post_messages(host, client, ("@alice:hs", "a"))
    alice = client(host, "alice-token")
    loop = asyncio.get_running_loop()
    started = loop.time()
    response = await alice.get("/sync", params={"since": "999999999", "timeout": 0})
    assert response.status_code == 200
    assert loop.time() - started < 2
    assert response.json()["next_batch"] == str(ids[-1])


async def test_fuzzed_tokens_are_never_a_500(inbox_cluster, client):
    host = await inbox_cluster()
    alice = client(host, "alice-token")
    alphabet = string.digits + "_m~.-st" + "x \u00e9\u0663"

    @settings(max_examples=150, deadline=None, suppress_health_check=list(HealthCheck), derandomize=True)
    @given(st.one_of(st.text(alphabet, max_size=40), st.text(max_size=20)))
    def fuzz(since: str) -> None:
        async def one() -> None:
            response = await alice.get("/sync", params={"since": since, "timeout": 0})
            assert response.status_code in (200, 400), (since, response.status_code, response.text)
            if response.status_code == 400:
                assert response.json()["errcode"] == "M_INVALID_PARAM"
                error = response.json()["error"]
                assert error.startswith(("invalid sync token", "query parameter 'since' contains")), error

        # hypothesis runs the test body synchronously; run each example on this test's loop.
        future = asyncio.run_coroutine_threadsafe(one(), loop)
        future.result(30)

    loop = asyncio.get_running_loop()
    await asyncio.to_thread(fuzz)


async def test_a_limited_response_pages_through_without_gaps_or_repeats(inbox_cluster, client):
    host = await inbox_cluster(http={"sync_limit": 3})
    await post_messages(host, client, *[("@alice:hs", f"m{i}") for i in range(8)], ("@bob:hs", "b"))
    alice = client(host, "alice-token")
    seen: list[str] = []
    since = None
    limited_flags = []
    for _ in range(5):
        params = {"since": since} if since else {}
        response = (await alice.get("/sync", params=params)).json()
        seen += [i["body"] for i in response["streams"].get("inbox", [])]
        limited_flags.append(response.get("limited", False))
        since = response["next_batch"]
        if not response.get("limited"):
            break
    assert seen == [f"m{i}" for i in range(8)]
    assert limited_flags == [True, True, False]


BROADCAST = """
    import msgspec
    import factstream
    from factstream import StreamSpec, StreamTable, Wake

    class Announcement(msgspec.Struct, frozen=True):
        room: str
        text: str

    seen_requests = []
    ROOMS = {"@alice:hs": ["!lobby"]}

    async def sync_rows(request):
        seen_requests.append(request)
        rooms = ROOMS.get(request.user, [])
        rows = await request.host.database().fetchall(
            "SELECT stream_id, instance_name, room, text FROM announcements WHERE room = ANY(%(rooms)s) "
            "AND stream_id > %(low)s AND stream_id <= %(high)s ORDER BY stream_id",
            {"rooms": rooms, "low": request.since.get("main", 0), "high": request.upto.get("main", 0)},
        )
        return [{"stream_id": s, "instance": i, "room": r, "text": t, "device": request.device} for s, i, r, t in rows]

    @factstream.hookimpl
    def register_streams(register):
        register(StreamSpec(
            name="broadcast", row_type=Announcement,
            tables=(StreamTable("announcements", "instance_name", "stream_id"),),
            sync_key="broadcast_key", sync_rows=sync_rows, wake=lambda row: Wake(rooms=(row.room,)),
        ))
"""


async def test_a_plugins_sync_rows_and_wake_decide_what_is_seen_and_who_wakes(
    plugin_installer, inbox_db, inbox_cluster, client
):
    import psycopg

    from factstream.db.engine import libpq_url

    with psycopg.connect(libpq_url(inbox_db), autocommit=True) as conn:
        conn.execute(
            "CREATE TABLE announcements (stream_id BIGINT UNIQUE NOT NULL, instance_name TEXT NOT NULL, "
            "room TEXT NOT NULL, text TEXT NOT NULL)"
        )
        conn.execute("CREATE SEQUENCE broadcast_seq")
        conn.execute("SELECT nextval('broadcast_seq')")
    plugin_installer.from_source("broadcast", BROADCAST)
    host = await inbox_cluster()
    assert [s.name for s in host.sync.synced] == ["inbox", "broadcast"]
    import factstream_broadcast

    # Who is in which room: the host's notifier, which the plugin API does not reach (a plugin's
    # startup hook gets the HostApi), is told by the test.
    for user, rooms in factstream_broadcast.ROOMS.items():
        host.sync.notifier.set_user_rooms(user, rooms)

    async def announce(room: str, text: str) -> None:  # through the stream's writer: it wakes the long polls
        writer = host.api.stream("broadcast", factstream_broadcast.Announcement)
        async with host.database().transaction() as txn:
            await writer.append(txn, factstream_broadcast.Announcement(room, text))

    alice, bob = client(host, "alice-token"), client(host, "bob-token")
    since_a = (await alice.get("/sync", params={"device": "phone"})).json()["next_batch"]
    since_b = (await bob.get("/sync")).json()["next_batch"]
    poll_a = asyncio.ensure_future(alice.get("/sync", params={"since": since_a, "timeout": 5000, "device": "phone"}))
    poll_b = asyncio.ensure_future(bob.get("/sync", params={"since": since_b, "timeout": 1000}))
    await asyncio.sleep(0.2)
    await announce("!lobby", "hello")
    response = (await asyncio.wait_for(poll_a, 3)).json()
    assert response["streams"] == {
        "broadcast": [{"stream_id": 2, "instance": "main", "room": "!lobby", "text": "hello", "device": "phone"}]
    }
    assert not poll_b.done()  # Bob is not in the room: not woken, and sees nothing
    assert (await poll_b).json()["streams"] == {}
    assert {r.device for r in factstream_broadcast.seen_requests if r.user == "@alice:hs"} == {"phone"}


def test_a_sync_key_on_a_stream_not_replicated_here_is_a_config_error():
    from factstream import StreamSpec, StreamTable

    spec = StreamSpec(
        name="inbox",
        row_type=InboxRow,
        tables=(StreamTable("inbox", "instance_name", "stream_id"),),
        sync_key="inbox_key",
    )
    with pytest.raises(ConfigError, match="sync key 'inbox_key' follows stream 'inbox', which is not replicated"):
        check_sync_keys([spec], {}, "worker1")
    check_sync_keys([spec], {"inbox": object()}, "worker1")


async def test_a_thousand_long_polls_one_write_wakes_only_its_user(inbox_cluster, client):
    host = await inbox_cluster()
    service = host.sync
    users = [f"@u{i}:hs" for i in range(1000)]
    since = (await client(host, "alice-token").get("/sync")).json()["next_batch"]
    polls = [asyncio.ensure_future(service.sync(user, since, 20.0, api=host.api)) for user in users]
    while service.notifier.open_waits < len(users):
        await asyncio.sleep(0.05)
    for _ in range(20):  # every request parked, none answered
        if sum(service.notifier.listening(u) for u in users) == len(users):
            break
        await asyncio.sleep(0.05)
    assert sum(service.notifier.listening(u) for u in users) == len(users)
    await post_messages(host, client, ("@u500:hs", "only you"))
    woken = await asyncio.wait_for(polls[500], 5)
    assert [i["body"] for i in woken["streams"]["inbox"]] == ["only you"]
    await asyncio.sleep(0.3)
    assert [i for i, p in enumerate(polls) if p.done()] == [500]
    assert service.notifier.open_waits == len(users) - 1
    service.notifier.close()
    rest = await asyncio.gather(*polls[:500], *polls[501:])
    assert all(r["streams"] == {} for r in rest)
